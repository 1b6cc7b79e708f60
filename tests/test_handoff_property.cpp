// Stage 4's handoff under random load. Two tests drive a prefill and a decode scheduler and the
// Handoff between them with a small discrete-event loop written here (arrivals, steps of random
// length, a KV channel with random latency, cancels), routing cancels through Handoff::cancel_anywhere, as the
// disaggregated topology (sim/engine/topology_disaggregated.cpp) does:
//
//   property      random 1P1D workloads on tiny pools, with the channel's faults injected (drop,
//                 delay, timeout, corrupt, duplicate and stale completions) and cancels in every
//                 phase, synchronous and deferred aborts. After every event: no pool over its
//                 capacity, tickets and receiving seats agree with the phases; at the end every
//                 request ended with a reason, nothing leaked, and every fault and cancel phase
//                 happened (counted, so the test cannot pass vacuously).
//   differential  the same loop, no faults, against a naive two-instance reference written below,
//                 compared after every event: plans, transfers started, statuses, finish times.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "policies/handoff.h"
#include "tests/policies_helpers.h"

using namespace tandem;

namespace {

// Draws from a seeded mt19937_64, written out: the standard distributions differ between
// standard libraries, and a failing seed must replay anywhere.
struct Draw {
  std::mt19937_64 g;
  explicit Draw(uint64_t seed) : g(seed) {}
  int64_t in(int64_t lo, int64_t hi) { return lo + int64_t(g() % uint64_t(hi - lo + 1)); }
  bool chance(double p) { return double(g() >> 11) * 0x1.0p-53 < p; }
};

// ---- the test's event loop ----

enum class EvKind : uint8_t { Arrival, Cancel, StepDone, TransferDone };
// What a TransferDone is, as the channel played here sent it.
enum class Note : uint8_t { Normal, Late, Duplicate, AbortNotice, Timeout };

struct Event {
  Time t = 0;
  uint64_t seq = 0;
  EvKind kind = EvKind::Arrival;
  int32_t who = 0;  // request id, or instance (0: P, 1: D) for StepDone
  uint64_t ticket = 0;
  bool ok = true;
  Note note = Note::Normal;
};

class EventQueue {
 public:
  void post(Time t, EvKind kind, int32_t who, uint64_t ticket = 0, bool ok = true, Note note = Note::Normal) {
    q_.push(Event{t, seq_++, kind, who, ticket, ok, note});
  }
  bool empty() const { return q_.empty(); }
  Event pop() {
    Event e = q_.top();
    q_.pop();
    return e;
  }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.t != b.t ? a.t > b.t : a.seq > b.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, Later> q_;
  uint64_t seq_ = 0;
};

// ---- workloads ----

struct Shape {
  int32_t block_size = 1, p_blocks = 1, d_blocks = 1;
  int32_t p_budget = 1, d_budget = 1, p_seqs = 1, d_seqs = 1, partials = 1;
  bool chunked = false, caching = false;
};

struct Workload {
  Shape shape;
  std::vector<Request> reqs;                   // arrival and cancel_at set
  std::vector<std::vector<BlockHash>> hashes;  // by request: its prompt's full blocks (caching on)
};

SchedulerConfig config_of(const Shape& s, InstanceRole role) {
  const bool p = role == InstanceRole::Prefill;
  SchedulerConfig c = testing::Cfg(BatchingPolicy::Continuous, p ? s.p_seqs : s.d_seqs, p ? s.p_budget : s.d_budget)
                          .chunked(s.chunked)
                          .partials(s.partials)
                          .caching(p && s.caching);
  c.role = role;
  return c;
}

std::string describe(const Shape& s, size_t n) {
  return fmt::format(
      "block_size={} P: {} blocks, budget {}, seqs {}, chunked={} partials={} caching={}; D: {} blocks, budget {}, "
      "seqs {}; {} requests",
      s.block_size, s.p_blocks, s.p_budget, s.p_seqs, s.chunked, s.partials, s.caching, s.d_blocks, s.d_budget,
      s.d_seqs, n);
}

// Requests arriving over time; some cancelled (a few before they arrive); a few that cannot be
// served (empty, over P's budget, over either pool). Prompts in a shared-prefix group share
// their leading blocks' hashes; the rest of a prompt is private, as the engine hashes it.
Workload random_workload(Draw& g, bool pd_faults) {
  Workload w;
  Shape& s = w.shape;
  s.block_size = int32_t(g.in(1, 8));
  s.p_blocks = std::max<int32_t>(1, int32_t(g.in(16, 200)) / s.block_size);
  s.d_blocks = std::max<int32_t>(1, int32_t(g.in(16, 240)) / s.block_size);
  s.chunked = pd_faults && g.chance(0.5);
  s.caching = pd_faults && g.chance(0.6);
  s.partials = pd_faults ? int32_t(g.in(1, 3)) : 1;
  s.p_budget = int32_t(s.chunked ? g.in(2, 40) : g.in(16, 80));
  s.d_budget = int32_t(g.in(1, 12));
  s.p_seqs = int32_t(g.in(1, 6));
  s.d_seqs = int32_t(g.in(1, 6));
  const int n = int(g.in(1, 40));
  const int num_groups = int(g.in(1, 3));
  std::vector<int32_t> group_len;
  for (int k = 0; k < num_groups; ++k) group_len.push_back(int32_t(g.in(0, 40)));
  Time t = 0;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    t += g.in(0, 400);
    r.arrival = t;
    r.prompt_len = int32_t(g.chance(0.02) ? 0 : g.in(1, 48));
    r.max_output = int32_t(g.chance(0.02) ? 0 : g.chance(0.1) ? 1 : g.in(1, 24));
    if (g.chance(0.04) && r.arrival > 0)
      r.cancel_at = r.arrival - g.in(1, r.arrival);  // before it arrives
    else if (g.chance(pd_faults ? 0.3 : 0.25))
      r.cancel_at = r.arrival + g.in(0, 6000);
    std::vector<BlockHash> h;
    const int group = g.chance(0.7) ? int(g.in(0, num_groups - 1)) : -1;
    for (int32_t b = 0; b < r.prompt_len / s.block_size; ++b) {
      const bool shared = group >= 0 && (b + 1) * s.block_size <= group_len[size_t(group)];
      h.push_back(shared ? testing::H(uint64_t(1000 * (group + 1) + b)) : kPrivateBlock);
    }
    w.reqs.push_back(r);
    w.hashes.push_back(std::move(h));
  }
  return w;
}

// The system under test: two instances and the handoff between them.
struct Rig {
  std::vector<Request> reqs;
  KvCache kp, kd;
  Scheduler p, d;
  Handoff h;
  Rig(const Shape& s, std::vector<Request> r)
      : reqs(std::move(r)),
        kp(s.p_blocks, s.block_size, -1, int32_t(reqs.size())),
        kd(s.d_blocks, s.block_size, -1, int32_t(reqs.size())),
        p(config_of(s, InstanceRole::Prefill), reqs, kp),
        d(config_of(s, InstanceRole::Decode), reqs, kd),
        h(p, d, reqs) {}
  Scheduler& instance(int32_t i) { return i == 0 ? p : d; }
};

// ============================== property test ==============================

enum Fault : uint8_t { kNone, kDrop, kDelay, kTimeout, kCorrupt, kDuplicate, kNumFaults };
constexpr const char* kFaultNames[kNumFaults] = {"none", "drop", "delay", "timeout", "corrupt", "duplicate"};
constexpr Duration kChannelTimeout = 8000;  // the channel gives up on a transfer after this

// What the property runs exercised, summed over all runs.
struct Totals {
  int64_t runs = 0, requests = 0, finished = 0, cancelled = 0, failed = 0, events = 0;
  int64_t p_steps = 0, d_steps = 0, chunk_cuts = 0, cached_tokens = 0;
  int64_t faults[kNumFaults] = {};
  HandoffCounters handoff;
  int64_t aborted_sync = 0, aborted_deferred = 0;
  int64_t stale_duplicate = 0, stale_after_sync_abort = 0, stale_late = 0;
  int64_t cancel_pending = 0, cancel_p_waiting = 0, cancel_p_running = 0, cancel_parked = 0;
  int64_t cancel_transfer_sync = 0, cancel_transfer_deferred = 0, cancel_d = 0, cancel_ended = 0;
  int64_t waited_parked = 0;
  int64_t fail_decode_kv = 0, fail_prefill_kv = 0, fail_other_arrival = 0, fail_transfer = 0;
};

class PropertyRun {
 public:
  PropertyRun(uint64_t seed, Totals& tot) : g_(seed), w_(random_workload(g_, true)), x_(w_.shape, w_.reqs), tot_(tot) {
    cancel_posted_.assign(x_.reqs.size(), 0);
  }

  void run() {
    INFO(describe(w_.shape, x_.reqs.size()));
    for (const Request& r : x_.reqs) q_.post(r.arrival, EvKind::Arrival, r.id);
    for (const Request& r : x_.reqs)
      if (r.cancel_at != kNever) post_cancel(r.id, r.cancel_at);
    int64_t n = 0;
    while (!q_.empty()) {
      REQUIRE(++n < 100000);
      const Event e = q_.pop();
      REQUIRE(e.t >= now_);
      now_ = e.t;
      INFO("event ", n, " at t=", now_, " kind ", int(e.kind), " who ", e.who, " ticket ", e.ticket);
      switch (e.kind) {
        case EvKind::Arrival: on_arrival(e.who); break;
        case EvKind::Cancel: on_cancel(e.who); break;
        case EvKind::StepDone: on_step_done(e.who); break;
        case EvKind::TransferDone: on_transfer_done(e); break;
      }
      check_invariants();
      start_idle();
      check_invariants();
    }
    tot_.events += n;
    check_end();
  }

 private:
  void post_cancel(ReqId id, Time t) {
    if (cancel_posted_[size_t(id)]) return;
    cancel_posted_[size_t(id)] = 1;
    q_.post(t, EvKind::Cancel, id);
  }

  void on_arrival(ReqId id) {
    Request& r = x_.reqs[size_t(id)];
    if (!r.alive()) return;  // cancelled before it arrived
    if (x_.h.add_request(id, now_, w_.hashes[size_t(id)])) {
      REQUIRE(r.status == RequestStatus::Waiting);
      REQUIRE(x_.h.phase(id) == PdPhase::Prefill);
      return;
    }
    REQUIRE(r.status == RequestStatus::Failed);
    REQUIRE(r.finish == now_);
    REQUIRE(x_.h.phase(id) == PdPhase::Gone);
    if (r.fail_reason == FailReason::ExceedsDecodeKvCapacity) {
      // It fits P; it could never fit D.
      REQUIRE(x_.kp.fits_at_all(r.prompt_len));
      REQUIRE_FALSE(x_.kd.fits_at_all(int64_t{r.prompt_len} + r.max_output));
      ++tot_.fail_decode_kv;
    } else if (r.fail_reason == FailReason::ExceedsKvCapacity) {
      REQUIRE_FALSE(x_.kp.fits_at_all(r.prompt_len));
      ++tot_.fail_prefill_kv;
    } else {
      REQUIRE(r.fail_reason != FailReason::None);
      ++tot_.fail_other_arrival;
    }
  }

  // Routed through Handoff::cancel_anywhere, as the disaggregated topology does.
  void on_cancel(ReqId id) {
    Request& r = x_.reqs[size_t(id)];
    if (r.status == RequestStatus::Pending) {
      r.status = RequestStatus::Cancelled;
      r.finish = r.arrival;
      ++tot_.cancel_pending;
      return;
    }
    const bool alive = r.alive();
    const bool waiting = r.status == RequestStatus::Waiting;
    const RequestStatus status_before = r.status;
    const Time finish_before = r.finish;
    const int32_t used_p = x_.kp.used_blocks(), used_d = x_.kd.used_blocks();
    const PdPhase phase_before = x_.h.phase(id);
    const uint64_t t = x_.h.ticket_of(id);
    bool asked = false, sync = false;
    const Handoff::CancelOutcome o = x_.h.cancel_anywhere(id, now_, [&](uint64_t ticket) {
      asked = true;
      REQUIRE(ticket == t);
      sync = g_.chance(0.5);
      return sync;
    });
    REQUIRE(o.phase == phase_before);
    // The channel is asked to stop only for a live request in transfer.
    REQUIRE(asked == (alive && phase_before == PdPhase::Transfer));
    switch (o.phase) {
      case PdPhase::Prefill: {
        if (!alive) break;
        if (waiting) {
          ++tot_.cancel_p_waiting;
          REQUIRE(o.left);
        } else {
          ++tot_.cancel_p_running;
          REQUIRE(o.left == !x_.p.in_flight());  // inside a step: it leaves when the step ends
        }
        if (o.left) REQUIRE((r.status == RequestStatus::Cancelled && r.finish == now_));
        break;
      }
      case PdPhase::Decode: {
        if (!alive) break;
        ++tot_.cancel_d;
        REQUIRE(o.left == !x_.d.in_flight());
        if (o.left) REQUIRE((r.status == RequestStatus::Cancelled && r.finish == now_));
        break;
      }
      case PdPhase::Parked:
        REQUIRE(alive);
        ++tot_.cancel_parked;
        REQUIRE(o.left);
        REQUIRE(x_.h.phase(id) == PdPhase::Gone);
        REQUIRE(x_.kp.used_blocks() <= used_p);
        break;
      case PdPhase::Transfer: {
        REQUIRE(alive);  // one cancel per request: a deferred abort's request is never cancelled again
        REQUIRE(t != 0);
        REQUIRE(o.left);
        if (sync) {  // the channel stopped writing: both sides free now; a late completion is stale
          ++tot_.cancel_transfer_sync;
          ++run_aborted_sync_;
          closed_.insert(t);
          sync_aborted_.insert(t);
          REQUIRE(x_.h.ticket_of(id) == 0);
          REQUIRE(x_.h.phase(id) == PdPhase::Gone);
          REQUIRE(x_.kd.used_blocks() < used_d);
        } else {  // both sides held until the channel reports the abort
          ++tot_.cancel_transfer_deferred;
          deferred_.insert(t);
          REQUIRE(x_.h.ticket_of(id) == t);
          REQUIRE(x_.kp.used_blocks() == used_p);
          REQUIRE(x_.kd.used_blocks() == used_d);
          q_.post(now_ + g_.in(1, 300), EvKind::TransferDone, id, t, false, Note::AbortNotice);
        }
        break;
      }
      case PdPhase::None: FAIL("a cancel for an arrived request that the handoff never saw"); break;
      case PdPhase::Gone: break;
    }
    if (!alive) {  // a cancel after the end changes nothing
      ++tot_.cancel_ended;
      REQUIRE(r.status == status_before);
      REQUIRE(r.finish == finish_before);
    } else if (x_.h.phase(id) != PdPhase::Prefill && x_.h.phase(id) != PdPhase::Decode) {
      REQUIRE(r.status == RequestStatus::Cancelled);  // the client sees a handoff cancel at once
      REQUIRE(r.finish == now_);
    }
  }

  void on_step_done(int32_t instance) {
    Scheduler& s = x_.instance(instance);
    for (ReqId id : s.complete_step(now_)) {
      const Request& r = x_.reqs[size_t(id)];
      REQUIRE(r.finish == now_);
      REQUIRE((r.status == RequestStatus::Finished || r.status == RequestStatus::Cancelled));
      if (r.status == RequestStatus::Finished) REQUIRE(r.generated == r.max_output);
    }
    if (instance != 0) return;
    for (ReqId id : x_.p.prefilled()) {
      const Request& r = x_.reqs[size_t(id)];
      REQUIRE(r.status == RequestStatus::Running);
      REQUIRE(r.generated == 1);
      REQUIRE(r.generated < r.max_output);
      REQUIRE(r.num_computed == r.prompt_len);
      REQUIRE(x_.kp.block_table(id).size() == size_t(x_.kp.blocks_for(r.prompt_len)));
      if (g_.chance(0.08)) post_cancel(id, now_ + g_.in(0, 200));  // aim some cancels at the parked
    }
    x_.h.park(x_.p.prefilled(), now_);
  }

  void on_transfer_done(const Event& e) {
    const bool open = !closed_.contains(e.ticket);
    ReqId id = -1;
    const Handoff::Outcome o = x_.h.complete(e.ticket, e.ok, now_, &id);
    if (!open) {
      REQUIRE(o == Handoff::Outcome::Stale);
      ++run_stale_;
      if (sync_aborted_.contains(e.ticket))
        ++tot_.stale_after_sync_abort;
      else if (e.note == Note::Duplicate)
        ++tot_.stale_duplicate;
      else
        ++tot_.stale_late;
      return;
    }
    closed_.insert(e.ticket);
    REQUIRE(id == ticket_req_.at(e.ticket));
    const Request& r = x_.reqs[size_t(id)];
    REQUIRE(x_.h.ticket_of(id) == 0);
    REQUIRE(x_.h.times(id).transfer_end == now_);
    if (deferred_.contains(e.ticket)) {
      REQUIRE(o == Handoff::Outcome::Cancelled);
      REQUIRE(r.status == RequestStatus::Cancelled);
      REQUIRE(x_.h.phase(id) == PdPhase::Gone);
      ++tot_.aborted_deferred;
      ++run_aborted_deferred_;
    } else if (e.ok) {
      REQUIRE(o == Handoff::Outcome::Delivered);
      REQUIRE(r.status == RequestStatus::Running);
      REQUIRE(x_.h.phase(id) == PdPhase::Decode);
    } else {
      REQUIRE(o == Handoff::Outcome::Failed);
      REQUIRE(r.status == RequestStatus::Failed);
      REQUIRE(r.fail_reason == FailReason::TransferFailed);
      REQUIRE(r.finish == now_);
      REQUIRE(x_.h.phase(id) == PdPhase::Gone);
      ++tot_.fail_transfer;
    }
  }

  // The channel: a latency per transfer and, now and then, a fault.
  void start_channel(uint64_t ticket, ReqId id) {
    const int64_t u = g_.in(0, 99);
    const Fault f = u < 50   ? kNone
                    : u < 60 ? kDrop
                    : u < 70 ? kDelay
                    : u < 80 ? kTimeout
                    : u < 88 ? kCorrupt
                             : kDuplicate;
    ++tot_.faults[f];
    const Duration lat = g_.in(20, 2000);
    switch (f) {
      case kNone: q_.post(now_ + lat, EvKind::TransferDone, id, ticket); break;
      case kDrop:  // the completion never comes; the timeout fails the transfer
        q_.post(now_ + kChannelTimeout, EvKind::TransferDone, id, ticket, false, Note::Timeout);
        break;
      case kDelay: q_.post(now_ + g_.in(3000, kChannelTimeout - 1), EvKind::TransferDone, id, ticket); break;
      case kTimeout:  // the timeout fires first; the real completion comes after it, stale
        q_.post(now_ + kChannelTimeout, EvKind::TransferDone, id, ticket, false, Note::Timeout);
        q_.post(now_ + kChannelTimeout + g_.in(1, 3000), EvKind::TransferDone, id, ticket, true, Note::Late);
        break;
      case kCorrupt: q_.post(now_ + lat, EvKind::TransferDone, id, ticket, false); break;
      case kDuplicate:
        q_.post(now_ + lat, EvKind::TransferDone, id, ticket);
        q_.post(now_ + lat + g_.in(0, 500), EvKind::TransferDone, id, ticket, true, Note::Duplicate);
        break;
      case kNumFaults: break;
    }
    if (g_.chance(0.15)) post_cancel(id, now_ + g_.in(0, lat));  // aim some cancels at the transfer
  }

  void start_transfers() {
    if (x_.h.num_parked() == 0) return;
    for (const TransferOrder& o : x_.h.start_transfers(now_)) {
      const Request& r = x_.reqs[size_t(o.id)];
      REQUIRE(o.ticket != 0);
      REQUIRE_FALSE(ticket_req_.contains(o.ticket));  // tickets are never reused
      ticket_req_[o.ticket] = o.id;
      REQUIRE(r.alive());
      REQUIRE(o.num_tokens == r.prompt_len);
      REQUIRE(o.src_blocks.size() == size_t(x_.kp.blocks_for(r.prompt_len)));
      REQUIRE(o.dst_blocks.size() == size_t(x_.kd.blocks_for(r.prompt_len)));
      REQUIRE(x_.kd.reserved_blocks(o.id) == x_.kd.blocks_for(int64_t{r.prompt_len} + r.max_output));
      REQUIRE(x_.h.phase(o.id) == PdPhase::Transfer);
      REQUIRE(x_.h.ticket_of(o.id) == o.ticket);
      const HandoffTimes& t = x_.h.times(o.id);
      REQUIRE(t.transfer_start == now_);
      REQUIRE(t.parked <= now_);
      tot_.waited_parked += t.parked < now_;  // D had no seat or no room when it parked
      start_channel(o.ticket, o.id);
    }
  }

  void start_idle() {
    start_transfers();
    for (int32_t i = 0; i < 2; ++i) {
      Scheduler& s = x_.instance(i);
      if (s.in_flight()) continue;
      const StepPlan& plan = s.schedule(now_);
      if (plan.empty()) continue;
      for (const ScheduledSeq& q : plan.seqs) {
        const Request& r = x_.reqs[size_t(q.id)];
        if (i == 0) {
          REQUIRE(q.num_computed_before < r.prompt_len);  // P never decodes
          tot_.chunk_cuts += !q.samples;
        } else {
          REQUIRE(q.num_tokens == 1);  // D never computes a prompt
          REQUIRE(q.num_computed_before >= r.prompt_len);
        }
      }
      ++(i == 0 ? tot_.p_steps : tot_.d_steps);
      q_.post(now_ + g_.in(20, 600), EvKind::StepDone, i);
    }
  }

  void check_invariants() {
    for (const KvCache* kv : {&x_.kp, &x_.kd})
      REQUIRE(kv->used_blocks() + kv->reserved_remaining() <= kv->num_blocks());
    int32_t in_transfer = 0;
    for (const Request& r : x_.reqs) {
      const PdPhase ph = x_.h.phase(r.id);
      if (ph == PdPhase::Transfer) {
        ++in_transfer;
        REQUIRE(x_.h.ticket_of(r.id) != 0);
      } else {
        REQUIRE(x_.h.ticket_of(r.id) == 0);
      }
      if (r.alive() && r.status != RequestStatus::Pending)
        REQUIRE((ph == PdPhase::Prefill || ph == PdPhase::Parked || ph == PdPhase::Transfer || ph == PdPhase::Decode));
      REQUIRE(x_.kp.block_table(r.id).size() <= size_t(x_.kp.reserved_blocks(r.id)));
      REQUIRE(x_.kd.block_table(r.id).size() <= size_t(x_.kd.reserved_blocks(r.id)));
    }
    REQUIRE(x_.h.open_tickets() == in_transfer);
    REQUIRE(x_.d.num_receiving() == in_transfer);
    REQUIRE(x_.d.num_running() + x_.d.num_receiving() <= w_.shape.d_seqs);
    REQUIRE(x_.p.num_running() <= w_.shape.p_seqs);
  }

  void check_end() {
    for (const Request& r : x_.reqs) {
      INFO("request ", r.id, " prompt ", r.prompt_len, " max_output ", r.max_output, " status ", to_string(r.status));
      REQUIRE_FALSE(r.alive());  // no request lost
      REQUIRE(r.finish != kNever);
      switch (r.status) {
        case RequestStatus::Finished:
          CHECK(r.generated == r.max_output);
          ++tot_.finished;
          break;
        case RequestStatus::Cancelled: ++tot_.cancelled; break;
        case RequestStatus::Failed:
          CHECK(r.fail_reason != FailReason::None);
          ++tot_.failed;
          break;
        default: FAIL("request ended ", to_string(r.status));
      }
      tot_.cached_tokens += r.num_cached_tokens;
    }
    // Nothing leaked.
    CHECK(x_.kp.used_blocks() == 0);
    CHECK(x_.kp.reserved_remaining() == 0);
    CHECK(x_.kd.used_blocks() == 0);
    CHECK(x_.kd.reserved_remaining() == 0);
    CHECK(x_.h.open_tickets() == 0);
    CHECK(x_.h.num_parked() == 0);
    CHECK(x_.d.num_receiving() == 0);
    CHECK(x_.p.num_running() == 0);
    CHECK(x_.d.num_running() == 0);
    // The handoff's own counters agree with what this loop saw.
    const HandoffCounters& c = x_.h.counters();
    CHECK(c.started == int64_t(ticket_req_.size()));
    CHECK(c.started == c.delivered + c.failed + c.aborted);
    CHECK(c.aborted == run_aborted_sync_ + run_aborted_deferred_);
    CHECK(c.stale == run_stale_);
    tot_.handoff.started += c.started;
    tot_.handoff.delivered += c.delivered;
    tot_.handoff.failed += c.failed;
    tot_.handoff.aborted += c.aborted;
    tot_.handoff.stale += c.stale;
    tot_.handoff.cancelled_parked += c.cancelled_parked;
    tot_.aborted_sync += run_aborted_sync_;
    tot_.requests += int64_t(x_.reqs.size());
    ++tot_.runs;
  }

  Draw g_;
  Workload w_;
  Rig x_;
  Totals& tot_;
  EventQueue q_;
  Time now_ = 0;
  std::vector<uint8_t> cancel_posted_;  // at most one cancel per request, as the engine posts
  std::map<uint64_t, ReqId> ticket_req_;
  std::set<uint64_t> closed_;        // tickets the handoff must now call stale
  std::set<uint64_t> sync_aborted_;  // ... of which closed by a synchronous abort
  std::set<uint64_t> deferred_;      // tickets whose request was cancelled with a deferred abort
  int64_t run_aborted_sync_ = 0, run_aborted_deferred_ = 0, run_stale_ = 0;
};

}  // namespace

TEST_CASE("1P1D handoff property: 400 random workloads with channel faults and cancels in every phase") {
  Totals t;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    INFO("seed ", seed);
    PropertyRun(seed * 0x9e3779b97f4a7c15ULL + 17, t).run();
  }
  const HandoffCounters& h = t.handoff;
  MESSAGE(fmt::format(
      "1P1D property: {} runs, {} requests ({} finished, {} cancelled, {} failed), {} events, {} P steps ({} chunk "
      "cuts), {} D steps, {} cached prompt tokens",
      t.runs, t.requests, t.finished, t.cancelled, t.failed, t.events, t.p_steps, t.chunk_cuts, t.d_steps,
      t.cached_tokens));
  MESSAGE(fmt::format(
      "channel faults injected: none {}, drop {}, delay {}, timeout {}, corrupt {}, duplicate {}; handoff: {} started, "
      "{} delivered, {} failed, {} aborted ({} synchronous, {} deferred), {} stale ({} duplicates, {} after a "
      "synchronous abort, {} late), {} cancelled parked",
      t.faults[kNone], t.faults[kDrop], t.faults[kDelay], t.faults[kTimeout], t.faults[kCorrupt], t.faults[kDuplicate],
      h.started, h.delivered, h.failed, h.aborted, t.aborted_sync, t.aborted_deferred, h.stale, t.stale_duplicate,
      t.stale_after_sync_abort, t.stale_late, h.cancelled_parked));
  MESSAGE(fmt::format(
      "cancels: {} before arrival, {} waiting on P, {} running on P, {} parked, {} in transfer (synchronous abort), {} "
      "in transfer (deferred abort), {} on D, {} after the end; {} waited parked for D; arrival failures: {} "
      "exceeds_decode_kv_capacity, {} exceeds_kv_capacity, {} other; {} transfer failures",
      t.cancel_pending, t.cancel_p_waiting, t.cancel_p_running, t.cancel_parked, t.cancel_transfer_sync,
      t.cancel_transfer_deferred, t.cancel_d, t.cancel_ended, t.waited_parked, t.fail_decode_kv, t.fail_prefill_kv,
      t.fail_other_arrival, t.fail_transfer));
  for (int f = 0; f < kNumFaults; ++f) {
    INFO("fault ", kFaultNames[f]);
    CHECK(t.faults[f] > 0);
  }
  CHECK(h.failed > 0);
  CHECK(t.fail_transfer == h.failed);
  CHECK(t.aborted_sync > 0);
  CHECK(t.aborted_deferred > 0);
  CHECK(t.stale_duplicate > 0);
  CHECK(t.stale_after_sync_abort > 0);
  CHECK(t.stale_late > 0);
  CHECK(h.cancelled_parked > 0);
  CHECK(h.cancelled_parked == t.cancel_parked);
  CHECK(t.cancel_pending > 0);
  CHECK(t.cancel_p_waiting > 0);
  CHECK(t.cancel_p_running > 0);
  CHECK(t.cancel_d > 0);
  CHECK(t.cancel_ended > 0);
  CHECK(t.waited_parked > 0);
  CHECK(t.fail_decode_kv > 0);
  CHECK(t.chunk_cuts > 0);
  CHECK(t.cached_tokens > 0);
  CHECK(h.delivered > 1000);
  CHECK(t.finished > 1000);
}

// ============================== differential test ==============================

namespace {

// A naive two-instance reference for continuous batching, chunked prefill off and prefix caching
// off, written the obvious way and sharing nothing with policies/ beyond the Request struct.
// Each pool is a map of blocks held and blocks reserved by request; every question about a pool
// is answered by summing the maps again.
//
//   P        admits the queue's head while it has a seat (a step admits at most max_num_seqs), the
//            whole prompt fits the step's budget left, and the pool can reserve the prompt's
//            blocks; the step computes the prompt and samples the first token. Then the request
//            finishes (one token asked), leaves (cancelled during the step), or parks, holding
//            its blocks.
//   handoff  FCFS: while D has a seat (running + receiving) and room for the head's whole life
//            (prompt + max_output), D reserves that and takes the prompt's blocks, and a transfer
//            starts. P's blocks go when the transfer completes; D's too if the request was
//            cancelled meanwhile. A synchronous abort frees both sides at the cancel.
//   D        each step, one token for each running request in the order they arrived on D,
//            while the budget lasts.
class ReferencePd {
 public:
  struct Config {
    int block_size = 1, p_blocks = 1, d_blocks = 1, p_budget = 1, d_budget = 1, p_seqs = 1, d_seqs = 1;
  };
  struct Seq {
    ReqId id;
    int num_tokens, num_computed_before;
    bool operator==(const Seq&) const = default;
  };

  ReferencePd(Config c, std::vector<Request>& reqs)
      : c_(c), reqs_(reqs), p_(c.p_blocks, c.block_size), d_(c.d_blocks, c.block_size), where_(reqs.size(), kOutside) {}

  bool arrive(ReqId id, Time now) {
    Request& r = reqs_[size_t(id)];
    FailReason why = FailReason::None;
    if (r.prompt_len < 1)
      why = FailReason::EmptyPrompt;
    else if (r.max_output < 1)
      why = FailReason::EmptyOutput;
    else if (p_.blocks(r.prompt_len) > c_.p_blocks)
      why = FailReason::ExceedsKvCapacity;
    else if (r.prompt_len > c_.p_budget)
      why = FailReason::PromptOverBudget;
    else if (d_.blocks(long(r.prompt_len) + r.max_output) > c_.d_blocks)
      why = FailReason::ExceedsDecodeKvCapacity;
    if (why != FailReason::None) {
      end(id, RequestStatus::Failed, now);
      r.fail_reason = why;
      return false;
    }
    r.status = RequestStatus::Waiting;
    p_waiting_.push_back(id);
    where_[size_t(id)] = kPWaiting;
    return true;
  }

  std::vector<Seq> schedule_p() {
    std::vector<Seq> plan;
    int budget = c_.p_budget;
    while (!p_waiting_.empty() && int(plan.size()) < c_.p_seqs && budget > 0) {
      const ReqId id = p_waiting_.front();
      Request& r = reqs_[size_t(id)];
      const int need = p_.blocks(r.prompt_len);
      if (r.prompt_len > budget || p_.sum_reserved() + need > c_.p_blocks) break;
      p_waiting_.pop_front();
      p_.reserved[id] = p_.held[id] = need;
      r.status = RequestStatus::Running;
      where_[size_t(id)] = kPRunning;
      plan.push_back({id, r.prompt_len, 0});
      budget -= r.prompt_len;
    }
    p_plan_ = plan;
    return plan;
  }

  void complete_p(Time now) {
    for (const Seq& s : p_plan_) {
      Request& r = reqs_[size_t(s.id)];
      r.num_computed = r.prompt_len;
      r.generated = 1;
      const bool done = r.generated >= r.max_output;
      if (done || cancel_pending_.contains(s.id)) {
        p_.free(s.id);
        end(s.id, done ? RequestStatus::Finished : RequestStatus::Cancelled, now);
      } else {
        parked_.push_back(s.id);
        where_[size_t(s.id)] = kParked;
      }
      cancel_pending_.erase(s.id);
    }
    p_plan_.clear();
  }

  std::vector<ReqId> start_transfers() {
    std::vector<ReqId> started;
    while (!parked_.empty()) {
      const ReqId id = parked_.front();
      const Request& r = reqs_[size_t(id)];
      const int life = d_.blocks(long(r.prompt_len) + r.max_output);
      const int seats = int(d_running_.size()) + count(kTransfer);
      if (seats >= c_.d_seqs || d_.sum_reserved() + life > c_.d_blocks) break;
      parked_.pop_front();
      d_.reserved[id] = life;
      d_.held[id] = d_.blocks(r.prompt_len);
      where_[size_t(id)] = kTransfer;
      started.push_back(id);
    }
    return started;
  }

  // Returns whether the transfer was still open (else the completion is ignored).
  bool transfer_done(ReqId id) {
    if (where_[size_t(id)] != kTransfer) return false;
    p_.free(id);
    if (aborted_.contains(id)) {
      d_.free(id);
      where_[size_t(id)] = kLeft;
    } else {
      d_running_.push_back(id);
      where_[size_t(id)] = kDRunning;
    }
    return true;
  }

  std::vector<Seq> schedule_d() {
    std::vector<Seq> plan;
    for (ReqId id : d_running_) {
      if (int(plan.size()) == c_.d_budget) break;
      const Request& r = reqs_[size_t(id)];
      d_.held[id] = std::max(d_.held[id], d_.blocks(long(r.num_computed) + 1));
      plan.push_back({id, 1, r.num_computed});
    }
    d_plan_ = plan;
    d_in_flight_ = !plan.empty();
    return plan;
  }

  void complete_d(Time now) {
    for (const Seq& s : d_plan_) {
      Request& r = reqs_[size_t(s.id)];
      r.num_computed += 1;
      r.generated += 1;
    }
    std::vector<ReqId> keep;
    for (ReqId id : d_running_) {
      const bool done = reqs_[size_t(id)].generated >= reqs_[size_t(id)].max_output;
      if (done || cancel_pending_.contains(id)) {
        d_.free(id);
        end(id, done ? RequestStatus::Finished : RequestStatus::Cancelled, now);
        cancel_pending_.erase(id);
      } else {
        keep.push_back(id);
      }
    }
    d_running_ = keep;
    d_plan_.clear();
    d_in_flight_ = false;
  }

  // A cancel for an arrived request; `sync`: the channel stops writing at once.
  void cancel(ReqId id, Time now, bool sync) {
    switch (where_[size_t(id)]) {
      case kPWaiting:
        p_waiting_.erase(std::find(p_waiting_.begin(), p_waiting_.end(), id));
        end(id, RequestStatus::Cancelled, now);
        break;
      case kPRunning: cancel_pending_.insert(id); break;  // always inside P's step
      case kParked:
        parked_.erase(std::find(parked_.begin(), parked_.end(), id));
        p_.free(id);
        end(id, RequestStatus::Cancelled, now);
        break;
      case kTransfer:
        if (sync) {
          p_.free(id);
          d_.free(id);
          end(id, RequestStatus::Cancelled, now);
        } else {
          aborted_.insert(id);
          reqs_[size_t(id)].status = RequestStatus::Cancelled;
          reqs_[size_t(id)].finish = now;
        }
        break;
      case kDRunning:
        if (d_in_flight_) {
          cancel_pending_.insert(id);
        } else {
          d_running_.erase(std::find(d_running_.begin(), d_running_.end(), id));
          d_.free(id);
          end(id, RequestStatus::Cancelled, now);
        }
        break;
      default: break;  // ended
    }
  }

  int p_used() const { return p_.sum_held(); }
  int p_outstanding() const { return p_.sum_reserved() - p_.sum_held(); }
  int d_used() const { return d_.sum_held(); }
  int d_outstanding() const { return d_.sum_reserved() - d_.sum_held(); }
  bool p_in_flight() const { return !p_plan_.empty(); }
  bool d_in_flight() const { return d_in_flight_; }

 private:
  enum Where : uint8_t { kOutside, kPWaiting, kPRunning, kParked, kTransfer, kDRunning, kLeft };
  struct Pool {
    int num_blocks, block_size;
    std::map<ReqId, int> held, reserved;  // blocks, by request
    Pool(int n, int bs) : num_blocks(n), block_size(bs) {}
    int blocks(long tokens) const { return int((tokens + block_size - 1) / block_size); }
    static int sum(const std::map<ReqId, int>& m) {
      int s = 0;
      for (const auto& [id, n] : m) s += n;
      return s;
    }
    int sum_held() const { return sum(held); }
    int sum_reserved() const { return sum(reserved); }
    void free(ReqId id) {
      held.erase(id);
      reserved.erase(id);
    }
  };
  int count(Where w) const { return int(std::count(where_.begin(), where_.end(), w)); }
  void end(ReqId id, RequestStatus s, Time now) {
    reqs_[size_t(id)].status = s;
    reqs_[size_t(id)].finish = now;
    where_[size_t(id)] = kLeft;
  }

  Config c_;
  std::vector<Request>& reqs_;
  Pool p_, d_;
  std::vector<Where> where_;
  std::deque<ReqId> p_waiting_, parked_;
  std::vector<ReqId> d_running_;
  std::set<ReqId> cancel_pending_, aborted_;
  std::vector<Seq> p_plan_, d_plan_;
  bool d_in_flight_ = false;
};

std::vector<ReferencePd::Seq> seqs_of(const StepPlan& p) {
  std::vector<ReferencePd::Seq> v;
  for (const ScheduledSeq& s : p.seqs) v.push_back({s.id, s.num_tokens, s.num_computed_before});
  return v;
}

struct DiffTotals {
  int64_t runs = 0, events = 0, p_steps = 0, d_steps = 0, transfers = 0, finished = 0, cancelled = 0, failed = 0;
  int64_t stale = 0, waited_parked = 0, cancels_parked = 0, cancels_transfer = 0;
};

// One workload, the real pair and the reference in lockstep: every event goes to both, and both
// are compared after it.
class DiffRun {
 public:
  DiffRun(uint64_t seed, DiffTotals& tot)
      : g_(seed),
        w_(random_workload(g_, false)),
        x_(w_.shape, w_.reqs),
        b_(w_.reqs),
        ref_(ref_config(w_.shape), b_),
        tot_(tot) {
    cancel_posted_.assign(x_.reqs.size(), 0);
  }

  void run() {
    INFO(describe(w_.shape, x_.reqs.size()));
    for (const Request& r : x_.reqs) q_.post(r.arrival, EvKind::Arrival, r.id);
    for (const Request& r : x_.reqs)
      if (r.cancel_at != kNever) post_cancel(r.id, r.cancel_at);
    int64_t n = 0;
    while (!q_.empty()) {
      REQUIRE(++n < 100000);
      const Event e = q_.pop();
      now_ = e.t;
      INFO("event ", n, " at t=", now_, " kind ", int(e.kind), " who ", e.who);
      switch (e.kind) {
        case EvKind::Arrival: arrive(e.who); break;
        case EvKind::Cancel: cancel(e.who); break;
        case EvKind::StepDone: step_done(e.who); break;
        case EvKind::TransferDone: {
          const Handoff::Outcome o = x_.h.complete(e.ticket, true, now_);
          REQUIRE((o != Handoff::Outcome::Stale) == ref_.transfer_done(e.who));
          tot_.stale += o == Handoff::Outcome::Stale;
          break;
        }
      }
      compare();
      start_transfers();
      start_steps();
      compare();
    }
    for (size_t i = 0; i < x_.reqs.size(); ++i) {
      REQUIRE_FALSE(x_.reqs[i].alive());
      tot_.finished += x_.reqs[i].status == RequestStatus::Finished;
      tot_.cancelled += x_.reqs[i].status == RequestStatus::Cancelled;
      tot_.failed += x_.reqs[i].status == RequestStatus::Failed;
    }
    CHECK(x_.kp.used_blocks() == 0);
    CHECK(x_.kd.used_blocks() == 0);
    tot_.events += n;
    ++tot_.runs;
  }

 private:
  static ReferencePd::Config ref_config(const Shape& s) {
    return {s.block_size, s.p_blocks, s.d_blocks, s.p_budget, s.d_budget, s.p_seqs, s.d_seqs};
  }

  void post_cancel(ReqId id, Time t) {
    if (cancel_posted_[size_t(id)]) return;
    cancel_posted_[size_t(id)] = 1;
    q_.post(t, EvKind::Cancel, id);
  }

  void arrive(ReqId id) {
    if (!x_.reqs[size_t(id)].alive()) return;  // cancelled before it arrived
    REQUIRE(x_.h.add_request(id, now_, {}) == ref_.arrive(id, now_));
  }

  void cancel(ReqId id) {
    if (x_.reqs[size_t(id)].status == RequestStatus::Pending) {  // the engine's business, for both
      for (Request* r : {&x_.reqs[size_t(id)], &b_[size_t(id)]}) {
        r->status = RequestStatus::Cancelled;
        r->finish = r->arrival;
      }
      return;
    }
    const bool sync = g_.chance(0.5);
    // Routed as the disaggregated topology does.
    const PdPhase phase = x_.h.cancel_anywhere(id, now_, [&](uint64_t) { return sync; }).phase;
    tot_.cancels_parked += phase == PdPhase::Parked;
    tot_.cancels_transfer += phase == PdPhase::Transfer;
    ref_.cancel(id, now_, sync);
  }

  void step_done(int32_t instance) {
    if (instance == 0) {
      x_.p.complete_step(now_);
      x_.h.park(x_.p.prefilled(), now_);
      ref_.complete_p(now_);
    } else {
      x_.d.complete_step(now_);
      ref_.complete_d(now_);
    }
  }

  void start_transfers() {
    std::vector<ReqId> started;
    std::vector<uint64_t> tickets;
    if (x_.h.num_parked() > 0)
      for (const TransferOrder& o : x_.h.start_transfers(now_)) {
        started.push_back(o.id);
        tickets.push_back(o.ticket);
        tot_.waited_parked += x_.h.times(o.id).parked < now_;
      }
    REQUIRE(started == ref_.start_transfers());
    tot_.transfers += int64_t(started.size());
    for (size_t i = 0; i < started.size(); ++i) {
      const Duration latency = g_.in(20, 3000);
      q_.post(now_ + latency, EvKind::TransferDone, started[i], tickets[i]);
      if (g_.chance(0.1)) post_cancel(started[i], now_ + g_.in(0, latency));  // aim some cancels at the transfer
    }
  }

  void start_steps() {
    REQUIRE(x_.p.in_flight() == ref_.p_in_flight());
    if (!x_.p.in_flight()) {
      const StepPlan& plan = x_.p.schedule(now_);
      REQUIRE(seqs_of(plan) == ref_.schedule_p());
      if (!plan.empty()) {
        ++tot_.p_steps;
        q_.post(now_ + g_.in(20, 600), EvKind::StepDone, 0);
      }
    }
    REQUIRE(x_.d.in_flight() == ref_.d_in_flight());
    if (!x_.d.in_flight()) {
      const StepPlan& plan = x_.d.schedule(now_);
      REQUIRE(seqs_of(plan) == ref_.schedule_d());
      if (!plan.empty()) {
        ++tot_.d_steps;
        q_.post(now_ + g_.in(20, 600), EvKind::StepDone, 1);
      }
    }
  }

  void compare() {
    for (size_t i = 0; i < x_.reqs.size(); ++i) {
      const Request &a = x_.reqs[i], &b = b_[i];
      INFO("request ", i);
      REQUIRE(a.status == b.status);
      REQUIRE(a.finish == b.finish);
      REQUIRE(a.fail_reason == b.fail_reason);
      REQUIRE(a.generated == b.generated);
      REQUIRE(a.num_computed == b.num_computed);
    }
    REQUIRE(x_.kp.used_blocks() == ref_.p_used());
    REQUIRE(x_.kp.reserved_remaining() == ref_.p_outstanding());
    REQUIRE(x_.kd.used_blocks() == ref_.d_used());
    REQUIRE(x_.kd.reserved_remaining() == ref_.d_outstanding());
  }

  Draw g_;
  Workload w_;
  Rig x_;
  std::vector<Request> b_;  // the reference's requests
  ReferencePd ref_;
  DiffTotals& tot_;
  EventQueue q_;
  Time now_ = 0;
  std::vector<uint8_t> cancel_posted_;  // at most one cancel per request
};

}  // namespace

TEST_CASE("1P1D handoff differential: two schedulers + Handoff == naive two-instance reference, 300 workloads") {
  DiffTotals t;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    INFO("seed ", seed);
    DiffRun(seed * 0xd1b54a32d192ed03ULL + 5, t).run();
  }
  MESSAGE(fmt::format(
      "1P1D differential: {} runs, {} events, {} P steps, {} D steps, {} transfers ({} after waiting parked), {} "
      "stale completions; cancels: {} parked, {} in transfer; {} finished, {} cancelled, {} failed",
      t.runs, t.events, t.p_steps, t.d_steps, t.transfers, t.waited_parked, t.stale, t.cancels_parked,
      t.cancels_transfer, t.finished, t.cancelled, t.failed));
  CHECK(t.transfers > 1000);
  CHECK(t.waited_parked > 100);
  CHECK(t.cancels_parked > 0);
  CHECK(t.cancels_transfer > 0);
  CHECK(t.stale > 0);
}
