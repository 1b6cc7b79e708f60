// The workload's requests section: a synthetic generator (count, arrival process, prompt and
// output length distributions) or a trace to replay, plus shared prefixes and cancellations;
// parsing and the resolved YAML. Empirical distributions are loaded here, at parse time, so a
// bad CSV is reported against the field that names it.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "sim/workload/config_sections.h"
#include "sim/base/csv.h"

namespace tandem::config_detail {
namespace {

void load_empirical(DistSpec& d, const Field& f) {
  f["path"].require_file(d.path);
  CsvFile csv(d.path);
  const size_t col = csv.column_index(d.column);
  if (col == CsvFile::npos)
    f["column"].fail(fmt::format("column '{}' not in {} (header: {})", d.column, d.path, csv.header_text()));
  std::vector<std::string> row;
  while (csv.next(row)) d.samples.push_back(csv.number(row, col, 0, kHuge));
  if (d.samples.empty()) f["path"].fail(fmt::format("{} has no rows", d.path));
}

// A bare number is a fixed value; values below `lo` are rejected. `default_column` is the
// CSV column an empirical distribution reads when the file does not name one.
// A mixture's components carry a `weight` beside their distribution: allow_weight.
DistSpec parse_dist(const Field& f, const std::string& default_column, double lo, bool allow_weight = false) {
  const auto keys = [&](std::vector<const char*> k) {
    if (allow_weight) k.push_back("weight");
    return k;
  };
  DistSpec d;
  if (f.is_scalar()) {  // a bare number: fixed
    d.kind = DistSpec::Kind::Fixed;
    d.value = f.as_double(lo, kHuge);
    return d;
  }
  if (!f.is_map()) f.fail("expected a number or a distribution mapping {dist: ...}");
  const std::string kind = f["dist"].as_string();
  if (kind == "fixed") {
    f.expect_map(keys({"dist", "value"}));
    d.kind = DistSpec::Kind::Fixed;
    d.value = f["value"].as_double(lo, kHuge);
  } else if (kind == "uniform") {
    f.expect_map(keys({"dist", "min", "max"}));
    d.kind = DistSpec::Kind::Uniform;
    d.min = f["min"].as_double(lo, kHuge);
    d.max = f["max"].as_double(lo, kHuge);
    if (d.max < d.min) f["max"].fail("must be >= min");
  } else if (kind == "lognormal") {
    f.expect_map(keys({"dist", "median", "mean", "sigma", "min", "max"}));
    d.kind = DistSpec::Kind::Lognormal;
    d.sigma = f["sigma"].as_double(0, 10);
    if (f.has("median") == f.has("mean")) f.fail("lognormal needs exactly one of median or mean");
    d.median = f.has("median") ? f["median"].as_double(1e-9, kHuge)
                               : f["mean"].as_double(1e-9, kHuge) / std::exp(d.sigma * d.sigma / 2);
    d.min = f.get_double("min", lo, lo, kHuge);
    d.max = f.get_double("max", kHuge, lo, kHuge);
    if (d.max < d.min) f["max"].fail("must be >= min");
  } else if (kind == "mixture") {
    f.expect_map(keys({"dist", "components"}));
    d.kind = DistSpec::Kind::Mixture;
    for (const Field& c : f["components"].items()) {
      if (!c.is_map()) c.fail("expected {weight: W, dist: ...}");
      const double w = c["weight"].as_double(0, kHuge);
      d.components.push_back(DistSpec::Component{w, parse_dist(c, default_column, lo, true)});
    }
    if (d.components.empty()) f["components"].fail("needs at least one component");
    double total = 0;
    for (auto& c : d.components) total += c.weight;
    if (total <= 0) f["components"].fail("weights must not all be zero");
  } else if (kind == "empirical") {
    f.expect_map(keys({"dist", "path", "column"}));
    d.kind = DistSpec::Kind::Empirical;
    d.path = f["path"].as_path();
    d.column = f.get_string("column", default_column);
    load_empirical(d, f);
  } else {
    f["dist"].fail(
        fmt::format("unknown distribution '{}' (known: fixed, uniform, lognormal, mixture, empirical)", kind));
  }
  return d;
}

// Every distribution prints as a mapping (a bare fixed number too); a lognormal given by its
// mean prints its median, and an unbounded max is left out.
YAML::Node dist_yaml(const DistSpec& d) {
  YAML::Node n;
  switch (d.kind) {
    case DistSpec::Kind::Fixed:
      n["dist"] = "fixed";
      n["value"] = yaml_number(d.value);
      break;
    case DistSpec::Kind::Uniform:
      n["dist"] = "uniform";
      n["min"] = yaml_number(d.min);
      n["max"] = yaml_number(d.max);
      break;
    case DistSpec::Kind::Lognormal:
      n["dist"] = "lognormal";
      n["median"] = yaml_number(d.median);
      n["sigma"] = yaml_number(d.sigma);
      n["min"] = yaml_number(d.min);
      if (d.max < 1e18) n["max"] = yaml_number(d.max);
      break;
    case DistSpec::Kind::Mixture:
      n["dist"] = "mixture";
      for (const auto& c : d.components) {
        YAML::Node cn = dist_yaml(c.dist);
        cn["weight"] = yaml_number(c.weight);
        n["components"].push_back(cn);
      }
      break;
    case DistSpec::Kind::Empirical:
      n["dist"] = "empirical";
      n["path"] = yaml_path(d.path);
      n["column"] = d.column;
      break;
  }
  return n;
}

ArrivalSpec parse_arrival(const Field& f) {
  ArrivalSpec a;
  const std::string p = f["process"].as_string();
  if (p == "poisson") {
    f.expect_map({"process", "rate", "normalize"});
    a.kind = ArrivalSpec::Kind::Poisson;
    a.rate = f["rate"].as_double(1e-9, 1e9);
    if (f.has("normalize")) a.normalize = f["normalize"].as_bool();
  } else if (p == "gamma") {
    f.expect_map({"process", "rate", "cv", "normalize"});
    a.kind = ArrivalSpec::Kind::Gamma;
    a.rate = f["rate"].as_double(1e-9, 1e9);
    a.cv = f["cv"].as_double(1e-3, 1e3);
    if (f.has("normalize")) a.normalize = f["normalize"].as_bool();
  } else if (p == "constant") {
    f.expect_map({"process", "rate"});
    a.kind = ArrivalSpec::Kind::Constant;
    a.rate = f["rate"].as_double(1e-9, 1e9);
  } else if (p == "burst") {
    f.expect_map({"process", "size", "interval_s"});
    a.kind = ArrivalSpec::Kind::Burst;
    a.burst_size = f.get_int("size", 0, 1, INT64_MAX);
    a.interval_s = f.get_double("interval_s", 0, 0, 1e9);
    if (a.burst_size > 0 && !f.has("interval_s"))
      f["interval_s"].fail("missing (bursts of a given size need the time between them)");
    if (a.burst_size == 0 && f.has("interval_s")) f["size"].fail("missing (interval_s means bursts of a given size)");
  } else {
    f["process"].fail(fmt::format("unknown arrival process '{}' (known: poisson, gamma, constant, burst)", p));
  }
  return a;
}

TraceSpec parse_trace(const Field& f) {
  f.expect_map({"format", "path", "time_scale", "rate_scale", "start_s", "duration_s", "limit", "hash_block_size"});
  TraceSpec t;
  const std::string fmt_name = f["format"].as_string();
  if (fmt_name == "azure")
    t.format = TraceSpec::Format::Azure;
  else if (fmt_name == "mooncake")
    t.format = TraceSpec::Format::Mooncake;
  else if (fmt_name == "vidur")
    t.format = TraceSpec::Format::Vidur;
  else
    f["format"].fail(fmt::format("unknown trace format '{}' (known: azure, mooncake, vidur)", fmt_name));
  t.path = f["path"].as_path();
  f["path"].require_file(t.path);
  t.time_scale = f.get_double("time_scale", 1.0, 1e-9, 1e9);
  t.rate_scale = f.get_double("rate_scale", 1.0, 1e-9, 1e9);
  t.start_s = f.get_double("start_s", 0, 0, 1e12);
  t.duration_s = f.get_double("duration_s", 0, 0, 1e12);
  t.limit = f.get_int("limit", 0, 0, INT64_MAX);
  t.hash_block_size = int32_t(f.get_int("hash_block_size", 512, 1, 1 << 20));
  return t;
}

CancelSpec parse_cancel(const Field& f) {
  CancelSpec c;
  f.expect_map({"at", "fraction", "after_s"});
  if (f.has("at")) {
    for (const Field& e : f["at"].items()) {
      e.expect_map({"request", "at_s", "phase"});
      if (e.has("phase") == e.has("at_s"))
        e.fail("give at_s (a time) or phase (a point of a 1P1D handoff), one of them");
      if (e.has("at_s")) {
        c.explicit_cancels.push_back({e["request"].as_int(0, INT64_MAX), e["at_s"].as_double(0, 1e12)});
        continue;
      }
      const std::string phase = e["phase"].as_string();
      if (std::find_if(std::begin(kCancelPhases), std::end(kCancelPhases), [&](const char* p) { return phase == p; }) ==
          std::end(kCancelPhases))
        e["phase"].fail(fmt::format("unknown phase '{}' (known: prefill, parked, transfer, received, decode)", phase));
      c.phase_cancels.push_back({e["request"].as_int(0, INT64_MAX), phase});
    }
  }
  if (f.has("fraction")) {
    c.fraction = f["fraction"].as_double(0, 1);
    c.after_s = parse_dist(f["after_s"], "", 0);
  } else if (f.has("after_s")) {
    f["fraction"].fail("missing (after_s needs the share of requests to cancel)");
  }
  return c;
}

}  // namespace

RequestsSpec parse_requests(const Field& f) {
  RequestsSpec r;
  if (!f.present()) f.fail("missing (a workload needs requests: a synthetic generator or a trace)");
  f.expect_map({"count", "arrival", "prompt_len", "output_len", "shared_prefix", "cancel", "trace"});
  if (f.has("trace")) {
    for (const char* k : {"count", "arrival", "prompt_len", "output_len"})
      if (f.has(k)) f[k].fail("not allowed with trace (the trace gives arrivals and lengths)");
    r.trace = parse_trace(f["trace"]);
  } else {
    r.count = f["count"].as_int(1, 20'000'000);  // 20M requests: about 2.5 GB of request table
    r.arrival = parse_arrival(f["arrival"]);
    r.prompt_len = parse_dist(f["prompt_len"], "num_prefill_tokens", 1);
    r.output_len = parse_dist(f["output_len"], "num_decode_tokens", 1);
  }
  if (f.has("shared_prefix")) {
    const Field s = f["shared_prefix"];
    s.expect_map({"groups", "prefix_len", "fraction", "prepend"});
    r.shared_prefix.groups = int32_t(s["groups"].as_int(1, 10'000'000));
    r.shared_prefix.prefix_len = parse_dist(s["prefix_len"], "", 1);
    r.shared_prefix.fraction = s.get_double("fraction", 1.0, 0, 1);
    if (s.has("prepend")) r.shared_prefix.prepend = s["prepend"].as_bool();
    // A Mooncake trace's hash_ids fix the token ids of its leading blocks; a prefix put in
    // front would shift them off their blocks.
    if (r.shared_prefix.prepend && r.trace && r.trace->format == TraceSpec::Format::Mooncake)
      s["prepend"].fail("not allowed with a mooncake trace (its hash_ids already decide the leading blocks)");
  }
  if (f.has("cancel")) {
    r.cancel = parse_cancel(f["cancel"]);
    // A trace's request count is known only once it is read; the generator's is known now.
    if (!r.trace && f["cancel"].has("at"))
      for (const Field& e : f["cancel"]["at"].items())
        if (const int64_t id = e["request"].as_int(0, INT64_MAX); id >= r.count)
          e["request"].fail(fmt::format("{} is beyond the last request ({})", id, r.count - 1));
  }
  return r;
}

YAML::Node requests_yaml(const RequestsSpec& r) {
  YAML::Node n;
  if (r.trace) {
    const TraceSpec& t = *r.trace;
    static const char* fmts[] = {"azure", "mooncake", "vidur"};
    n["trace"]["format"] = fmts[int(t.format)];
    n["trace"]["path"] = yaml_path(t.path);
    n["trace"]["time_scale"] = yaml_number(t.time_scale);
    n["trace"]["rate_scale"] = yaml_number(t.rate_scale);
    n["trace"]["start_s"] = yaml_number(t.start_s);
    n["trace"]["duration_s"] = yaml_number(t.duration_s);
    n["trace"]["limit"] = t.limit;
    n["trace"]["hash_block_size"] = t.hash_block_size;
  } else {
    static const char* procs[] = {"poisson", "gamma", "constant", "burst"};
    n["count"] = r.count;
    n["arrival"]["process"] = procs[int(r.arrival.kind)];
    if (r.arrival.kind == ArrivalSpec::Kind::Burst) {
      if (r.arrival.burst_size > 0) {  // size 0: all requests at once, no interval
        n["arrival"]["size"] = r.arrival.burst_size;
        n["arrival"]["interval_s"] = yaml_number(r.arrival.interval_s);
      }
    } else {
      n["arrival"]["rate"] = yaml_number(r.arrival.rate);
      if (r.arrival.kind == ArrivalSpec::Kind::Gamma) n["arrival"]["cv"] = yaml_number(r.arrival.cv);
      if (r.arrival.normalize) n["arrival"]["normalize"] = true;  // only when on: default workloads resolve as before
    }
    n["prompt_len"] = dist_yaml(r.prompt_len);
    n["output_len"] = dist_yaml(r.output_len);
  }
  if (r.shared_prefix.groups > 0) {
    n["shared_prefix"]["groups"] = r.shared_prefix.groups;
    n["shared_prefix"]["prefix_len"] = dist_yaml(r.shared_prefix.prefix_len);
    n["shared_prefix"]["fraction"] = yaml_number(r.shared_prefix.fraction);
    n["shared_prefix"]["prepend"] = r.shared_prefix.prepend;
  }
  if (!r.cancel.explicit_cancels.empty() || !r.cancel.phase_cancels.empty() || r.cancel.fraction > 0) {
    for (const auto& c : r.cancel.explicit_cancels) {
      YAML::Node cn;
      cn["request"] = c.request;
      cn["at_s"] = yaml_number(c.at_s);
      n["cancel"]["at"].push_back(cn);
    }
    for (const auto& c : r.cancel.phase_cancels) {
      YAML::Node cn;
      cn["request"] = c.request;
      cn["phase"] = c.phase;
      n["cancel"]["at"].push_back(cn);
    }
    if (r.cancel.fraction > 0) {
      n["cancel"]["fraction"] = yaml_number(r.cancel.fraction);
      n["cancel"]["after_s"] = dist_yaml(r.cancel.after_s);
    }
  }
  return n;
}

}  // namespace tandem::config_detail
