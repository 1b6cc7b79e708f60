// `tandem serve WORKLOAD.yaml`: the workload's model, hardware, engine and disaggregation served
// over HTTP (serve/frontend.h) to clients of the OpenAI API; see README, "tandem serve".
#pragma once
#include <string>
#include <vector>

namespace tandem::serve {

int serve_command(const std::vector<std::string>& args);

}  // namespace tandem::serve
