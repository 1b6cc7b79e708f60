// Events and the event queue. Ordering key: integer time, then the sequence number the
// event was posted with, so simultaneous events are handled in a deterministic order.
#pragma once
#include <cstdint>
#include <queue>
#include <variant>
#include <vector>

#include "core/request.h"
#include "core/time.h"

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
using Event = std::variant<Arrival, StepDone, Cancel>;

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
