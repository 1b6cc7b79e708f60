// Shared by the fuzz targets (tests/fuzz/meson.build, option -Dfuzz=true, clang only).
// Contract of every target: bad input may throw tandem::InputError (the CLI's exit 2), which is
// the expected outcome. Anything else is a finding: another exception (it escapes the target,
// std::terminate aborts and libFuzzer reports it with the stack of the throw), a crash, a
// sanitizer report, a hang (-timeout) or a huge allocation (-malloc_limit_mb).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <vector>

#include "core/error.h"
#include "sim/workload/config.h"

namespace tandem_fuzz {

// One scratch folder per process, removed at exit: the readers that take a path read the
// input from a file written here.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    // In memory where possible: every execution writes its input there.
    const char* env = std::getenv("TMPDIR");
    const std::string base = env && *env ? env : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/tandem-fuzz-XXXXXX";
    if (!mkdtemp(templ.data())) {
      std::perror("tandem fuzz: mkdtemp");
      std::abort();
    }
    static const std::string kept = templ;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(kept, ec);
    });
    return templ;
  }();
  return dir;
}

inline std::string scratch_path(const std::string& name) { return scratch_dir() + "/" + name; }

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) {
    std::fprintf(stderr, "tandem fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

inline void write_file(const std::string& path, const std::string& text) { write_file(path, text.data(), text.size()); }

// The workload targets' overrides: every line "#set KEY=VALUE" of the input (a YAML comment,
// so the text stays a workload), in order, as `tandem run --set KEY=VALUE` would pass it.
inline std::vector<tandem::Override> set_lines(const std::string& text) {
  std::vector<tandem::Override> overrides;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    if (line.rfind("#set ", 0) == 0) {
      const std::string kv = line.substr(5);
      const size_t eq = kv.find('=');
      overrides.push_back(eq == std::string::npos ? tandem::Override{kv, ""}
                                                  : tandem::Override{kv.substr(0, eq), kv.substr(eq + 1)});
    }
    pos = eol + 1;
  }
  return overrides;
}

}  // namespace tandem_fuzz

// Runs `body`; InputError is the expected answer to bad input, anything else propagates.
#define TANDEM_FUZZ_EXPECT_INPUT_ERROR(body) \
  try {                                      \
    body;                                    \
  } catch (const tandem::InputError&) {}
