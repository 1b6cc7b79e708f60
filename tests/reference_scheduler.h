// A deliberately naive scheduler for differential testing: the same policy as
// policies/scheduler.cpp, written the obvious way. It recomputes free blocks and every
// running request's outstanding reservation for each admission candidate, keeps block
// tables in a std::map and the free list in a std::deque. Slow on purpose; shares no code
// with the real scheduler beyond the plain Request/StepPlan structs.
#pragma once
#include <algorithm>
#include <deque>
#include <map>
#include <vector>

#include "policies/plan.h"
#include "sim/request.h"

namespace tandem::testing {

struct RefConfig {
  bool static_batching = false;
  int max_num_seqs = 1, budget = 1, max_model_len = 1 << 30;
  int num_blocks = 1, block_size = 16, state_slots = -1;
  bool chunked = false;  // chunked prefill
  int max_partials = 1;  // prompts part-way at once after a step
};

struct RefSeq {
  ReqId id;
  int num_tokens, num_computed_before;
  bool samples;
  std::vector<int> blocks;
  bool operator==(const RefSeq&) const = default;
};

class ReferenceScheduler {
 public:
  ReferenceScheduler(RefConfig c, std::vector<Request>& reqs) : c_(c), reqs_(reqs) {
    for (int b = 0; b < c.num_blocks; ++b) free_.push_back(b);
  }

  static int ceil_div(long a, long b) { return int((a + b - 1) / b); }

  bool add(ReqId id) {
    Request& r = reqs_[id];
    const long life = long(r.prompt_len) + r.max_output;
    if (r.prompt_len < 1 || r.max_output < 1 || life > c_.max_model_len || ceil_div(life, c_.block_size) > c_.num_blocks ||
        (!c_.chunked && r.prompt_len > c_.budget) || c_.state_slots == 0) {
      r.status = RequestStatus::Failed;
      return false;
    }
    r.status = RequestStatus::Waiting;
    waiting_.push_back(id);
    return true;
  }

  bool cancel(ReqId id) {
    Request& r = reqs_[id];
    if (r.status == RequestStatus::Waiting) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
      r.status = RequestStatus::Cancelled;
      return true;
    }
    if (r.status != RequestStatus::Running) return false;
    if (in_flight_) {
      pending_cancel_.push_back(id);
      return false;
    }
    free_request(id);
    running_.erase(std::find(running_.begin(), running_.end(), id));
    r.status = RequestStatus::Cancelled;
    return true;
  }

  std::vector<RefSeq> schedule() {
    std::vector<RefSeq> plan;
    int budget = c_.budget;
    auto push = [&](ReqId id, int n) {
      Request& r = reqs_[id];
      grow(id, r.num_computed + n);
      plan.push_back({id, n, r.num_computed, r.num_computed + n == r.prompt_len + r.generated, tables_[id]});
      budget -= n;
    };
    // Decodes: running requests past their prompt.
    for (ReqId id : running_) {
      Request& r = reqs_[id];
      if (r.generated >= r.max_output || r.num_computed < r.prompt_len) continue;
      const int n = r.prompt_len + r.generated - r.num_computed;
      if (n <= budget) push(id, n);
    }
    // Prompts part-way: found by scanning every running request. Each prompt chunk takes at
    // most the budget's share per allowed part-way prompt.
    const int cap = std::max(1, c_.budget / c_.max_partials);
    int partial_after = 0;
    for (ReqId id : running_) {
      Request& r = reqs_[id];
      if (r.num_computed >= r.prompt_len) continue;
      const int n = std::min({r.prompt_len - r.num_computed, budget, cap});
      if (n > 0) push(id, n);
      if (r.num_computed + n < r.prompt_len) ++partial_after;
    }
    const bool may_admit = !c_.static_batching || running_.empty();
    while (may_admit && !waiting_.empty() && int(running_.size()) < c_.max_num_seqs && budget > 0) {
      const ReqId id = waiting_.front();
      Request& r = reqs_[id];
      int n = r.prompt_len;
      if (c_.chunked) n = std::min({n, budget, cap});
      if (n > budget) break;
      if (n < r.prompt_len && (!c_.chunked || partial_after >= c_.max_partials)) break;
      // Recompute everything for this candidate.
      int outstanding = 0;
      for (ReqId q : running_) outstanding += reserved_[q] - int(tables_[q].size());
      const int need = ceil_div(long(r.prompt_len) + r.max_output, c_.block_size);
      if (need > int(free_.size()) - outstanding) break;
      if (c_.state_slots >= 0 && int(running_.size()) >= c_.state_slots) break;
      waiting_.erase(waiting_.begin());
      reserved_[id] = need;
      tables_[id];
      running_.push_back(id);
      r.status = RequestStatus::Running;
      push(id, n);
      if (n < r.prompt_len) ++partial_after;
    }
    in_flight_ = !plan.empty();
    last_plan_ = plan;
    return plan;
  }

  std::vector<ReqId> complete() {
    in_flight_ = false;
    for (const RefSeq& s : last_plan_) {
      Request& r = reqs_[s.id];
      r.num_computed += s.num_tokens;
      if (s.samples) ++r.generated;
    }
    auto cancelled = [&](ReqId id) { return std::find(pending_cancel_.begin(), pending_cancel_.end(), id) != pending_cancel_.end(); };
    bool batch_done = true;
    for (ReqId id : running_) batch_done = batch_done && (reqs_[id].generated >= reqs_[id].max_output || cancelled(id));
    std::vector<ReqId> left, keep;
    for (ReqId id : running_) {
      Request& r = reqs_[id];
      const bool done = r.generated >= r.max_output;
      if (cancelled(id) || (done && (!c_.static_batching || batch_done))) {
        free_request(id);
        r.status = done ? RequestStatus::Finished : RequestStatus::Cancelled;
        left.push_back(id);
      } else {
        keep.push_back(id);
      }
    }
    running_ = keep;
    pending_cancel_.clear();
    return left;
  }

  int free_blocks() const { return int(free_.size()); }
  std::vector<int> table(ReqId id) const {
    auto it = tables_.find(id);
    return it == tables_.end() ? std::vector<int>{} : it->second;
  }
  int outstanding() const {
    int o = 0;
    for (ReqId q : running_) o += reserved_.at(q) - int(tables_.at(q).size());
    return o;
  }
  const std::vector<ReqId>& running() const { return running_; }

 private:
  void grow(ReqId id, long tokens) {
    auto& t = tables_[id];
    while (int(t.size()) < ceil_div(tokens, c_.block_size)) {
      t.push_back(free_.front());
      free_.pop_front();
    }
  }
  void free_request(ReqId id) {
    for (int b : tables_[id]) free_.push_back(b);
    tables_.erase(id);
    reserved_.erase(id);
  }

  RefConfig c_;
  std::vector<Request>& reqs_;
  std::deque<int> free_;
  std::map<ReqId, std::vector<int>> tables_;
  std::map<ReqId, int> reserved_;
  std::vector<ReqId> waiting_, running_, pending_cancel_;
  std::vector<RefSeq> last_plan_;
  bool in_flight_ = false;
};

}  // namespace tandem::testing
