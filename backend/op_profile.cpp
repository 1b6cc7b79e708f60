#include "backend/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace tandem {

double Curve::at(double v) const {
  if (x.empty()) return 0;
  if (x.size() == 1) return std::max(0.0, y[0]);
  size_t i = size_t(std::upper_bound(x.begin(), x.end(), v) - x.begin());
  i = std::clamp<size_t>(i, 1, x.size() - 1);  // segment [i-1, i]; the end segments extrapolate
  const double t = (v - x[i - 1]) / (x[i] - x[i - 1]);
  return std::max(0.0, y[i - 1] + t * (y[i] - y[i - 1]));
}

namespace {
// Knots from a map x -> y (sorted, unique by construction).
Curve curve_of(const std::map<double, double>& pts) {
  Curve c;
  for (const auto& [x, y] : pts) {
    c.x.push_back(x);
    c.y.push_back(y);
  }
  return c;
}

// The value at the knot nearest to x on a log scale (for a shape the grid could not measure).
double nearest(const std::map<double, double>& pts, double x) {
  double best = 0, dist = INFINITY;
  for (const auto& [k, v] : pts)
    if (const double d = std::fabs(std::log(k / x)); d < dist) {
      dist = d;
      best = v;
    }
  return best;
}
}  // namespace

void derive_curves(OperatorProfile& p) {
  // prefill: time at context 0 and the slope in context, per chunk size.
  std::map<double, double> p0, slope;
  std::map<double, std::pair<double, double>> far;  // n -> (largest context, its time)
  std::map<double, double> multi0, multi1;
  std::map<double, std::map<double, double>> dec;  // seqs -> context -> seconds
  std::map<double, double> ar;
  for (const ProfileStep& s : p.raw) {
    if (s.idle) continue;
    if (s.kind == "allreduce") ar[s.tokens] = s.seconds;
    if (s.kind == "prefill") {
      if (s.context == 0)
        p0[s.tokens] = s.seconds;
      else if (s.context > far[s.tokens].first)
        far[s.tokens] = {s.context, s.seconds};
    } else if (s.kind == "multi") {
      (s.sampled ? multi1 : multi0)[s.seqs] = s.seconds;
    } else if (s.kind == "decode") {
      dec[s.seqs][s.context] = s.seconds;
    }
  }
  if (p0.size() < 2) throw std::invalid_argument("needs prefill steps at context 0 for at least two chunk sizes");
  for (const auto& [n, cf] : far)
    if (p0.count(n) && cf.first > 0) slope[n] = std::max(0.0, (cf.second - p0[n]) / (n * cf.first));
  if (slope.empty()) throw std::invalid_argument("needs prefill steps over a cached context (context > 0)");
  std::map<double, double> lin, attn;
  for (const auto& [n, t] : p0) {
    const double a = slope.count(n) ? slope[n] : nearest(slope, n);
    attn[n] = a;
    lin[n] = std::max(0.0, t - a * n * (n + 1) / 2);  // the chunk's own causal pairs
  }
  p.linear = curve_of(lin);
  p.prefill_attn = curve_of(attn);
  std::map<double, double> lm, extra;
  for (const auto& [r, t1] : multi1) {
    if (!multi0.count(r)) continue;
    const double t0 = multi0[r];
    lm[r] = std::max(0.0, t1 - t0);
    // What R two-token sequences cost beyond the same tokens as one chunk of linear work and
    // their own attention (3 pairs each).
    extra[r] = std::max(0.0, t0 - p.linear.at(2 * r) - p.prefill_attn.at(2) * 3 * r);
  }
  if (lm.empty())
    throw std::invalid_argument("needs multi steps both sampled and not sampled, for the same sequence count");
  // `linear` already holds one sequence's share: the curve is the cost of the others, zero at
  // the smallest count (two measurements of the same shape differ by noise, not by overhead).
  const double first = extra.begin()->second;
  for (auto& [r, v] : extra) v = std::max(0.0, v - first);
  p.lm_head = curve_of(lm);
  p.seq_overhead = curve_of(extra);
  p.allreduce = curve_of(ar);
  if (dec.empty()) throw std::invalid_argument("needs decode steps");
  p.decode_seqs.clear();
  p.decode.clear();
  for (const auto& [s, by_ctx] : dec) {
    p.decode_seqs.push_back(s);
    p.decode.push_back(curve_of(by_ctx));
  }
  derive_mixed_factor(p);
}

double decode_seconds(const OperatorProfile& p, double seqs, double context) {
  const auto& k = p.decode_seqs;
  if (k.empty()) return 0;
  if (k.size() == 1) return p.decode[0].at(context);
  size_t i = size_t(std::upper_bound(k.begin(), k.end(), seqs) - k.begin());
  i = std::clamp<size_t>(i, 1, k.size() - 1);
  const double a = p.decode[i - 1].at(context), b = p.decode[i].at(context);
  const double t = (seqs - k[i - 1]) / (k[i] - k[i - 1]);
  return std::max(0.0, a + t * (b - a));
}

}  // namespace tandem
