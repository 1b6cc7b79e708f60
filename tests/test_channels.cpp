// The in-process KV channels of stage 4: the sim channel's price (whole blocks, one FCFS link,
// layer-wise overlap charged to the link, an abort freeing the link at once) and the copy
// channel (bytes from one KV store to the other, sizes checked).
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "backend/transfer/channels.h"
#include "core/error.h"

using namespace tandem;

namespace {

ChannelModel model(bool layerwise = false) {
  // 1 GB/s, 10 us, 4 layers, 1,000 bytes per token, blocks of 16: a block is 16 us on the wire.
  return {.bandwidth_bytes_per_s = 1e9,
          .latency_s = 10e-6,
          .layerwise = layerwise,
          .layers = 4,
          .bytes_per_token = 1000,
          .block_size = 16};
}

KvTransfer at(Time now, int32_t tokens, Duration last_step = 0, uint64_t ticket = 0) {
  KvTransfer t;
  t.ticket = ticket;
  t.num_tokens = tokens;
  t.now = now;
  t.last_prefill_step = last_step;
  return t;
}

// A layout of one layer, one slot, one KV head of head_dim fp8 values: blocks of 2 * head_dim bytes.
KvLayout bytes_layout(int32_t head_dim, int32_t kv_heads = 1, int32_t tp = 1) {
  return {.model = "m", .weights = "w", .dtype = "fp8", .block_size = 1, .layers = 1, .kv_heads = kv_heads,
          .head_dim = head_dim, .tp = tp};
}

// A KV store in memory: block b holds bytes [b * block_bytes, (b + 1) * block_bytes).
struct MemKv final : kv_store_i {
  KvLayout layout;
  int64_t bytes_per_block;
  std::vector<std::byte> data;
  MemKv(int32_t blocks, const KvLayout& l)
      : layout(l), bytes_per_block(l.block_bytes()), data(size_t(blocks * bytes_per_block)) {}
  KvLayout kv_layout() const override { return layout; }
  int64_t block_bytes() const override { return bytes_per_block; }
  int32_t num_blocks() const override { return int32_t(data.size() / size_t(bytes_per_block)); }
  void read_blocks(std::span<const int32_t> blocks, std::span<std::byte> out) override {
    for (size_t i = 0; i < blocks.size(); ++i)
      std::memcpy(out.data() + i * size_t(bytes_per_block), data.data() + size_t(blocks[i] * bytes_per_block),
                  size_t(bytes_per_block));
  }
  void write_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in) override {
    for (size_t i = 0; i < blocks.size(); ++i)
      std::memcpy(data.data() + size_t(blocks[i] * bytes_per_block), in.data() + i * size_t(bytes_per_block),
                  size_t(bytes_per_block));
  }
};

}  // namespace

TEST_CASE("sim channel: whole blocks move; latency + bytes / bandwidth on an idle link") {
  SimChannel ch(model());
  const TransferStart s = ch.start(at(0, 17));  // 17 tokens: 2 blocks, 32,000 bytes
  CHECK_FALSE(s.async);
  CHECK(s.ok);
  CHECK(s.bytes == 32'000);
  CHECK(s.elapsed == 32'000 + 10'000);  // 32 us on the wire + 10 us
  CHECK(ch.abort(1, 0));                // modelled: nothing can write later
}

TEST_CASE("sim channel: transfers that overlap queue on the one link, FCFS") {
  SimChannel ch(model());
  CHECK(ch.start(at(0, 16)).elapsed == 16'000 + 10'000);
  // Starts at 0 too: waits for the first to leave the wire (16 us), then its own 16 us.
  CHECK(ch.start(at(0, 16)).elapsed == 32'000 + 10'000);
  // Starts at 100 us: the link is free again.
  CHECK(ch.start(at(100'000, 16)).elapsed == 16'000 + 10'000);
}

TEST_CASE("sim channel: an abort frees the link at once; one off the wire changes nothing") {
  SimChannel ch(model());
  // 4 blocks: on the wire 0-64 us; aborted at 20 us. The next, at 30 us, goes on the wire at
  // once (16 us), not at 64 us, when the aborted one would have left.
  CHECK(ch.start(at(0, 64, 0, 1)).elapsed == 64'000 + 10'000);
  CHECK(ch.abort(1, 20'000));
  CHECK(ch.start(at(30'000, 16, 0, 2)).elapsed == 16'000 + 10'000);  // on the wire 30-46 us
  // Ticket 2 left the wire at 46 us: aborting it in its latency (at 50 us) frees nothing, so a
  // transfer at 40 us, queued behind it (46-62 us), still holds the link for one at 50 us.
  CHECK(ch.start(at(40'000, 16, 0, 3)).elapsed == 22'000 + 10'000);
  CHECK(ch.abort(2, 50'000));
  CHECK(ch.start(at(50'000, 16, 0, 4)).elapsed == 28'000 + 10'000);  // 62-78 us
  // One still waiting for the link when aborted gives up its whole slot: the next starts where
  // the slot before it ends. Ticket 5 was booked 78-142 us; aborted at 70 us, before it began.
  CHECK(ch.start(at(60'000, 64, 0, 5)).elapsed == 82'000 + 10'000);
  CHECK(ch.abort(5, 70'000));
  CHECK(ch.start(at(70'000, 16, 0, 6)).elapsed == 24'000 + 10'000);  // 78-94 us
  // Aborted with a slot booked behind it: that slot keeps the time it was given, so the link
  // frees only at its end. 7: 200-264 us, 8: 264-280 us; 7 aborted at 210 us; 9 at 220 us waits
  // for 8 (280-296 us). Then 9 and 8 are aborted at 230 us, before they began: the link is free
  // at once.
  CHECK(ch.start(at(200'000, 64, 0, 7)).elapsed == 64'000 + 10'000);
  CHECK(ch.start(at(200'000, 16, 0, 8)).elapsed == 80'000 + 10'000);
  CHECK(ch.abort(7, 210'000));
  CHECK(ch.start(at(220'000, 16, 0, 9)).elapsed == 76'000 + 10'000);
  CHECK(ch.abort(9, 230'000));
  CHECK(ch.abort(8, 230'000));  // nothing is booked behind 8 any more
  CHECK(ch.start(at(230'000, 16, 0, 10)).elapsed == 16'000 + 10'000);
  CHECK(ch.abort(42, 240'000));  // an unknown (or long finished) ticket: nothing to free
}

TEST_CASE("sim channel: layer-wise, up to (layers - 1) / layers of the last prefill step is hidden, and charged") {
  SimChannel ch(model(true));
  // 4 blocks: 64 us on the wire. The last step took 40 us: the transfer could start 30 us
  // before it ended; the last layer's share (16 us) leaves after it.
  const Time now = 1'000'000;
  CHECK(ch.start(at(now, 64, 40'000)).elapsed == 64'000 - 30'000 + 10'000);
  // The next one, at the same instant, waits for the link: it was charged the whole 64 us.
  CHECK(ch.start(at(now, 16, 40'000)).elapsed == 34'000 + 16'000 + 10'000);
  // A long step hides all but the last layer's share.
  SimChannel idle(model(true));
  CHECK(idle.start(at(now, 64, 1'000'000)).elapsed == 16'000 + 10'000);
  // No step just ended (a transfer after a wait for a seat): nothing is hidden.
  SimChannel late(model(true));
  CHECK(late.start(at(now, 64, 0)).elapsed == 64'000 + 10'000);
}

TEST_CASE("copy channel: the blocks' bytes land in the destination blocks; sizes must agree") {
  MemKv p(8, bytes_layout(2)), d(8, bytes_layout(2));
  for (size_t i = 0; i < p.data.size(); ++i) p.data[i] = std::byte(i + 1);
  CopyChannel ch(p, d);
  const std::vector<int32_t> src{5, 2}, dst{0, 7};
  KvTransfer t = at(0, 20);
  t.src_blocks = src;
  t.dst_blocks = dst;
  const TransferStart s = ch.start(t);
  CHECK(s.ok);
  CHECK(s.bytes == 8);
  CHECK(std::memcmp(d.data.data() + 0, p.data.data() + 20, 4) == 0);  // block 5 -> 0
  CHECK(std::memcmp(d.data.data() + 28, p.data.data() + 8, 4) == 0);  // block 2 -> 7
  CHECK(d.data[4] == std::byte(0));                                    // untouched blocks stay
  const std::vector<int32_t> one{1};
  t.dst_blocks = one;
  CHECK_FALSE(ch.start(t).ok);  // 2 source blocks for 1 destination block
  CHECK_FALSE(ch.relayouts());
  MemKv other(8, bytes_layout(3));
  CHECK_THROWS_WITH_AS(CopyChannel(p, other),
                       doctest::Contains("copy channel: the KV blocks differ in head size (prefill: m, weights w, fp8"),
                       InputError);
}

TEST_CASE("copy channel: the layouts are compared before any block moves; a TP difference is re-laid out") {
  // 4 KV heads of 2 values, one layer, one slot: a block is K then V per rank. Prefill at TP 2,
  // decode at TP 1: the decode block reads K(h0..h3) V(h0..h3) where the prefill block holds
  // rank 0's K(h0 h1) V(h0 h1), then rank 1's K(h2 h3) V(h2 h3).
  MemKv p(2, bytes_layout(2, 4, 2)), d(2, bytes_layout(2, 4, 1));
  for (size_t i = 0; i < p.data.size(); ++i) p.data[i] = std::byte(i);
  CopyChannel ch(p, d);
  CHECK(ch.relayouts());
  const std::vector<int32_t> src{1}, dst{0};
  KvTransfer t = at(0, 1);
  t.src_blocks = src;
  t.dst_blocks = dst;
  CHECK(ch.start(t).ok);
  // Prefill block 1 (bytes 16..31): rank 0 K h0 h1 = 16-19, V h0 h1 = 20-23; rank 1 K h2 h3 = 24-27, V = 28-31.
  const std::vector<int> want{16, 17, 18, 19, 24, 25, 26, 27, 20, 21, 22, 23, 28, 29, 30, 31};
  for (size_t i = 0; i < want.size(); ++i) CHECK_MESSAGE(int(d.data[i]) == want[i], "byte ", i);
  // Each field that tells what the KV is, changed alone, is refused naming it.
  const auto refused = [&](KvLayout l, const char* what) {
    MemKv q(2, l);
    const std::string want = std::string("differ in ") + what;
    CHECK_THROWS_WITH_AS(CopyChannel(p, q), doctest::Contains(want.c_str()), InputError);
  };
  KvLayout l = bytes_layout(2, 4, 1);
  l.model = "other";
  refused(l, "model");
  l = bytes_layout(2, 4, 1);
  l.weights = "other";
  refused(l, "weights");
  l = bytes_layout(2, 4, 1);
  l.dtype = "bf16";  // twice the bytes, but the dtype is what is named
  refused(l, "dtype");
  l = bytes_layout(2, 4, 1);
  l.order = "block>layer>rank";
  refused(l, "block order");
  refused(bytes_layout(2, 2, 1), "KV heads");
}

TEST_CASE("sim channel priced by a measured table: interpolated in bytes, no separate latency, the link held") {
  // 1 block (16,000 bytes) 10 us, 2 blocks 12 us, 4 blocks 40 us: no latency + bandwidth line
  // goes through these (the cache bends it).
  ChannelModel m = model();
  m.table = {{16'000, 10e-6}, {32'000, 12e-6}, {64'000, 40e-6}};
  CHECK(table_seconds(m.table, 16'000) == doctest::Approx(10e-6));
  CHECK(table_seconds(m.table, 48'000) == doctest::Approx(26e-6));  // halfway between 12 and 40
  CHECK(table_seconds(m.table, 8'000) == doctest::Approx(5e-6));    // below the first point: its rate
  CHECK(table_seconds(m.table, 96'000) == doctest::Approx(68e-6));  // past the last: the last segment's rate
  SimChannel ch(m);
  CHECK(ch.start(at(0, 48)).elapsed == 26'000);           // 3 blocks; no latency added
  CHECK(ch.start(at(0, 16)).elapsed == 26'000 + 10'000);  // queued behind it on the link
  CHECK(m.latency() == 0);
}
