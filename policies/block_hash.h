// A KV block's identity for prefix caching: a 128-bit hash of the block's tokens chained with
// its parent block's hash (h_i = H(h_{i-1}, tokens of block i)), so that equal hashes mean
// equal prefixes, not just equal blocks. Computed outside policies/ (the scheduler never sees
// token ids): the engine hashes prompts with XXH3-128, whose collision probability at 2^-128
// per pair is why a hit is not confirmed by comparing token ids.
#pragma once
#include <cstdint>

namespace tandem {

struct BlockHash {
  uint64_t lo = 0, hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// A block no other request can have: its token ids come from the request's own stream (or
// follow such a block in the chain), so no prefix lookup will ever name it. The engine passes
// this instead of hashing it; the pool caches the block like any published one (LRU tail,
// evicted in order: scheduling is exactly as if it had a unique hash) but keeps it out of the
// hash index, which a replay without sharing would otherwise fill and drain once per block.
inline constexpr BlockHash kPrivateBlock{0, 0};

}  // namespace tandem
