// The in-process KV channels of stage 4: the sim channel's price (whole blocks, one FCFS link,
// layer-wise overlap charged to the link) and the copy channel (bytes from one KV store to the
// other, sizes checked).
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "backend/transfer/channels.h"

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

KvTransfer at(Time now, int32_t tokens, Duration last_step = 0) {
  KvTransfer t;
  t.num_tokens = tokens;
  t.now = now;
  t.last_prefill_step = last_step;
  return t;
}

// A KV store in memory: block b holds bytes [b * block_bytes, (b + 1) * block_bytes).
struct MemKv final : kv_store_i {
  int64_t bytes_per_block;
  std::vector<std::byte> data;
  MemKv(int32_t blocks, int64_t bb) : bytes_per_block(bb), data(size_t(blocks * bb)) {}
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
  CHECK(ch.abort(1));                   // modelled: nothing can write later
}

TEST_CASE("sim channel: transfers that overlap queue on the one link, FCFS") {
  SimChannel ch(model());
  CHECK(ch.start(at(0, 16)).elapsed == 16'000 + 10'000);
  // Starts at 0 too: waits for the first to leave the wire (16 us), then its own 16 us.
  CHECK(ch.start(at(0, 16)).elapsed == 32'000 + 10'000);
  // Starts at 100 us: the link is free again.
  CHECK(ch.start(at(100'000, 16)).elapsed == 16'000 + 10'000);
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
  MemKv p(8, 4), d(8, 4);
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
  MemKv other(8, 6);
  CHECK_THROWS_AS(CopyChannel(p, other), std::invalid_argument);
}
