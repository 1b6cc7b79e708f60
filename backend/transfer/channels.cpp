#include "backend/transfer/channels.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <stdexcept>

#include "core/error.h"

namespace tandem {

int64_t ChannelModel::bytes(int32_t num_tokens) const {
  const int64_t blocks = (int64_t{num_tokens} + block_size - 1) / block_size;
  return int64_t(std::llround(double(blocks) * block_size * bytes_per_token));
}

double table_seconds(std::span<const ChannelPoint> table, double bytes) {
  if (table.empty()) return 0;
  if (table.size() == 1 || bytes <= table.front().bytes)  // below the first point: at its rate
    return table.front().seconds * bytes / table.front().bytes;
  auto hi =
      std::lower_bound(table.begin(), table.end(), bytes, [](const ChannelPoint& p, double b) { return p.bytes < b; });
  if (hi == table.end()) hi = std::prev(table.end());  // past the last point: the last segment's rate
  const ChannelPoint& a = *std::prev(hi);
  const ChannelPoint& b = *hi;
  const double rate = (b.seconds - a.seconds) / (b.bytes - a.bytes);
  return std::max(0.0, a.seconds + (bytes - a.bytes) * rate);
}

Duration ChannelModel::wire_time(int32_t num_tokens) const {
  if (!table.empty()) return from_seconds(table_seconds(table, double(bytes(num_tokens))));
  return from_seconds(double(bytes(num_tokens)) / bandwidth_bytes_per_s);
}

// FCFS on one link: a transfer goes on the wire when the link is free. Layer-wise, layer i's KV
// could leave as soon as layer i of the prompt's last step was computed, so the transfer may
// have been on the wire since (layers - 1) / layers of that step ago, if the link was free
// then; its last layer's share leaves after the step. The link is charged for the whole wire
// time either way, so the transfers after it wait for what it really used.
TransferStart SimChannel::start(const KvTransfer& t) {
  const Duration wire = m_.wire_time(t.num_tokens);
  Time earliest = t.now;
  if (m_.layerwise && t.last_prefill_step > 0)
    earliest = t.now - t.last_prefill_step * (m_.layers - 1) / std::max(m_.layers, 1);
  const Time on_wire = std::max(earliest, link_free_);
  const Time off_wire = std::max(on_wire + wire, m_.layerwise ? t.now + wire / std::max(m_.layers, 1) : t.now);
  link_free_ = off_wire;
  // Slots end in link order: the ones that ended by now can no longer be cut by an abort.
  while (!bookings_.empty() && bookings_.front().off_wire <= t.now) bookings_.pop_front();
  bookings_.push_back({t.ticket, on_wire, off_wire});
  return {.async = false,
          .ok = true,
          .elapsed = off_wire - t.now + m_.latency(),
          .bytes = m_.bytes(t.num_tokens),
          .error = {}};
}

// An abort at `now` gives up what the transfer's slot had left. When it was the last slot, the
// next transfer goes on the wire at once (or when the slot before it ends, if it was still
// waiting for the link); slots booked behind it keep their times, which the engine was already
// given, so the rest of the aborted slot then stays idle. A transfer off the wire changes nothing.
bool SimChannel::abort(uint64_t ticket, Time now) {
  const auto it =
      std::find_if(bookings_.begin(), bookings_.end(), [&](const Booking& b) { return b.ticket == ticket; });
  if (it == bookings_.end() || it->off_wire <= now) return true;
  if (std::next(it) == bookings_.end())
    link_free_ = it == bookings_.begin() ? now : std::max(now, std::prev(it)->off_wire);
  bookings_.erase(it);
  return true;
}

CopyChannel::CopyChannel(kv_store_i& from, kv_store_i& to)
    : from_(from), to_(to), from_layout_(from.kv_layout()), to_layout_(to.kv_layout()) {
  const KvLayoutCheck c = check_kv_layouts(from_layout_, to_layout_);
  if (c.match == KvLayoutMatch::Incompatible) throw InputError("copy channel: " + c.why);
  relayout_ = c.match == KvLayoutMatch::Relayout;
  // The descriptors promise the sizes; the stores must keep that promise.
  if (from.block_bytes() != from_layout_.block_bytes() || to.block_bytes() != to_layout_.block_bytes())
    throw std::logic_error(fmt::format("copy channel: blocks of {} and {} bytes, their layouts say {} and {}",
                                       from.block_bytes(), to.block_bytes(), from_layout_.block_bytes(),
                                       to_layout_.block_bytes()));
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
  if (relayout_) {
    if (relaid_.size() < bytes) relaid_.resize(bytes);
    const std::span<std::byte> out(relaid_.data(), bytes);
    relayout_kv_blocks(from_layout_, to_layout_, buf, out);
    to_.write_blocks(t.dst_blocks, out);
  } else {
    to_.write_blocks(t.dst_blocks, buf);
  }
  r.bytes = int64_t(bytes);
  r.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tandem
