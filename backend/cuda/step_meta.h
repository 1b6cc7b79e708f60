// A step's metadata for the CUDA kernels, built on the host: token ids, positions, KV-cache
// slots, attention tiles, block tables, the rows to sample. Plain C++ (no CUDA header), and
// built in every configuration, so that the unit suite checks it in CI without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "policies/plan.h"

namespace tandem::cuda {

// One attention work item: up to tile_tokens consecutive query tokens of one sequence.
// n == 0 marks padding (graph replays with fewer sequences than captured).
struct AttentionTile {
  int32_t seq;     // row of the block table
  int32_t token0;  // index of the first query token in the step
  int32_t n;       // query tokens in this tile
  int32_t pos0;    // absolute position of the first query token
};

// Where each part lives in the int32 metadata buffer, for capacities (tokens, sequences).
struct StepMetaLayout {
  size_t tokens = 0, positions = 0, slots = 0, tiles = 0, tables = 0, samples = 0, total = 0;
  StepMetaLayout() = default;
  StepMetaLayout(int64_t max_tokens, int64_t max_seqs, int64_t table_width);
};

struct StepMetaShape {
  int32_t block_size = 16, table_width = 0, tile_tokens = 1, num_blocks = 0, vocab = 0, max_model_len = 0;
};

struct StepMetaCounts {
  int64_t rows = 0, n_tiles = 0, num_samples = 0;  // rows: tokens including padding
};

// Writes the step into `meta` (laid out by `layout`). With pad_to > 0 (a decode graph
// replay) the step is padded to pad_to rows: padding rows read token 0 at position 0, write
// no KV (slot -1), get an empty tile (n = 0) and a sample row of their own. Throws
// std::logic_error for a plan the buffers or the cache cannot hold (a scheduler bug), and
// std::runtime_error for a token id outside the vocabulary.
StepMetaCounts build_step_meta(const StepPlan& plan, std::span<const Token> tokens, const StepMetaShape& shape,
                               const StepMetaLayout& layout, int32_t pad_to, int32_t* meta);

}  // namespace tandem::cuda
