#include "sim/workload/prompt_hashes.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace tandem {

namespace {
BlockHash from_xxh(const XXH128_hash_t& h) { return {h.low64, h.high64}; }
}  // namespace

BlockHash root_block_hash(const Workload& w) {
  const ModelSpec& m = w.model;
  // Dummy weights come from the workload's seed; a checkpoint is named by its path.
  const std::string id = fmt::format("tandem-kv|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", m.name, m.layers, m.hidden, m.heads,
                                     m.kv_heads, m.vocab, m.dtype, m.rope_theta,
                                     m.checkpoint.empty() ? "seed" : m.checkpoint, m.checkpoint.empty() ? w.seed : 0);
  return from_xxh(XXH3_128bits(id.data(), id.size()));
}

void hash_prompt_blocks(const Request& r, const PromptTokens& tokens, int32_t block_size, const BlockHash& root,
                        std::vector<BlockHash>& out) {
  out.clear();
  const int32_t full = r.prompt_len / block_size;
  out.reserve(static_cast<size_t>(full));
  // One buffer per block: the parent's 16 bytes, then the block's description (what decides
  // its token ids; usually one run, two where a shared prefix ends inside the block).
  thread_local std::vector<PromptTokens::Run> runs;
  thread_local std::vector<uint64_t> buf;
  BlockHash parent = root;
  for (int32_t b = 0; b < full; ++b) {
    tokens.describe(r, b * block_size, block_size, runs);
    // From the first block with ids of the request's own stream on, no other request can
    // share the chain: private, not hashed (kPrivateBlock).
    if (std::any_of(runs.begin(), runs.end(), [](const PromptTokens::Run& x) { return x.own; })) {
      out.resize(static_cast<size_t>(full), kPrivateBlock);
      return;
    }
    buf.assign({parent.lo, parent.hi});
    for (const auto& run : runs)
      buf.insert(buf.end(), {run.key, uint64_t(uint32_t(run.first)) << 32 | uint32_t(run.length)});
    parent = from_xxh(XXH3_128bits(buf.data(), buf.size() * sizeof(uint64_t)));
    out.push_back(parent);
  }
}

void hash_token_blocks(std::span<const Token> prompt, int32_t block_size, const BlockHash& root,
                       std::vector<BlockHash>& out) {
  out.clear();
  const size_t full = prompt.size() / size_t(block_size);
  out.reserve(full);
  std::vector<uint64_t> buf(2 + (size_t(block_size) + 1) / 2);
  BlockHash parent = root;
  for (size_t b = 0; b < full; ++b) {
    buf[0] = parent.lo;
    buf[1] = parent.hi;
    std::memcpy(buf.data() + 2, prompt.data() + b * size_t(block_size), size_t(block_size) * sizeof(Token));
    parent = from_xxh(XXH3_128bits(buf.data(), 2 * sizeof(uint64_t) + size_t(block_size) * sizeof(Token)));
    out.push_back(parent);
  }
}

}  // namespace tandem
