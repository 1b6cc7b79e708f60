// Facts about the machine this process runs on.
#pragma once
#include <unistd.h>

namespace tandem {

// Physical memory, in bytes (what the CPU backend's weights and KV store must fit in).
inline double physical_memory_bytes() { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)); }

}  // namespace tandem
