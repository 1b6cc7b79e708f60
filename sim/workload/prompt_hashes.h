// Prefix caching's block hashes, made where the prompts come from: the engine hashes a
// request's prompt on arrival and hands the chain to the scheduler (which never sees token ids).
//   h_0 = XXH3-128(root || block 0),  h_i = XXH3-128(h_{i-1} || block i)
// over full blocks only (a partial last block is never shared). A block enters the hash as its
// description from the token source (PromptTokens::describe: which source key and offsets
// decide its ids), not as 16 token ids: equal descriptions mean equal ids, and hashing a few
// words instead of every prompt token keeps a trace replay fast. This is how the Mooncake
// trace's own sharing is replayed: its hash_ids are such keys (one per 512 tokens), and equal
// hash_id prefixes give equal 16-token block chains. The root names what else changes the KV:
// the model, its weights and vocabulary, so two models never share a block.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "policies/block_hash.h"
#include "sim/workload/config.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

BlockHash root_block_hash(const Workload& w);

// Gives nothing for a prompt shorter than one block. Linear in the number of blocks. Blocks from
// the first one holding the request's own ids on are kPrivateBlock (see policies/block_hash.h).
void hash_prompt_blocks(const Request& r, const PromptTokens& tokens, int32_t block_size, const BlockHash& root,
                        std::vector<BlockHash>& out);

// Prompts given as token ids (`tandem serve`'s clients): the same chain over the ids themselves,
// h_i = XXH3-128(h_{i-1} || ids of block i); no block is private (any client may send it again).
void hash_token_blocks(std::span<const Token> prompt, int32_t block_size, const BlockHash& root,
                       std::vector<BlockHash>& out);

}  // namespace tandem
