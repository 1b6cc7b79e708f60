#include "backend/transfer/channels.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

namespace tandem {

int64_t ChannelModel::bytes(int32_t num_tokens) const {
  const int64_t blocks = (int64_t{num_tokens} + block_size - 1) / block_size;
  return int64_t(std::llround(double(blocks) * block_size * bytes_per_token));
}

Duration ChannelModel::wire_time(int32_t num_tokens, Duration last_prefill_step) const {
  const double wire = double(bytes(num_tokens)) / bandwidth_bytes_per_s;
  double after_step = wire;
  if (layerwise) {
    // Every layer but the last leaves while the last prefill step still computes later layers:
    // what remains after the step is the last layer's share, or the wire time the step could
    // not hide, whichever is longer.
    after_step = std::max(wire / std::max(layers, 1), wire - to_seconds(last_prefill_step));
  }
  return from_seconds(after_step);
}

TransferStart SimChannel::start(const KvTransfer& t) {
  const Time on_wire = std::max(t.now, link_free_);
  link_free_ = on_wire + m_.wire_time(t.num_tokens, t.last_prefill_step);
  return {.async = false,
          .ok = true,
          .elapsed = link_free_ - t.now + m_.latency(),
          .bytes = m_.bytes(t.num_tokens),
          .error = {}};
}

CopyChannel::CopyChannel(kv_store_i& from, kv_store_i& to) : from_(from), to_(to) {
  if (from.block_bytes() != to.block_bytes())
    throw std::invalid_argument(fmt::format(
        "copy channel: the instances' KV blocks differ in size ({} vs {} bytes): prefill and decode need the same "
        "model, block size and tensor parallelism",
        from.block_bytes(), to.block_bytes()));
}

TransferStart CopyChannel::start(const KvTransfer& t) {
  TransferStart r;
  const auto t0 = std::chrono::steady_clock::now();
  if (t.src_blocks.size() != t.dst_blocks.size()) {
    r.ok = false;
    r.error = fmt::format("copy channel: {} source blocks for {} destination blocks", t.src_blocks.size(), t.dst_blocks.size());
    return r;
  }
  const size_t bytes = t.src_blocks.size() * size_t(from_.block_bytes());
  if (staging_.size() < bytes) staging_.resize(bytes);
  const std::span<std::byte> buf(staging_.data(), bytes);
  from_.read_blocks(t.src_blocks, buf);
  to_.write_blocks(t.dst_blocks, buf);
  r.bytes = int64_t(bytes);
  r.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tandem
