#include "policies/handoff.h"

#include <stdexcept>

namespace tandem {

Handoff::Handoff(Scheduler& prefill, Scheduler& decode, std::span<Request> requests)
    : p_(prefill),
      d_(decode),
      reqs_(requests),
      phase_(requests.size(), PdPhase::None),
      times_(requests.size()),
      ticket_(requests.size(), 0) {
  if (prefill.config().role != InstanceRole::Prefill || decode.config().role != InstanceRole::Decode)
    throw std::logic_error("Handoff: needs a prefill-role and a decode-role scheduler");
}

void Handoff::requests_moved(std::span<Request> requests) {
  if (requests.size() < reqs_.size()) throw std::logic_error("Handoff::requests_moved: the table shrank");
  reqs_ = requests;
  phase_.resize(requests.size(), PdPhase::None);
  times_.resize(requests.size());
  ticket_.resize(requests.size(), 0);
}

FailReason Handoff::arrival_failure(const Request& r) const {
  if (const FailReason why = p_.arrival_failure(r); why != FailReason::None) return why;
  return d_.arrival_failure(r);
}

bool Handoff::add_request(ReqId id, Time now, std::vector<BlockHash> prompt_hashes) {
  if (static_cast<size_t>(id) >= phase_.size())
    throw std::logic_error("Handoff::add_request: a request id beyond the handoff's table");
  Request& r = reqs_[static_cast<size_t>(id)];
  if (const FailReason why = arrival_failure(r); why != FailReason::None) {
    r.fail_reason = why;
    r.status = RequestStatus::Failed;
    r.finish = now;
    phase_[static_cast<size_t>(id)] = PdPhase::Gone;
    return false;
  }
  p_.add_request(id, now, std::move(prompt_hashes));
  phase_[static_cast<size_t>(id)] = PdPhase::Prefill;
  return true;
}

void Handoff::park(std::span<const ReqId> ids, Time now) {
  for (ReqId id : ids) {
    phase_[static_cast<size_t>(id)] = PdPhase::Parked;
    times_[static_cast<size_t>(id)].parked = now;
    parked_.push_back(id);
  }
}

std::span<const TransferOrder> Handoff::start_transfers(Time now) {
  orders_.clear();
  while (!parked_.empty()) {
    const ReqId id = parked_.front();
    if (phase_[static_cast<size_t>(id)] != PdPhase::Parked) {  // cancelled while parked
      parked_.pop_front();
      continue;
    }
    const Request& r = reqs_[static_cast<size_t>(id)];
    if (!d_.can_accept(r)) break;  // D full: the head waits, pinned on P, and so do the rest
    parked_.pop_front();
    d_.accept(id);
    const uint64_t t = next_ticket_++;
    open_.emplace(t, Open{id, false});
    ticket_[static_cast<size_t>(id)] = t;
    phase_[static_cast<size_t>(id)] = PdPhase::Transfer;
    times_[static_cast<size_t>(id)].transfer_start = now;
    ++counters_.started;
    orders_.push_back({t, id, r.prompt_len, p_.kv().block_table(id), d_.kv().block_table(id)});
  }
  return orders_;
}

void Handoff::end_transfer(ReqId id, Time now) {
  ticket_[static_cast<size_t>(id)] = 0;
  times_[static_cast<size_t>(id)].transfer_end = now;
  p_.release_handed_off(id);
}

Handoff::Outcome Handoff::complete(uint64_t ticket, bool ok, Time now, ReqId* id) {
  const auto it = open_.find(ticket);
  if (it == open_.end()) {
    ++counters_.stale;
    return Outcome::Stale;
  }
  const Open o = it->second;
  open_.erase(it);
  if (id) *id = o.id;
  end_transfer(o.id, now);
  Request& r = reqs_[static_cast<size_t>(o.id)];
  if (o.cancelled) {  // the request already left (at its cancel); its blocks go now
    d_.drop_receiving(o.id);
    phase_[static_cast<size_t>(o.id)] = PdPhase::Gone;
    ++counters_.aborted;
    return Outcome::Cancelled;
  }
  if (!ok) {
    d_.drop_receiving(o.id);
    phase_[static_cast<size_t>(o.id)] = PdPhase::Gone;
    r.status = RequestStatus::Failed;
    r.fail_reason = FailReason::TransferFailed;
    r.finish = now;
    ++counters_.failed;
    return Outcome::Failed;
  }
  d_.received(o.id);
  phase_[static_cast<size_t>(o.id)] = PdPhase::Decode;
  ++counters_.delivered;
  return Outcome::Delivered;
}

bool Handoff::cancel(ReqId id, Time now, bool channel_stopped) {
  Request& r = reqs_[static_cast<size_t>(id)];
  bool freed = true;
  switch (phase_[static_cast<size_t>(id)]) {
    case PdPhase::Parked:
      p_.release_handed_off(id);  // no transfer ever started: nobody else can touch its blocks
      phase_[static_cast<size_t>(id)] = PdPhase::Gone;
      ++counters_.cancelled_parked;
      break;
    case PdPhase::Transfer: {
      const uint64_t t = ticket_[static_cast<size_t>(id)];
      if (open_.at(t).cancelled) return false;  // cancelled before, waiting for its completion
      if (channel_stopped) {
        open_.erase(t);
        end_transfer(id, now);
        d_.drop_receiving(id);
        phase_[static_cast<size_t>(id)] = PdPhase::Gone;
        ++counters_.aborted;
      } else {
        open_.at(t).cancelled = true;  // complete() frees both sides
        freed = false;
      }
      break;
    }
    default: throw std::logic_error("Handoff::cancel: the request is not parked or in transfer");
  }
  // The client sees the request end now, whether or not its blocks are free yet.
  r.status = RequestStatus::Cancelled;
  r.finish = now;
  return freed;
}

Handoff::CancelOutcome Handoff::cancel_anywhere(ReqId id, Time now, const std::function<bool(uint64_t)>& stop_channel) {
  CancelOutcome o{phase_[static_cast<size_t>(id)], false};
  if (!reqs_[static_cast<size_t>(id)].alive()) return o;
  switch (o.phase) {
    case PdPhase::Prefill: o.left = p_.cancel(id, now); break;
    case PdPhase::Decode: o.left = d_.cancel(id, now); break;
    case PdPhase::Parked:
      cancel(id, now, true);
      o.left = true;
      break;
    case PdPhase::Transfer:
      // Blocks go now only if the channel stops writing now; else at its completion.
      cancel(id, now, stop_channel(ticket_[static_cast<size_t>(id)]));
      o.left = true;
      break;
    case PdPhase::None:
    case PdPhase::Gone: break;
  }
  return o;
}

uint64_t Handoff::ticket_of(ReqId id) const { return ticket_[static_cast<size_t>(id)]; }

}  // namespace tandem
