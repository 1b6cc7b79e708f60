// The engine side of tandem serve: the workload's instances, executors and channel (set up by
// RunSetup, as `tandem run`'s are), an Engine in an open run (Engine::open_arrivals)
// under the wall clock on a thread of its own, and the two ways between it and the HTTP thread:
//   HTTP -> engine  submit / cancel / close post Submit, Cancel and Close into the engine's inbox
//                   (a post wakes the loop's wall-clock wait); a prompt's ids are written into its
//                   slot before its Submit is posted, and read on the loop's thread after
//   engine -> HTTP  the observer (loop thread) gathers an event's tokens (a step's) and appends
//                   them to the Outbox together when the loop says the event is done, then a
//                   request's end; the first notes into an empty outbox call `wake` (the HTTP side
//                   posts one drain onto its io_context), so a step's tokens cost one wake-up
// With --backend sim every step takes the cost model's time: the loop waits on the wall clock
// until the step's modelled end, so clients see the workload's hardware, not this machine.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "sim/engine/engine.h"
#include "sim/outputs/outputs.h"
#include "sim/run/run_setup.h"

namespace tandem::serve {

struct Note {
  enum class Kind : uint8_t { Token, End } kind;
  RequestStatus status = RequestStatus::Running;  // End: finished, cancelled or failed
  FailReason reason = FailReason::None;
  ReqId id;
  Token token = 0;
  Time at = 0;            // the engine's instant (ns since the run's start)
  int64_t pushed_ns = 0;  // CLOCK_MONOTONIC ns when it entered the Outbox (only with stamps on)
};

class Outbox {
 public:
  explicit Outbox(std::function<void()> wake) : wake_(std::move(wake)) {}
  // --chunk-timestamps: each note carries the instant it was pushed (the benchmark's split).
  void set_stamps(bool on) { stamps_ = on; }
  void push(const Note& n) { push(std::span<const Note>(&n, 1)); }
  // Several at once (a step's tokens): one lock and at most one wake-up for all of them, so the
  // HTTP side is not woken while the loop is still handing them over.
  void push(std::span<const Note> notes) {
    if (notes.empty()) return;
    bool was_empty;
    {
      std::lock_guard lock(mu_);
      was_empty = notes_.empty();
      const size_t first = notes_.size();
      notes_.insert(notes_.end(), notes.begin(), notes.end());
      if (stamps_) {
        const int64_t now = steady_ns();
        for (size_t i = first; i < notes_.size(); ++i) notes_[i].pushed_ns = now;
      }
    }
    if (was_empty) wake_();
  }
  static int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // Everything pushed so far, in order (the HTTP thread).
  void take(std::vector<Note>& out) {
    out.clear();
    std::lock_guard lock(mu_);
    out.swap(notes_);
  }

 private:
  std::function<void()> wake_;
  bool stamps_ = false;
  std::mutex mu_;
  std::vector<Note> notes_;
};

// What /metrics shows, updated on the loop's thread, read on the HTTP thread.
struct LiveStats {
  std::atomic<int64_t> running{0}, waiting{0};
  std::atomic<double> kv_usage{0};
  std::mutex mu;  // guards the rest
  int64_t finished = 0, cancelled = 0, failed = 0, prompt_tokens = 0, generation_tokens = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;  // tokens, as vLLM's prefix_cache_{queries,hits}
  int64_t transfers = 0, transfer_bytes = 0;
  struct Histogram {
    std::vector<double> bounds;   // seconds
    std::vector<int64_t> counts;  // counts[i]: observations <= bounds[i]; last: +Inf
    double sum = 0;
    int64_t count = 0;
    explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
    void add(double v);
  };
  Histogram ttft, itl, e2e;
  // A finished request's phases, as vLLM splits them: queue (arrival to its first step), prefill
  // (first step to first token), decode (first to last token), inference (prefill + decode), and
  // its time per output token (decode / (tokens - 1), two tokens or more).
  Histogram queue, prefill, decode, inference, request_tpot;
  // Counts: a finished request's prompt and output tokens and max_tokens (1-2-5 buckets up to the
  // model's max_model_len), and the tokens each step computes (prompt chunks and decode inputs).
  Histogram prompt_len, generation_len, max_tokens_param, step_tokens;
  explicit LiveStats(int32_t max_model_len);
};

struct ServeOptions {
  std::string backend = "sim";
  int threads = 0;
  int64_t max_requests = 1'000'000;  // requests the server takes in its life; 0: no limit
  // Keep every prompt's token ids to the end (arrivals.csv's prompt_token_ids column), so that
  // `tandem run` of the served workload replays what the clients sent, id for id; the memory
  // they take then grows with the prompt tokens served.
  bool record_prompts = false;
  std::optional<std::string> out;
  TraceDetail trace = TraceDetail::Full;
};

class ServedRun final : public run_observer_i, public client_prompts_i {
 public:
  // Builds the executors and the channel and warms them up; throws InputError on a workload it
  // cannot serve.
  ServedRun(const Workload& w, const ServeOptions& o);
  ~ServedRun() override;
  ServedRun(const ServedRun&) = delete;
  ServedRun& operator=(const ServedRun&) = delete;

  // The HTTP thread's side. submit: the request's id, or -1 once --max-requests were taken.
  ReqId submit(std::vector<Token> prompt, int32_t max_output);
  void cancel(ReqId id) { setup_->engine().inbox().post(Cancel{id}); }
  void close() { setup_->engine().inbox().post(Close{}); }
  void set_outbox(Outbox* o) { outbox_ = o; }
  LiveStats& stats() { return stats_; }
  const Workload& workload() const { return setup_->workload; }
  int64_t max_requests() const { return o_.max_requests; }
  // Makes the engine under a fresh wall clock and runs it on its thread; `done` is called there
  // when the run has ended.
  void start(std::function<void()> done);
  // After `done`: the summary, the outputs written (--out); waits for the thread.
  Summary finish();
  // After finish(): the requests served, by slot (ids 0 .. n-1).
  const std::vector<Request>& served() const { return setup_->engine().requests(); }
  // After finish(), with record_prompts: request id's prompt as the client sent it (token ids).
  std::span<const Token> recorded_prompt(ReqId id) const { return prompts_[size_t(id)]; }
  // The engine's clock, for the front end's timestamps (ns since the run's start; after start()).
  Time now() const { return setup_->clock->now(); }
  // The run's time 0 on steady_clock (CLOCK_MONOTONIC, ns): another process's receipt instants
  // compare with the engine's (the front-end benchmark, --chunk-timestamps).
  int64_t start_steady_ns() const { return start_steady_ns_; }

  // run_observer_i and client_prompts_i: the loop's thread.
  void on_step(const StepRecord& r) override;
  void on_token(const Request& r, Time at) override;
  void on_request_done(const Request& r) override;
  void on_event_done() override;
  std::span<const Token> prompt(ReqId id) const override {
    std::lock_guard lock(prompts_mu_);
    return prompts_[size_t(id)];  // its ids stay where they are while prompts_ grows
  }

 private:
  ServeOptions o_;
  std::unique_ptr<RunSetup> setup_;  // the workload, specs, executors, channel, clock, engine, outputs
  int64_t start_steady_ns_ = 0;      // the wall clock's time 0, made at start() after the warm-up
  Outbox* outbox_ = nullptr;
  LiveStats stats_;  // its token-count buckets reach the workload's max_model_len
  // By id: written by submit (HTTP thread), which grows the table; read on the loop's thread;
  // freed when the request leaves. Both tables grow with the requests taken (amortised
  // doubling), as the engine's does: a server's memory follows its use, not --max-requests.
  mutable std::mutex prompts_mu_;
  std::vector<std::vector<Token>> prompts_;
  struct Delivered {
    int32_t tokens = 0;      // handed to the outbox
    Time last = 0;           // the last one's instant
    bool scheduled = false;  // a step has taken it
  };
  std::vector<Delivered> delivered_;  // by id (loop thread)
  Delivered& delivered(ReqId id);
  std::vector<double> kv_use_;      // by instance, from its last step
  std::vector<Note> event_tokens_;  // the current event's tokens, for the outbox at its end (loop thread)
  void hand_over_tokens();
  std::atomic<int64_t> num_alive_{0};  // submitted (HTTP thread) and not ended (loop thread)
  int64_t num_scheduled_alive_ = 0;    // loop thread
  void publish_counts();
  void add_finished(const Request& r);  // under stats_.mu
  ReqId next_slot_ = 0;                 // HTTP thread
  std::thread thread_;
  Summary summary_;
  std::string error_;
};

}  // namespace tandem::serve
