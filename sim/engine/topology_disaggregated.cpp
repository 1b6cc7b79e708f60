#include "sim/engine/topology_disaggregated.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/transfer/channels.h"

namespace tandem {

namespace {
Instance& one_with_role(std::span<const std::unique_ptr<Instance>> instances, InstanceRole role) {
  Instance* found = nullptr;
  for (const auto& in : instances)
    if (in->role == role) {
      if (found) throw std::logic_error(fmt::format("DisaggregatedTopology: two {} instances", to_string(role)));
      found = in.get();
    }
  if (!found) throw std::logic_error(fmt::format("DisaggregatedTopology: no {} instance", to_string(role)));
  return *found;
}
}  // namespace

DisaggregatedTopology::DisaggregatedTopology(const Workload& w, std::span<const std::unique_ptr<Instance>> instances,
                                             std::span<Request> requests, kv_channel_i* channel, loop_i& loop)
    : w_(w),
      reqs_(requests),
      loop_(loop),
      prefill_(one_with_role(instances, InstanceRole::Prefill)),
      decode_(one_with_role(instances, InstanceRole::Decode)),
      handoff_(std::make_unique<Handoff>(prefill_.scheduler, decode_.scheduler, requests)),
      own_channel_(channel ? nullptr : std::make_unique<SimChannel>(channel_model(w))),
      channel_(channel ? *channel : *own_channel_),
      first_token_at_decode_(w.disaggregation.first_token_from == FirstTokenFrom::Decode),
      bytes_(requests.size(), 0) {
  if (!channel && !prefill_.executor.simulated())
    throw std::logic_error("DisaggregatedTopology: a real backend needs a KV channel that moves the blocks");
  stats_.channel = channel_.name();
  for (const CancelSpec::AtPhase& c : w.requests.cancel.phase_cancels) {
    if (cancel_point_.empty()) cancel_point_.assign(requests.size(), CancelPoint::None);
    const std::string_view p = c.phase;
    cancel_point_.at(size_t(c.request)) = p == "prefill"    ? CancelPoint::Prefill
                                          : p == "parked"   ? CancelPoint::Parked
                                          : p == "transfer" ? CancelPoint::Transfer
                                          : p == "received" ? CancelPoint::Received
                                                            : CancelPoint::Decode;
  }
}

void DisaggregatedTopology::requests_moved(std::span<Request> requests) {
  reqs_ = requests;
  handoff_->requests_moved(requests);
  bytes_.resize(requests.size(), 0);
  if (!cancel_point_.empty()) cancel_point_.resize(requests.size(), CancelPoint::None);
}

bool DisaggregatedTopology::cancel(ReqId id, Time now) {
  const Request& r = reqs_[size_t(id)];
  if (!r.alive()) return false;  // it ended before the cancel came
  const bool past_first_decode = r.generated > 1;  // its first token came from P, a second only from D
  const Handoff::CancelOutcome o =
      handoff_->cancel_anywhere(id, now, [&](uint64_t ticket) { return channel_.abort(ticket, now); });
  if (o.phase == PdPhase::Prefill) ++stats_.cancelled_prefill;
  if (o.phase == PdPhase::Decode) ++(past_first_decode ? stats_.cancelled_decode : stats_.cancelled_received);
  if (o.phase == PdPhase::Transfer) ++stats_.cancelled_transfer;
  return o.left;
}

// Parked requests that the decode instance can now take: D reserves, the channel starts. A
// synchronous channel's end is an event at now + its time; an asynchronous one posts its own.
void DisaggregatedTopology::before_planning(Time now) {
  if (handoff_->num_parked() == 0) return;
  for (const TransferOrder& o : handoff_->start_transfers(now)) {
    // Layer-wise overlap only with the step that finished this prompt, i.e. one that ended now.
    const Duration last_step = handoff_->times(o.id).parked == now ? prefill_.inflight.elapsed : 0;
    const KvTransfer t{o.ticket, o.id, o.num_tokens, o.src_blocks, o.dst_blocks, last_step, now};
    TransferStart s;
    try {
      s = channel_.start(t);
    } catch (const std::exception& ex) {
      s = TransferStart{.async = false, .ok = false, .elapsed = 0, .bytes = 0, .error = ex.what()};
    }
    cancel_at(o.id, CancelPoint::Transfer);
    bytes_[size_t(o.id)] = s.bytes;
    stats_.bytes += s.ok ? s.bytes : 0;
    if (!s.async)
      loop_.post(now + std::max<Duration>(s.elapsed, 0),
                 TransferDone{o.ticket, s.ok, s.elapsed, s.ok ? TransferFault::None : TransferFault::Error});
    else
      loop_.await_transfer(o.ticket);
  }
}

void DisaggregatedTopology::step_planned(const Instance& in, const StepPlan& plan) {
  if (!cancel_point_.empty() && &in == &prefill_)
    for (const ScheduledSeq& s : plan.seqs) cancel_at(s.id, CancelPoint::Prefill);
}

void DisaggregatedTopology::step_done(Instance& in, Time now) {
  // Requests whose first step on the decode instance this was (their first token came from P).
  std::vector<ReqId> first_on_decode;
  if (!cancel_point_.empty() && &in == &decode_)
    for (const ScheduledSeq& s : in.scheduler.current_plan().seqs)
      if (s.samples && reqs_[size_t(s.id)].generated == 1) first_on_decode.push_back(s.id);
  for (ReqId id : in.scheduler.complete_step(now)) loop_.request_left(reqs_[size_t(id)]);
  for (ReqId id : first_on_decode) cancel_at(id, CancelPoint::Decode);
  if (&in == &prefill_) {
    handoff_->park(in.scheduler.prefilled(), now);
    for (ReqId id : in.scheduler.prefilled()) cancel_at(id, CancelPoint::Parked);
  }
}

void DisaggregatedTopology::transfer_done(const TransferDone& e, Time now) {
  ReqId id = -1;
  const Handoff::Outcome o = handoff_->complete(e.ticket, e.ok, now, &id);
  if (o == Handoff::Outcome::Stale) return;
  if (o == Handoff::Outcome::Failed || o == Handoff::Outcome::Delivered) {
    const HandoffTimes& t = handoff_->times(id);
    stats_.transfer_ms.push_back(to_ms(t.transfer_end - t.transfer_start));
  }
  Request& r = reqs_[size_t(id)];
  if (o == Handoff::Outcome::Delivered && first_token_at_decode_) loop_.token_to_client(r);  // D streams it now
  if (o == Handoff::Outcome::Delivered) cancel_at(id, CancelPoint::Received);
  if (o == Handoff::Outcome::Failed) {
    count_failed_transfer(e.fault);
    loop_.request_left(r);
  }
}

std::string DisaggregatedTopology::transfer_lost(uint64_t ticket) {
  ++stats_.timed_out;
  // The decode instance's executor is named backend@HOST:PORT when it is a worker.
  return fmt::format("transfer {} was not acknowledged by {} in {} ms", ticket, decode_.executor.name(),
                     w_.disaggregation.channel.timeout_ms);
}

void DisaggregatedTopology::cancel_at(ReqId id, CancelPoint p) {
  if (cancel_point_.empty() || cancel_point_[size_t(id)] != p || !reqs_[size_t(id)].alive()) return;
  cancel_point_[size_t(id)] = CancelPoint::None;
  loop_.post(loop_.now(), Cancel{id});
}

void DisaggregatedTopology::count_failed_transfer(TransferFault f) {
  switch (f) {
    case TransferFault::Corrupt: ++stats_.failed_corrupt; return;
    case TransferFault::Partial: ++stats_.failed_partial; return;
    case TransferFault::TimedOut: ++stats_.timed_out; return;
    default: ++stats_.failed_error; return;
  }
}

void DisaggregatedTopology::check_nothing_lost() const {
  if (handoff_->open_tickets() > 0 || handoff_->num_parked() > 0)
    throw std::runtime_error(
        fmt::format("engine: {} transfer ticket(s) still open and {} request(s) parked at the end "
                    "of the run (lost completion)",
                    handoff_->open_tickets(), handoff_->num_parked()));
}

void DisaggregatedTopology::add_layout(RunLayout& l) const {
  l.disaggregation = true;
  l.channel = channel_.name();
  l.first_token_from = std::string(to_string(w_.disaggregation.first_token_from));
}

void DisaggregatedTopology::add_figures(Summary& s) const {
  DisaggregationFigures& d = s.disaggregation;
  const HandoffCounters& c = handoff_->counters();
  d.enabled = true;
  d.channel = stats_.channel;
  d.started = c.started;
  d.delivered = c.delivered;
  d.failed = c.failed;
  d.aborted = c.aborted;
  d.stale = c.stale;
  d.cancelled_parked = c.cancelled_parked;
  d.failed_error = stats_.failed_error;
  d.failed_corrupt = stats_.failed_corrupt;
  d.failed_partial = stats_.failed_partial;
  d.timed_out = stats_.timed_out;
  d.cancelled_prefill = stats_.cancelled_prefill;
  d.cancelled_transfer = stats_.cancelled_transfer;
  d.cancelled_received = stats_.cancelled_received;
  d.cancelled_decode = stats_.cancelled_decode;
  d.lost = handoff_->open_tickets();  // still open when a lost peer ended the run
  d.bytes = stats_.bytes;
  std::vector<double> wait, after;
  for (const Request& r : reqs_) {
    const HandoffTimes& t = handoff_->times(r.id);
    if (t.transfer_start != kNever) wait.push_back(to_ms(t.transfer_start - t.parked));
    if (r.status == RequestStatus::Finished && t.transfer_end != kNever)
      after.push_back(to_ms(t.transfer_end - r.arrival));
  }
  std::vector<double> transfer = stats_.transfer_ms;
  d.transfer_ms = percentiles(transfer);
  d.handoff_wait_ms = percentiles(wait);
  d.ttft_after_transfer_ms = percentiles(after);
}

RequestTransfer DisaggregatedTopology::transfer_of(ReqId id) const {
  const HandoffTimes& t = handoff_->times(id);
  return {t.parked, t.transfer_start, t.transfer_end, bytes_[size_t(id)]};
}

}  // namespace tandem
