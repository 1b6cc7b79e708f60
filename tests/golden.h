// The golden test's machinery: run one workload on a real backend under several
// configurations and compare every request's output tokens with a baseline.
#pragma once
#include <string>
#include <vector>

#include "sim/workload/config.h"

namespace tandem::testing {

struct GoldenRun {
  std::string label;
  std::vector<Override> overrides;
};

// Output token ids per request; throws if a request did not finish.
std::vector<std::vector<Token>> golden_outputs(const std::string& workload, const std::vector<Override>& overrides);
// Empty if identical, else a message naming the first diverging request and position.
std::string first_divergence(const std::vector<std::vector<Token>>& base, const std::vector<std::vector<Token>>& other);

}  // namespace tandem::testing
