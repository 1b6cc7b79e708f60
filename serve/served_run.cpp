#include "serve/served_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "backend/cpu/kernels.h"
#include "serve/tokenizer.h"
#include "sim/workload/workload_gen.h"

namespace tandem::serve {

void LiveStats::Histogram::add(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

namespace {
// vLLM's buckets (vllm/v1/metrics/loggers.py), so that its dashboards' quantiles read the same.
const std::vector<double> kPerTokenBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                              0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's token-count buckets, to its max_model_len).
std::vector<double> one_two_five(int64_t max) {
  std::vector<double> b;
  for (int64_t decade = 1; decade <= max; decade *= 10)
    for (int64_t m : {1, 2, 5})
      if (m * decade <= max) b.push_back(double(m * decade));
  return b;
}
}  // namespace

LiveStats::LiveStats(int32_t max_model_len)
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
            1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl(kPerTokenBuckets),
      e2e(kRequestBuckets),
      queue(kRequestBuckets),
      prefill(kRequestBuckets),
      decode(kRequestBuckets),
      inference(kRequestBuckets),
      request_tpot(kPerTokenBuckets),
      prompt_len(one_two_five(max_model_len)),
      generation_len(one_two_five(max_model_len)),
      max_tokens_param(one_two_five(max_model_len)),
      step_tokens({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}) {}

ServedRun::ServedRun(const Workload& w, const ServeOptions& o) : o_(o), stats_(w.model.max_model_len) {
  if (o.max_requests < 0)
    throw InputError(fmt::format("--max-requests {}: must be at least 0 (0: no limit)", o.max_requests));
  if (o.backend == "cpu") cpu::set_threads(o.threads);
  // As `tandem run` under the wall clock (RunSetup): first-use costs paid before the first client
  // (at start()), several real instances each on a thread of its own; --backend sim is the
  // emulated server, the simulated executors under the wall clock.
  setup_ = std::make_unique<RunSetup>(w, RunSetupOptions{.backend = o.backend,
                                                         .clock = "wall",
                                                         .threads = o.threads,
                                                         .cuda = cuda_executor_factory(),
                                                         .channels = cuda_channel_factory(),
                                                         .emulated = o.backend == "sim"});
  setup_->warm_up_once();  // before the server says it listens
  kv_use_.resize(setup_->specs.size());
}

ServedRun::~ServedRun() {
  if (thread_.joinable()) thread_.join();
  // setup_ stops the instances' threads and the decode worker before the engine goes.
}

void ServedRun::start(std::function<void()> done) {
  Engine& engine = setup_->start(RequestSet{});  // an open run: the table grows with the Submits
  start_steady_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         static_cast<const WallClock&>(*setup_->clock).start().time_since_epoch())
                         .count();
  engine.open_arrivals(this);
  if (o_.out) setup_->write_outputs(*o_.out, o_.trace);
  engine.add_observer(this);
  thread_ = std::thread([this, done = std::move(done)] {
    try {
      summary_ = setup_->engine().run();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done();
  });
}

Summary ServedRun::finish() {
  if (thread_.joinable()) thread_.join();
  if (!error_.empty()) throw std::runtime_error(error_);
  summary_.clock = "wall";
  setup_->finish(summary_);  // the decode worker's answers stop; the output files are completed
  return summary_;
}

ReqId ServedRun::submit(std::vector<Token> prompt, int32_t max_output) {
  // Ids are ReqId (int32): without a limit, the last one is the type's.
  if ((o_.max_requests > 0 && next_slot_ >= o_.max_requests) || next_slot_ == std::numeric_limits<ReqId>::max() - 1)
    return -1;
  const ReqId id = next_slot_++;
  const auto len = int32_t(prompt.size());
  {  // before the Submit: the inbox's lock orders the two
    std::lock_guard lock(prompts_mu_);
    if (size_t(id) >= prompts_.capacity()) prompts_.reserve(std::max<size_t>(64, 2 * prompts_.capacity()));
    prompts_.resize(size_t(id) + 1);
    prompts_[size_t(id)] = std::move(prompt);
  }
  ++num_alive_;
  setup_->engine().inbox().post(Submit{id, len, max_output});
  return id;
}

// Running: requests alive that a step has taken (under PD, also while parked or moving); waiting:
// the other requests alive (submitted, never scheduled yet). Exact at every step and every end.
ServedRun::Delivered& ServedRun::delivered(ReqId id) {
  if (size_t(id) >= delivered_.size()) {
    if (size_t(id) >= delivered_.capacity())
      delivered_.reserve(std::max<size_t>({64, 2 * delivered_.capacity(), size_t(id) + 1}));
    delivered_.resize(size_t(id) + 1);
  }
  return delivered_[size_t(id)];
}

void ServedRun::on_step(const StepRecord& r) {
  for (const ScheduledSeq& s : r.plan->seqs) {
    Delivered& d = delivered(s.id);
    if (!d.scheduled) {
      d.scheduled = true;
      ++num_scheduled_alive_;
    }
  }
  const auto i = size_t(r.instance);
  kv_use_[i] = r.kv_capacity > 0 ? double(r.kv_used) / r.kv_capacity : 0.0;
  stats_.kv_usage = *std::max_element(kv_use_.begin(), kv_use_.end());
  publish_counts();
  std::lock_guard lock(stats_.mu);
  stats_.step_tokens.add(r.plan->num_tokens);
}

void ServedRun::publish_counts() {
  stats_.running = num_scheduled_alive_;
  stats_.waiting = std::max<int64_t>(0, num_alive_.load() - num_scheduled_alive_);
}

void ServedRun::on_token(const Request& r, Time at) {
  Delivered& d = delivered(r.id);
  const int32_t k = d.tokens++;
  const Time previous = d.last;
  d.last = at;
  const auto& out = setup_->engine().outputs();
  const Token t = out.empty() ? emulated_token(k) : out[size_t(r.id)][size_t(k)];
  {  // before the note: a client that has its token finds it in /metrics
    std::lock_guard lock(stats_.mu);
    ++stats_.generation_tokens;
    if (k == 0) {
      stats_.ttft.add(to_seconds(at - r.arrival));
      // A prompt counts once it is done (its first token), as vLLM counts it, not at the request's
      // end: a rate over these counters then follows the prefills as they happen.
      stats_.prompt_tokens += r.prompt_len;
      stats_.prefix_queries += r.prompt_len;
      stats_.prefix_hits += r.num_cached_tokens;
    } else {
      stats_.itl.add(to_seconds(at - previous));
    }
  }
  if (outbox_) event_tokens_.push_back({Note::Kind::Token, RequestStatus::Running, FailReason::None, r.id, t, at});
}

void ServedRun::hand_over_tokens() {
  if (!outbox_ || event_tokens_.empty()) return;
  outbox_->push(event_tokens_);
  event_tokens_.clear();
}

void ServedRun::on_event_done() { hand_over_tokens(); }

// A finished request's phases and sizes, as vLLM records them at a request's end (finished ones
// only: a cancelled or failed request has no decode phase to speak of).
void ServedRun::add_finished(const Request& r) {
  stats_.e2e.add(to_seconds(r.finish - r.arrival));
  stats_.queue.add(to_seconds(r.first_scheduled - r.arrival));
  stats_.prefill.add(to_seconds(r.first_token - r.first_scheduled));
  stats_.decode.add(to_seconds(r.last_token - r.first_token));
  stats_.inference.add(to_seconds(r.last_token - r.first_scheduled));
  if (r.generated > 1) stats_.request_tpot.add(to_seconds(r.last_token - r.first_token) / (r.generated - 1));
  stats_.prompt_len.add(r.prompt_len);
  stats_.generation_len.add(r.generated);
  stats_.max_tokens_param.add(r.max_output);
}

void ServedRun::on_request_done(const Request& r) {
  if (!o_.record_prompts) {
    std::lock_guard lock(prompts_mu_);
    // Swapped with an empty vector, not `= {}`: that assigns an empty initializer list and keeps
    // the buffer, so every prompt served stayed allocated to the end (heaptrack: all of them).
    std::vector<Token>().swap(prompts_[size_t(r.id)]);
  }
  num_scheduled_alive_ -= delivered(r.id).scheduled;
  --num_alive_;
  publish_counts();
  {  // before the note: a client that has its request's end finds it in /metrics
    std::lock_guard lock(stats_.mu);
    stats_.finished += r.status == RequestStatus::Finished;
    stats_.cancelled += r.status == RequestStatus::Cancelled;
    stats_.failed += r.status == RequestStatus::Failed;
    if (r.status == RequestStatus::Finished) add_finished(r);
    if (setup_->engine().topology().moves_kv()) {
      const RequestTransfer t = setup_->engine().topology().transfer_of(r.id);
      if (t.end != kNever) {
        ++stats_.transfers;
        stats_.transfer_bytes += t.bytes;
      }
    }
  }
  hand_over_tokens();  // a request's tokens before its end
  if (outbox_) outbox_->push({Note::Kind::End, r.status, r.fail_reason, r.id, 0, r.finish});
}

}  // namespace tandem::serve
