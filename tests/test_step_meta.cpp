// The CUDA step's host-side metadata (backend/cuda/step_meta.h): what the kernels index by.
// Plain C++, so it is checked here without a GPU: rows, KV slots, attention tiles, block
// tables, sample rows, graph padding, and the errors for plans the buffers cannot hold.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "backend/cuda/step_meta.h"
#include "core/rng.h"

using namespace tandem;
using namespace tandem::cuda;

namespace {

struct Built {
  StepMetaLayout layout;
  std::vector<int32_t> meta;
  StepMetaCounts counts;
  const AttentionTile* tiles() const { return reinterpret_cast<const AttentionTile*>(&meta[layout.tiles]); }
  int32_t at(size_t part, int64_t i) const { return meta[part + size_t(i)]; }
};

Built build(const StepPlan& plan, const StepMetaShape& shape, int32_t pad_to = 0, int64_t cap_tokens = 256,
            int64_t cap_seqs = 16) {
  Built b{StepMetaLayout(cap_tokens, cap_seqs, shape.table_width), {}, {}};
  b.meta.assign(b.layout.total, -7);  // stale values must not survive where the step writes
  b.counts = build_step_meta(plan, plan.tokens, shape, b.layout, pad_to, b.meta.data());
  return b;
}

StepMetaShape shape16() { return StepMetaShape{16, 8, 16, 64, 1000, 128}; }

void add(StepPlan& p, const std::vector<int32_t>& table, int32_t n, int32_t before, bool samples, Token first_token) {
  p.add({ReqId(p.seqs.size()), n, before, samples, table}, implied_prompt_len(before, n));
  for (int32_t i = 0; i < n; ++i) p.tokens.push_back(first_token + i);
}

}  // namespace

TEST_CASE("step metadata: rows, slots, tiles, tables and sample rows of a mixed step") {
  const std::vector<int32_t> ta{5, 9, 2}, tb{7, 8, 11}, tc{3, 4, 6};
  StepPlan p;
  add(p, ta, 1, 37, true, 100);    // a decode at position 37: block ta[2] = 2, slot 5
  add(p, tb, 40, 0, true, 200);    // a whole 40-token prompt
  add(p, tc, 20, 16, false, 300);  // a chunk at 16..35 that does not sample yet
  const Built b = build(p, shape16());
  CHECK(b.counts.rows == 61);
  CHECK(b.counts.n_tiles == 1 + 3 + 2);
  CHECK(b.counts.num_samples == 2);
  // Row 0: the decode.
  CHECK(b.at(b.layout.tokens, 0) == 100);
  CHECK(b.at(b.layout.positions, 0) == 37);
  CHECK(b.at(b.layout.slots, 0) == 2 * 16 + 5);
  // Rows 1..40: the prompt; row 1 + 17 is position 17, in block tb[1] = 8.
  CHECK(b.at(b.layout.tokens, 18) == 217);
  CHECK(b.at(b.layout.positions, 18) == 17);
  CHECK(b.at(b.layout.slots, 18) == 8 * 16 + 1);
  // Rows 41..60: the chunk; its last row is position 35, block tc[2] = 6, slot 3.
  CHECK(b.at(b.layout.positions, 60) == 35);
  CHECK(b.at(b.layout.slots, 60) == 6 * 16 + 3);
  // Tiles: (seq, first row, tokens, first position).
  const AttentionTile* t = b.tiles();
  const std::vector<std::vector<int32_t>> want = {{0, 0, 1, 37},  {1, 1, 16, 0},   {1, 17, 16, 16},
                                                  {1, 33, 8, 32}, {2, 41, 16, 16}, {2, 57, 4, 32}};
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(std::vector<int32_t>{t[i].seq, t[i].token0, t[i].n, t[i].pos0} == want[i]);
  }
  // Block tables: each sequence's row, zeros after its blocks.
  CHECK(b.at(b.layout.tables, 8 + 1) == 8);
  CHECK(b.at(b.layout.tables, 8 + 3) == 0);
  CHECK(b.at(b.layout.tables, 16 + 0) == 3);
  // Sample rows: the last row of each sampling sequence, in plan order.
  CHECK(b.at(b.layout.samples, 0) == 0);
  CHECK(b.at(b.layout.samples, 1) == 40);
}

TEST_CASE("step metadata: a decode step padded for a graph bucket") {
  const std::vector<int32_t> t0{1, 2, 3}, t1{4}, t2{5, 6};
  StepPlan p;
  add(p, t0, 1, 40, true, 10);
  add(p, t1, 1, 3, true, 11);
  add(p, t2, 1, 20, true, 12);
  const Built b = build(p, shape16(), 4);
  CHECK(b.counts.rows == 4);
  CHECK(b.counts.n_tiles == 4);
  CHECK(b.counts.num_samples == 4);
  CHECK(b.at(b.layout.slots, 2) == 6 * 16 + 4);
  // The padding row: token 0 at position 0, no KV write, an empty tile, its own sample row.
  CHECK(b.at(b.layout.tokens, 3) == 0);
  CHECK(b.at(b.layout.positions, 3) == 0);
  CHECK(b.at(b.layout.slots, 3) == -1);
  CHECK(b.tiles()[3].n == 0);
  CHECK(b.at(b.layout.samples, 3) == 3);
  for (int i = 0; i < 3; ++i) CHECK(b.tiles()[i].n == 1);
}

TEST_CASE("step metadata: plans the buffers or the cache cannot hold are errors") {
  const std::vector<int32_t> one_block{2}, bad_block{64};
  StepPlan p;
  add(p, one_block, 17, 0, true, 1);  // position 16 has no block
  CHECK_THROWS_AS(build(p, shape16()), std::logic_error);
  StepPlan q;
  add(q, bad_block, 1, 0, true, 1);  // block 64 of a 64-block cache
  CHECK_THROWS_AS(build(q, shape16()), std::logic_error);
  StepPlan r;
  add(r, one_block, 1, 0, true, 1000);  // token id == vocab
  CHECK_THROWS_AS(build(r, shape16()), std::runtime_error);
  StepPlan big;
  const std::vector<int32_t> wide{0, 1, 2, 3, 4, 5, 6, 7};
  add(big, wide, 100, 0, true, 1);
  CHECK_THROWS_AS(build(big, shape16(), 0, 64), std::logic_error);  // 100 rows in a 64-row buffer
  StepPlan lying = r;
  lying.tokens[0] = 5;
  lying.num_tokens = 2;  // says 2 tokens, carries 1
  CHECK_THROWS_AS(build(lying, shape16()), std::logic_error);
}

TEST_CASE("step metadata: random steps keep every row's slot, position and tile consistent") {
  Rng rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t tile_tokens = int32_t(rng.uniform_int(1, 16));
    const StepMetaShape shape{16, 32, tile_tokens, 4096, 50000, 512};
    StepPlan p;
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(rng.uniform_int(1, 8)));
    for (auto& table : tables) {
      const int32_t before = int32_t(rng.uniform_int(0, 300)), n = int32_t(rng.uniform_int(1, 60));
      for (int32_t blk = 0; blk * 16 < before + n; ++blk) table.push_back(int32_t(rng.uniform_int(0, 4095)));
      add(p, table, n, before, rng.uniform() < 0.7, Token(rng.uniform_int(0, 40000)));
    }
    const Built b = build(p, shape, 0, 1024, 16);
    int64_t row = 0, tiles_seen = 0, samples_seen = 0;
    for (size_t s = 0; s < p.seqs.size(); ++s) {
      const ScheduledSeq& q = p.seqs[s];
      for (int32_t i = 0; i < q.num_tokens; ++i, ++row) {
        const int32_t pos = q.num_computed_before + i;
        REQUIRE(b.at(b.layout.positions, row) == pos);
        REQUIRE(b.at(b.layout.slots, row) == q.block_table[size_t(pos / 16)] * 16 + pos % 16);
        REQUIRE(b.at(b.layout.tokens, row) == p.tokens[size_t(row)]);
      }
      // Tiles of this sequence cover its rows once, in order, each at most tile_tokens.
      int64_t covered = 0;
      while (covered < q.num_tokens) {
        const AttentionTile& t = b.tiles()[tiles_seen++];
        REQUIRE(t.seq == int32_t(s));
        REQUIRE(t.n >= 1);
        REQUIRE(t.n <= tile_tokens);
        REQUIRE(t.token0 == row - q.num_tokens + covered);
        REQUIRE(t.pos0 == q.num_computed_before + covered);
        covered += t.n;
      }
      REQUIRE(covered == q.num_tokens);
      if (q.samples) REQUIRE(b.at(b.layout.samples, samples_seen++) == int32_t(row - 1));
    }
    REQUIRE(b.counts.rows == row);
    REQUIRE(b.counts.n_tiles == tiles_seen);
    REQUIRE(b.counts.num_samples == samples_seen);
  }
}
