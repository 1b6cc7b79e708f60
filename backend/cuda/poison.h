#pragma once
#include <cstddef>

namespace tandem::cuda {
// Writes quiet NaNs over n floats of device memory (on the current device).
void poison(float* device_buffer, size_t n);
}  // namespace tandem::cuda
