#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <unistd.h>

#ifndef TANDEM_SOURCE_DIR
#error "tests need TANDEM_SOURCE_DIR"
#endif

namespace tandem::testing {
// A file of the source tree. The tree's path is baked in at build time, but a build carried to
// another machine (tools/device-check) finds it elsewhere: TANDEM_SOURCE_DIR in the environment
// wins, else the baked-in path if the file is there, else the path relative to the working
// directory (device-check runs from the repository root).
inline std::string source_path(const std::string& rel) {
  if (const char* env = std::getenv("TANDEM_SOURCE_DIR"); env && *env) return std::string(env) + "/" + rel;
  const std::string baked = std::string(TANDEM_SOURCE_DIR) + "/" + rel;
  std::error_code ec;
  if (std::filesystem::exists(baked, ec) || !std::filesystem::exists(rel, ec)) return baked;
  return rel;
}
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// A file name to parse a workload text as: its relative paths resolve against the source
// tree's workloads/ folder (no such file exists; only its folder matters).
inline std::string as_if_in_workloads_dir() { return source_path("workloads/test.yaml"); }
// A fresh folder under the system temp dir (named by `tag`, the process and a counter), removed
// on scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "tandem_test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::string str() const { return path.string(); }
};
}  // namespace tandem::testing
