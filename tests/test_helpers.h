#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#ifndef TANDEM_SOURCE_DIR
#error "tests need TANDEM_SOURCE_DIR"
#endif

namespace tandem::testing {
inline std::string source_path(const std::string& rel) { return std::string(TANDEM_SOURCE_DIR) + "/" + rel; }
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// A workload whose relative paths resolve against the source tree's workloads/ folder.
inline std::string workload_path() { return source_path("workloads/test.yaml"); }
}  // namespace tandem::testing
