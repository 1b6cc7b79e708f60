// The CUDA devices this process can use. No CUDA header leaves backend/cuda: callers see
// plain C++.
#pragma once
#include <string>

namespace tandem::cuda {
// Number of usable devices; 0 when there is none or no driver (never throws).
int device_count();
// "NVIDIA H200, sm_90, 139.8 GiB" for device i.
std::string device_description(int i);
}  // namespace tandem::cuda
