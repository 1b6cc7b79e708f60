// Prefill/decode separation over TCP: the decode instance runs in another process, a `tandem
// worker`, started here as a child (loopback) or reached at disaggregation.channel.peer. This
// process keeps both schedulers; the worker holds the decode instance's model and KV cache.
// One connection carries, in order: the decode steps (Step, answered by StepReply) and the
// prompt KV of each request (KvPush from the prefill instance's blocks, answered by KvAck).
// The worker handles frames one at a time in arrival order, so a transfer's blocks are written
// before any later step reads them; the scheduler gives D's blocks to a request only after its
// KvAck, so nothing reads a block that is still being written.
//
// Answers come back on the link's reader thread and are posted into the engine's inbox: a
// StepFinished, a TransferDone (ticket), or a PeerLost (the connection closed, a corrupt or
// unexpected frame, an error the worker reported). The engine's deadlines cover a silent peer.
// The parts: RemoteExecutor (steps out), TcpChannel (KV out, acks judged), WorkerChild (a
// worker started here), the worker itself in sim/worker_server.h.
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/executor.h"
#include "backend/transfer/channel.h"
#include "backend/transfer/tcp_link.h"
#include "sim/workload/config.h"
#include "sim/engine/inbox.h"
#include "sim/remote/remote_executor.h"
#include "sim/remote/tcp_channel.h"
#include "sim/remote/worker_child.h"

namespace tandem {

class DecodeWorkerLink {
 public:
  // Connects to the worker (starting one if w's channel names no peer), proves the shared
  // secret if one is configured, and sends it the decode instance's workload; the worker
  // answers once its model is built and warmed up. `prefill_kv`: where the KV is read from.
  DecodeWorkerLink(const Workload& w, const InstanceSpec& decode, const std::string& backend, int threads,
                   kv_store_i* prefill_kv);
  ~DecodeWorkerLink();
  DecodeWorkerLink(const DecodeWorkerLink&) = delete;
  DecodeWorkerLink& operator=(const DecodeWorkerLink&) = delete;

  executor_i& executor();
  kv_channel_i& channel();
  // From here the worker's answers go into `inbox`, until detach().
  void attach(Inbox& inbox);
  // Stops posting into the inbox (before the engine that owns it goes away), says goodbye and
  // ends the child. A worker that does not go within min(timeout_ms, 1 s) of the goodbye (a
  // stopped or hung one) is killed: it never holds the end of the run. Idempotent.
  void detach();
  std::string peer() const { return peer_; }

 private:
  void on_frame(transfer::Frame&& f);
  void on_close(const std::string& reason);
  void post(Event e);  // into the inbox, if attached (thread-safe)
  // Pings the worker every idle / 4 until detach(), so that an idle run keeps its worker (whose
  // idle timeout drops a client that says nothing: a stopped one).
  void start_heartbeat(std::chrono::milliseconds idle);

  std::unique_ptr<transfer::TcpLink> link_;
  std::unique_ptr<RemoteExecutor> executor_;
  std::unique_ptr<TcpChannel> channel_;
  std::string peer_;
  std::unique_ptr<WorkerChild> child_;  // a worker this run started (no peer given)
  std::mutex mu_;
  Inbox* inbox_ = nullptr;  // under mu_
  bool closing_ = false;    // under mu_: our own close, not a lost peer
  std::condition_variable heartbeat_cv_;  // with mu_: wakes the heartbeat at detach()
  std::thread heartbeat_;
  int32_t decode_instance_ = 1;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem
