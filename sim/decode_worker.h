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
#pragma once
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/executor.h"
#include "backend/transfer/channel.h"
#include "backend/transfer/tcp_link.h"
#include "sim/config.h"
#include "sim/inbox.h"

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
  class RemoteExecutor;
  class TcpChannel;
  void on_frame(transfer::Frame&& f);
  void on_close(const std::string& reason);
  void post(Event e);  // into the inbox, if attached (thread-safe)
  void start_child(const std::string& backend, int threads, const std::string& checkpoint);
  // Pings the worker every idle / 4 until detach(), so that an idle run keeps its worker (whose
  // idle timeout drops a client that says nothing: a stopped one).
  void start_heartbeat(std::chrono::milliseconds idle);

  std::unique_ptr<transfer::TcpLink> link_;
  std::unique_ptr<RemoteExecutor> executor_;
  std::unique_ptr<TcpChannel> channel_;
  std::string peer_;
  pid_t child_ = -1;
  uint16_t child_port_ = 0;
  std::mutex mu_;
  Inbox* inbox_ = nullptr;  // under mu_
  bool closing_ = false;    // under mu_: our own close, not a lost peer
  std::condition_variable heartbeat_cv_;  // with mu_: wakes the heartbeat at detach()
  std::thread heartbeat_;
  int32_t decode_instance_ = 1;
  std::chrono::milliseconds timeout_;
};

// TEST ONLY: faults a worker injects into the KV pushes it receives (`tandem worker
// --inject-transfer-faults SPEC`, or $TANDEM_WORKER_INJECT for the worker a run starts), as
// SGLang's DISAGGREGATION_TEST_FAILURE_PROB does. SPEC is comma-separated KEY=VALUE:
//   fail, corrupt, partial   a probability per push (drawn from `seed`), or @N[:N...]: those pushes
//                            (counted from 1 per connection). fail: answered Failed, nothing
//                            written; corrupt: a byte flipped after the frame's check; partial: half
//                            the blocks written, and the count says so
//   delay_ack_ms, delay_step_ms   hold every KvAck / every step this long (orderings for tests)
struct FaultInjection {
  double fail = 0, corrupt = 0, partial = 0;
  std::set<int64_t> fail_at, corrupt_at, partial_at;
  uint64_t seed = 0;
  int64_t delay_ack_ms = 0, delay_step_ms = 0;
  bool any() const;
};
FaultInjection parse_fault_injection(const std::string& spec);  // InputError naming the bad item
std::string describe(const FaultInjection& f);

// The decode instance a Hello asks for, as the worker builds it. Only the Hello's name, seed,
// model and engine are taken (any other key is refused unread); hardware and requests are
// placeholders (a worker neither prices steps nor makes requests). A model.checkpoint must
// resolve, symlinks and ".." followed, to `checkpoint_root` or below (a relative one from the
// root); none: no checkpoint is served. Every path outside gets one message, whether or not it
// exists, and nothing of it is opened: a client that did not authenticate (loopback without a
// secret) learns nothing of the worker's files.
Workload decode_instance_workload(const std::string& hello_yaml, const std::string& from,
                                  const std::optional<std::filesystem::path>& checkpoint_root);

// `tandem worker`: serves decode instances over TCP (see above). `cuda`: the CUDA backend's
// factory in a CUDA build (sim/main.cpp), as for make_executor.
int worker_command(const std::vector<std::string>& args, const std::function<std::unique_ptr<executor_i>(Workload&)>* cuda);

}  // namespace tandem
