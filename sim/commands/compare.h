// `tandem compare A B`: two runs' summary.json side by side with relative differences.
#pragma once
#include <ostream>
#include <string>

namespace tandem {
// Returns the process exit status (2 if a run folder or its summary.json is unusable).
int compare_runs(const std::string& dir_a, const std::string& dir_b, std::ostream& os);
}  // namespace tandem
