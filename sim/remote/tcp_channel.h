// The tcp channel (disaggregation.channel.kind: tcp), on the prefill side: reads the prompt's
// blocks from the prefill instance's KV store and pushes them to the decode worker with a
// checksum per block; the worker's KvAck, judged here, ends the ticket. Its abort is never
// synchronous: the push may already be on the wire, and only the worker's answer says it was
// written (or not). The worker's side is sim/worker/worker_server.cpp; the connection DecodeWorkerLink.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "backend/executor.h"
#include "backend/transfer/channel.h"
#include "backend/transfer/tcp_link.h"
#include "backend/transfer/wire.h"
#include "sim/engine/events.h"

namespace tandem {

class TcpChannel final : public kv_channel_i {
 public:
  // `post`: into the engine's inbox (thread-safe); `peer`: HOST:PORT, for messages.
  TcpChannel(transfer::TcpLink& link, kv_store_i& from, std::string peer, std::function<void(Event)> post)
      : link_(link), from_(from), peer_(std::move(peer)), post_(std::move(post)) {}
  std::string name() const override { return "tcp"; }
  TransferStart start(const KvTransfer& t) override;
  bool abort(uint64_t, Time) override { return false; }
  // The worker's answer, judged here, not taken on its word: the transfer delivered only if the
  // worker wrote every block and what it read back has the digest of what was sent. A short
  // count is a partial transfer, another digest a corrupt one; either fails this transfer alone.
  TransferDone judge(const transfer::KvAckMsg& a);

 private:
  struct Sent {
    std::chrono::steady_clock::time_point at;
    int32_t blocks = 0;
    uint64_t digest = 0;  // blocks_digest of the checksums sent
  };
  transfer::TcpLink& link_;
  kv_store_i& from_;
  std::string peer_;
  std::function<void(Event)> post_;
  std::mutex mu_;
  std::map<uint64_t, Sent> sent_;
};

}  // namespace tandem
