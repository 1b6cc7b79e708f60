#include "backend/cuda/step_meta.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tandem::cuda {

StepMetaLayout::StepMetaLayout(int64_t max_tokens, int64_t max_seqs, int64_t table_width) {
  positions = size_t(max_tokens);
  slots = 2 * size_t(max_tokens);
  tiles = 3 * size_t(max_tokens);
  tables = tiles + 4 * size_t(max_tokens);  // a tile has at least one token
  samples = tables + size_t(max_seqs * table_width);
  total = samples + size_t(max_seqs);
}

StepMetaCounts build_step_meta(const StepPlan& plan, std::span<const Token> tokens, const StepMetaShape& sh,
                               const StepMetaLayout& L, int32_t pad_to, int32_t* meta) {
  auto* tiles = reinterpret_cast<AttentionTile*>(meta + L.tiles);
  StepMetaCounts c;
  int64_t& t = c.rows;
  const int64_t max_tokens = int64_t(L.positions), max_seqs = int64_t(L.total - L.samples);
  if (int64_t(plan.seqs.size()) > max_seqs || std::max<int64_t>(plan.num_tokens, pad_to) > max_tokens ||
      pad_to > max_seqs)
    throw std::logic_error("build_step_meta: the step exceeds the metadata buffer");
  int64_t sum = 0;
  for (const ScheduledSeq& seq : plan.seqs) {
    if (seq.num_tokens < 1) throw std::logic_error("build_step_meta: a sequence with no tokens in the step");
    sum += seq.num_tokens;
  }
  if (sum != plan.num_tokens || int64_t(tokens.size()) != sum)
    throw std::logic_error("build_step_meta: token counts of the plan disagree");
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const ScheduledSeq& seq = plan.seqs[s];
    if (int64_t(seq.block_table.size()) > sh.table_width)
      throw std::logic_error("build_step_meta: block table longer than max_model_len allows");
    std::fill_n(std::copy(seq.block_table.begin(), seq.block_table.end(), meta + L.tables + s * size_t(sh.table_width)),
                sh.table_width - int64_t(seq.block_table.size()), 0);
    for (int32_t i = 0; i < seq.num_tokens; ++i, ++t) {
      const int32_t pos = seq.num_computed_before + i;
      if (pos >= sh.max_model_len) throw std::logic_error("build_step_meta: position past max_model_len");
      if (pos / sh.block_size >= int32_t(seq.block_table.size()))
        throw std::logic_error(
            fmt::format("build_step_meta: position {} has no block (block table of {})", pos, seq.block_table.size()));
      const int32_t block = seq.block_table[size_t(pos / sh.block_size)];
      if (block < 0 || block >= sh.num_blocks)
        throw std::logic_error(
            fmt::format("build_step_meta: block id {} outside the cache ({} blocks)", block, sh.num_blocks));
      const Token id = tokens[size_t(t)];
      if (id < 0 || id >= sh.vocab)
        throw std::runtime_error(fmt::format("token id {} outside the vocabulary ({})", id, sh.vocab));
      meta[L.tokens + size_t(t)] = id;
      meta[L.positions + size_t(t)] = pos;
      meta[L.slots + size_t(t)] = block * sh.block_size + pos % sh.block_size;
    }
    for (int32_t i0 = 0; i0 < seq.num_tokens; i0 += sh.tile_tokens)
      tiles[c.n_tiles++] = AttentionTile{int32_t(s), int32_t(t - seq.num_tokens + i0),
                                         std::min(sh.tile_tokens, seq.num_tokens - i0), seq.num_computed_before + i0};
    if (seq.samples) meta[L.samples + size_t(c.num_samples++)] = int32_t(t - 1);
  }
  for (; t < pad_to; ++t, ++c.n_tiles, ++c.num_samples) {
    meta[L.tokens + size_t(t)] = 0;
    meta[L.positions + size_t(t)] = 0;
    meta[L.slots + size_t(t)] = -1;
    tiles[c.n_tiles] = AttentionTile{0, int32_t(t), 0, 0};  // n = 0: the kernels return before reading anything
    meta[L.samples + size_t(c.num_samples)] = int32_t(t);
  }
  return c;
}

}  // namespace tandem::cuda
