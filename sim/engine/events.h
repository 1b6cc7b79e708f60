// Events and the event queue. Ordering key: integer time, then the sequence number the
// event was posted with, so simultaneous events are handled in a deterministic order.
#pragma once
#include <cstdint>
#include <queue>
#include <variant>
#include <vector>

#include <string>

#include "backend/transfer/channel.h"
#include "core/request.h"
#include "core/time.h"
#include "policies/plan.h"

namespace tandem {

struct Arrival {
  ReqId id;
};
struct StepDone {
  int32_t instance;
};  // the instance whose in-flight step ended
struct Cancel {
  ReqId id;
};
// A KV channel ended a transfer (stage 4). Carries the ticket, not the request: a completion
// that arrives after its request ended is recognised as stale.
struct TransferDone {
  uint64_t ticket;
  bool ok;
  Duration elapsed = 0;                       // as the channel measured it (0: the engine's clock says)
  TransferFault fault = TransferFault::None;  // why, when !ok
};
// An asynchronous executor (a decode worker in another process) finished the instance's step.
struct StepFinished {
  int32_t instance;
  StepResult result;
};
// The peer behind an asynchronous executor or channel is gone (connection closed, corrupt
// frame, no answer in time), or a step failed on an executor thread: the run ends, its requests
// in flight failing with `fail` (decode_worker_lost, or backend_error).
struct PeerLost {
  std::string reason;
  FailReason fail = FailReason::PeerLost;
};
// A request from a client of `tandem serve` (an open run, Engine::open_arrivals): its slot in the
// request table, handed out by the front end, and its lengths; it arrives when the loop takes it in.
struct Submit {
  ReqId id;
  int32_t prompt_len, max_output;
};
// An open run takes no more arrivals: it ends once every request that came in has left.
struct Close {};
using Event = std::variant<Arrival, StepDone, Cancel, TransferDone, StepFinished, PeerLost, Submit, Close>;

struct TimedEvent {
  Time time;
  uint64_t seq;
  Event event;
};

class EventQueue {
 public:
  void post(Time t, Event e) { heap_.push(TimedEvent{t, next_seq_++, e}); }
  bool empty() const { return heap_.empty(); }
  const TimedEvent& top() const { return heap_.top(); }
  TimedEvent pop() {
    TimedEvent e = heap_.top();
    heap_.pop();
    return e;
  }

 private:
  struct Later {
    bool operator()(const TimedEvent& a, const TimedEvent& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  std::priority_queue<TimedEvent, std::vector<TimedEvent>, Later> heap_;
  uint64_t next_seq_ = 0;
};

}  // namespace tandem
