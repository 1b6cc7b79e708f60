// `tandem generate`: greedy decoding of one prompt on the CPU reference model, outside the
// scheduler. For checking the model against an independent implementation (tools/hf-check).
#pragma once
#include <string>
#include <vector>

namespace tandem {
int generate_command(const std::vector<std::string>& args);
}
