#include "sim/remote/tcp_channel.h"

#include <fmt/format.h>

#include <iostream>

namespace tandem {

using namespace transfer;

TransferStart TcpChannel::start(const KvTransfer& t) {
  KvPushMsg m;
  m.ticket = t.ticket;
  m.request = t.request;
  m.num_tokens = t.num_tokens;
  m.dst_blocks.assign(t.dst_blocks.begin(), t.dst_blocks.end());
  m.payload.resize(t.src_blocks.size() * size_t(from_.block_bytes()));
  from_.read_blocks(t.src_blocks, {reinterpret_cast<std::byte*>(m.payload.data()), m.payload.size()});
  m.block_checksums = block_checksums(m.payload, from_.block_bytes());
  {
    std::lock_guard lock(mu_);
    sent_[t.ticket] =
        Sent{std::chrono::steady_clock::now(), int32_t(t.src_blocks.size()), blocks_digest(m.block_checksums)};
  }
  try {
    link_.send(m);
  } catch (const std::exception& e) {  // the worker is gone: the run ends (its answer will never come)
    post_(PeerLost{fmt::format("the decode worker at {}: sending transfer {} failed: {}", peer_,
                                     t.ticket, e.what())});
  }
  return {.async = true, .ok = true, .elapsed = 0, .bytes = int64_t(m.payload.size()), .error = {}};
}

TransferDone TcpChannel::judge(const KvAckMsg& a) {
  std::lock_guard lock(mu_);
  const auto it = sent_.find(a.ticket);
  if (it == sent_.end()) return {a.ticket, false, 0, TransferFault::Error};  // not ours: stale for the engine
  const Sent s = it->second;
  sent_.erase(it);
  const Duration d =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - s.at).count();
  TransferDone done{a.ticket, false, d, TransferFault::Error};
  std::string why = a.error;
  if (a.status == KvAckStatus::Corrupt) {
    done.fault = TransferFault::Corrupt;
  } else if (a.status == KvAckStatus::Written && a.blocks_written != s.blocks) {
    done.fault = TransferFault::Partial;
    why = fmt::format("{} of {} blocks written", a.blocks_written, s.blocks);
  } else if (a.status == KvAckStatus::Written && a.digest != s.digest) {
    done.fault = TransferFault::Corrupt;
    why = "the blocks the worker read back differ from the ones sent (digest mismatch)";
  } else if (a.status == KvAckStatus::Written) {
    done.ok = true;
    done.fault = TransferFault::None;
  }
  if (!done.ok)
    std::cerr << fmt::format("tandem: transfer {} to the decode worker at {} failed ({}): {}\n", a.ticket,
                             peer_,
                             done.fault == TransferFault::Corrupt   ? "corrupt"
                             : done.fault == TransferFault::Partial ? "partial"
                                                                    : "error",
                             why);
  return done;
}

}  // namespace tandem
