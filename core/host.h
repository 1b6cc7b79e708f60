// Facts about the machine this process runs on.
#pragma once
#include <unistd.h>

#include <cstdio>

namespace tandem {

// Physical memory, in bytes (what the CPU backend's weights and KV store must fit in).
inline double physical_memory_bytes() { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)); }

// Memory this process holds now (its resident set), in bytes; 0 where Linux's /proc is absent.
inline double resident_memory_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long size = 0, resident = 0;
  const bool ok = std::fscanf(f, "%ld %ld", &size, &resident) == 2;
  std::fclose(f);
  return ok ? double(resident) * double(sysconf(_SC_PAGE_SIZE)) : 0;
}

}  // namespace tandem
