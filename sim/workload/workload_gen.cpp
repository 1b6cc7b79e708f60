#include "sim/workload/workload_gen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "sim/workload/traces.h"

namespace tandem {

namespace {

// Independent streams per aspect, so that changing (say) the output lengths leaves the
// arrival times of the same seed untouched.
enum Stream : uint64_t { kArrivals = 1, kPrompt, kOutput, kPrefix, kCancel, kTokens };
Rng stream(uint64_t seed, Stream s) { return Rng(hash_combine(seed, s)); }

double draw(const DistSpec& d, Rng& rng) {
  switch (d.kind) {
    case DistSpec::Kind::Fixed: return d.value;
    case DistSpec::Kind::Uniform: return d.min + (d.max - d.min) * rng.uniform();
    case DistSpec::Kind::Lognormal: return std::clamp(d.median * std::exp(d.sigma * rng.normal()), d.min, d.max);
    case DistSpec::Kind::Mixture: {
      double total = 0;
      for (const auto& c : d.components) total += c.weight;
      double u = rng.uniform() * total;
      for (const auto& c : d.components) {
        if (u < c.weight) return draw(c.dist, rng);
        u -= c.weight;
      }
      return draw(d.components.back().dist, rng);
    }
    case DistSpec::Kind::Empirical:
      return d.samples[static_cast<size_t>(rng.uniform_int(0, int64_t(d.samples.size()) - 1))];
  }
  return 0;
}

// Lengths beyond int32 are clamped there (such a request then fails at arrival with
// exceeds_max_model_len), never wrapped.
int32_t as_length(double v) { return static_cast<int32_t>(std::llround(std::clamp(v, 0.0, double(INT32_MAX)))); }

// Seconds to the run's clock, refusing times past the simulator's range (they would
// overflow integer nanoseconds and come out negative).
Time checked_time(double s, const Workload& w, const char* what) {
  if (!(s >= 0 && s <= kMaxSeconds))
    throw InputError(fmt::format("{}: {} at {:.6g} s is beyond the simulator's time range (0 to {:.0g} s)", w.path,
                                 what, s, kMaxSeconds));
  return from_seconds(s);
}

void synthetic(const Workload& w, RequestSet& set) {
  const RequestsSpec& rs = w.requests;
  const ArrivalSpec& a = rs.arrival;
  Rng arr = stream(w.seed, kArrivals), pr = stream(w.seed, kPrompt), out = stream(w.seed, kOutput);
  // Lengths drawn from the same file are drawn as pairs (same row): real prompts and
  // outputs are correlated.
  const bool paired = rs.prompt_len.kind == DistSpec::Kind::Empirical &&
                      rs.output_len.kind == DistSpec::Kind::Empirical && rs.prompt_len.path == rs.output_len.path;
  set.requests.resize(static_cast<size_t>(rs.count));
  // Arrival times first (in seconds), so that `normalize` can scale them; lengths after, from
  // their own streams: normalizing moves arrivals only.
  std::vector<double> at(static_cast<size_t>(rs.count));
  double t = 0;
  const double gamma_shape = 1.0 / (a.cv * a.cv);
  for (int64_t i = 0; i < rs.count; ++i) {
    switch (a.kind) {
      case ArrivalSpec::Kind::Poisson: t += arr.exponential(a.rate); break;
      case ArrivalSpec::Kind::Gamma: t += arr.gamma(gamma_shape) / (a.rate * gamma_shape); break;
      case ArrivalSpec::Kind::Constant: t = double(i) / a.rate; break;
      case ArrivalSpec::Kind::Burst: t = a.burst_size > 0 ? double(i / a.burst_size) * a.interval_s : 0.0; break;
    }
    at[static_cast<size_t>(i)] = t;
  }
  // As vLLM's bench serve (get_request): the cumulative gaps rescaled so that the last arrival is
  // at count / rate, which makes the offered rate (count over the last arrival) exactly `rate`.
  const bool drawn = a.kind == ArrivalSpec::Kind::Poisson || a.kind == ArrivalSpec::Kind::Gamma;
  if (a.normalize && drawn && rs.count > 0 && at.back() > 0) {
    const double factor = (double(rs.count) / a.rate) / at.back();
    for (double& x : at) x *= factor;
  }
  for (int64_t i = 0; i < rs.count; ++i) {
    Request& r = set.requests[static_cast<size_t>(i)];
    r.arrival = checked_time(at[static_cast<size_t>(i)], w, "an arrival (requests.arrival)");
    if (paired) {
      const size_t k = static_cast<size_t>(pr.uniform_int(0, int64_t(rs.prompt_len.samples.size()) - 1));
      r.prompt_len = as_length(rs.prompt_len.samples[k]);
      r.max_output = as_length(rs.output_len.samples[k]);
    } else {
      r.prompt_len = as_length(draw(rs.prompt_len, pr));
      r.max_output = as_length(draw(rs.output_len, out));
    }
  }
}

void replay(const Workload& w, RequestSet& set) {
  const TraceSpec& t = *w.requests.trace;
  std::vector<int64_t> pool;
  std::vector<Token> token_pool;
  std::vector<TraceRow> rows = read_trace(t, pool, token_pool);
  // Traces are sorted by time; a stable sort keeps file order for ties if one is not.
  std::stable_sort(rows.begin(), rows.end(), [](const TraceRow& x, const TraceRow& y) { return x.t_s < y.t_s; });
  const double end = t.duration_s > 0 ? t.start_s + t.duration_s : INFINITY;
  for (const TraceRow& row : rows) {
    if (row.t_s < t.start_s || row.t_s >= end) continue;
    if (t.limit > 0 && int64_t(set.requests.size()) >= t.limit) break;
    Request r;
    r.arrival = checked_time((row.t_s - t.start_s) * t.time_scale / t.rate_scale, w, "a scaled trace arrival");
    r.prompt_len = static_cast<int32_t>(std::min<int64_t>(row.prompt_len, INT32_MAX));
    r.max_output = static_cast<int32_t>(std::min<int64_t>(row.output_len, INT32_MAX));
    r.hash_ids_begin = static_cast<uint32_t>(set.hash_ids.size());
    r.hash_ids_count = row.hash_count;
    set.hash_ids.insert(set.hash_ids.end(), pool.begin() + row.hash_begin,
                        pool.begin() + row.hash_begin + row.hash_count);
    if (row.has_tokens) {
      const auto ids = std::span(token_pool).subspan(row.tokens_begin, size_t(row.prompt_len));
      for (const Token id : ids)
        if (id >= w.model.vocab)
          throw InputError(
              fmt::format("{}:{}: column 'prompt_token_ids': token id {} is not below the model's vocab "
                          "({}, model.vocab)",
                          t.path, row.line, id, w.model.vocab));
      r.id = ReqId(set.prompt_token_begin.size());  // file order, until generate_requests numbers by arrival
      set.prompt_token_begin.push_back(set.prompt_token_pool.size());
      set.prompt_token_pool.insert(set.prompt_token_pool.end(), ids.begin(), ids.end());
    }
    set.requests.push_back(r);
  }
  if (set.has_given_prompts() && w.requests.shared_prefix.groups > 0)
    throw InputError(
        fmt::format("{}: field 'requests.shared_prefix': not with a trace that gives the prompt token ids "
                    "({}'s prompt_token_ids column)",
                    w.path, t.path));
  if (t.format == TraceSpec::Format::Mooncake) set.hash_block_size = t.hash_block_size;
  if (set.requests.empty())
    throw InputError(fmt::format("{}: the trace window (start_s {}, duration_s {}) holds no request", t.path, t.start_s,
                                 t.duration_s));
}

void assign_prefix_groups(const Workload& w, RequestSet& set) {
  const SharedPrefixSpec& sp = w.requests.shared_prefix;
  if (sp.groups <= 0) return;
  Rng rng = stream(w.seed, kPrefix);
  std::vector<int32_t> group_len(static_cast<size_t>(sp.groups));
  for (auto& g : group_len) g = std::max(1, as_length(draw(sp.prefix_len, rng)));
  for (Request& r : set.requests) {
    if (rng.uniform() >= sp.fraction) continue;
    r.prefix_group = static_cast<int32_t>(rng.uniform_int(0, sp.groups - 1));
    const int32_t g = group_len[static_cast<size_t>(r.prefix_group)];
    if (sp.prepend) {  // clamped, never wrapped: such a request fails at arrival (exceeds_max_model_len)
      r.prompt_len = static_cast<int32_t>(std::min<int64_t>(int64_t{g} + r.prompt_len, INT32_MAX));
      r.prefix_len = g;
    } else {
      r.prefix_len = std::min(g, r.prompt_len);
    }
  }
}

void assign_cancellations(const Workload& w, RequestSet& set) {
  const CancelSpec& c = w.requests.cancel;
  const int64_t n = int64_t(set.requests.size());
  for (size_t i = 0; i < c.explicit_cancels.size(); ++i) {
    const auto& e = c.explicit_cancels[i];
    if (e.request >= n)
      throw InputError(fmt::format("{}: field 'requests.cancel.at[{}].request': {} is beyond the last request ({})",
                                   w.path, i, e.request, n - 1));
    Request& r = set.requests[static_cast<size_t>(e.request)];
    r.cancel_at = std::min(r.cancel_at, checked_time(e.at_s, w, "a cancellation (requests.cancel.at)"));
  }
  for (size_t i = 0; i < c.phase_cancels.size(); ++i)  // placed by the engine (Engine::cancel_at_phase)
    if (c.phase_cancels[i].request >= n)
      throw InputError(
          fmt::format("{}: a cancel at a phase (requests.cancel.at): request {} is beyond the last request ({})",
                      w.path, c.phase_cancels[i].request, n - 1));
  if (c.fraction <= 0) return;
  Rng rng = stream(w.seed, kCancel);
  for (Request& r : set.requests) {
    if (rng.uniform() >= c.fraction) continue;
    r.cancel_at = std::min(r.cancel_at, checked_time(to_seconds(r.arrival) + std::max(0.0, draw(c.after_s, rng)), w,
                                                     "a cancellation (arrival + requests.cancel.after_s)"));
  }
}

}  // namespace

RequestSet generate_requests(const Workload& w) {
  RequestSet set;
  if (w.requests.trace)
    replay(w, set);
  else
    synthetic(w, set);
  // Arrival order defines ids; ties keep generation order.
  std::stable_sort(set.requests.begin(), set.requests.end(),
                   [](const Request& x, const Request& y) { return x.arrival < y.arrival; });
  if (set.has_given_prompts()) {  // the given ids follow their requests into arrival order
    std::vector<size_t> begin(set.requests.size());
    for (size_t i = 0; i < set.requests.size(); ++i) begin[i] = set.prompt_token_begin[size_t(set.requests[i].id)];
    set.prompt_token_begin = std::move(begin);
  }
  for (size_t i = 0; i < set.requests.size(); ++i) set.requests[i].id = static_cast<ReqId>(i);
  assign_prefix_groups(w, set);
  assign_cancellations(w, set);
  return set;
}

Token PromptTokens::at(const Request& r, int32_t pos) const {
  Token t;
  fill(r, pos, 1, &t);
  return t;
}

// Three sources, in this precedence: a Mooncake hash id's block (ids repeat across requests:
// equal ids, equal tokens), a shared-prefix group's leading tokens, the request's own tokens.
// Token = mix(key ^ mix(offset)) % vocab, where the key names the source and only the offset
// changes along a run.
void PromptTokens::describe(const Request& r, int32_t start, int32_t count, std::vector<Run>& out) const {
  out.clear();
  const int32_t end = start + count;
  const int32_t hb = set_.hash_block_size;
  const int64_t hashed_end = hb > 0 ? int64_t(r.hash_ids_count) * hb : 0;
  int32_t pos = start;
  while (pos < end) {
    uint64_t key;
    int32_t run_end, offset0;
    bool own = false;
    if (pos < hashed_end) {
      const int32_t k = pos / hb;
      key = hash_combine(seed_ ^ 0x6d6f6f6eULL, uint64_t(set_.hash_ids[r.hash_ids_begin + uint32_t(k)]));
      run_end = static_cast<int32_t>(std::min<int64_t>(end, int64_t(k + 1) * hb));
      offset0 = k * hb;  // the offset is the position within the hash id's block
    } else if (r.prefix_group >= 0 && pos < r.prefix_len) {
      key = hash_combine(seed_ ^ 0x67726f7570ULL, uint64_t(r.prefix_group));
      run_end = std::min(end, r.prefix_len);
      offset0 = 0;
    } else {
      key = hash_combine(seed_ ^ 0x72657175ULL, uint64_t(r.id));
      run_end = end;
      offset0 = 0;
      own = true;
    }
    out.push_back({key, pos - offset0, run_end - pos, own});
    pos = run_end;
  }
}

void PromptTokens::fill(const Request& r, int32_t start, int32_t count, Token* out) const {
  thread_local std::vector<Run> runs;
  describe(r, start, count, runs);
  for (const Run& run : runs)
    for (int32_t o = run.first; o < run.first + run.length; ++o) *out++ = reduce(mix64(run.key ^ mix64(uint64_t(o))));
}

void PromptTokens::fill(const Request& r, std::vector<Token>& out) const {
  out.resize(static_cast<size_t>(r.prompt_len));
  fill(r, 0, r.prompt_len, out.data());
}

}  // namespace tandem
