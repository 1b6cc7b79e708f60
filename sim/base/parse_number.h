// Whole-string number parsing: the text must be a finite number and nothing else.
#pragma once
#include <cmath>
#include <string>

namespace tandem {
inline bool parse_double(const std::string& s, double& out) {
  size_t used = 0;
  try {
    out = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return !s.empty() && used == s.size() && std::isfinite(out);
}
}  // namespace tandem
