#include "sim/commands/compare.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/json_strict.h"
#include "sim/workload/config.h"
#include "sim/base/csv.h"
#include "sim/outputs/outputs_schema.h"

namespace tandem {

namespace {
// The node at a dotted path, whatever its type; nullptr where absent.
const nlohmann::json* lookup(const nlohmann::json& j, const std::string& dotted) { return json_at_path(j, dotted); }

nlohmann::json load_summary(const std::string& dir) {
  const std::string path = dir + "/summary.json";
  std::error_code ec;  // checked before opening: a FIFO would block the open
  if (!std::filesystem::exists(path, ec))
    throw InputError(fmt::format("{}: cannot open (is '{}' a run folder written with --out?)", path, dir));
  require_regular_file(path);
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open (is '{}' a run folder written with --out?)", path, dir));
  nlohmann::json j;
  try {
    std::stringstream ss;
    ss << in.rdbuf();
    j = parse_json_strict(ss.str());
  } catch (const JsonDuplicateKey& e) {
    throw InputError(fmt::format("{}: key '{}' appears twice in one object", path, e.key));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  } catch (const std::ios_base::failure& e) {
    throw InputError(fmt::format("{}: cannot read: {}", path, e.what()));
  }
  if (!j.is_object())
    throw InputError(fmt::format("{}: expected a JSON object (a summary.json written by tandem run --out)", path));
  // The stable metrics (README, Outputs) must be there, as numbers. (kv_cache.mean_util and
  // peak_util are a one-instance run's; several instances give theirs per instance.)
  std::vector<std::string> stable;
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"mean", "p50", "p90", "p99", "count"}) stable.push_back(fmt::format("{}.{}", m, p));
  for (const char* k : {"throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
                        "requests.total", "requests.finished", "requests.failed", "requests.cancelled", "jitter_ms",
                        "prefix_cache.hit_rate", "steps", "makespan_s", "sim_s", "wall_s"})
    stable.push_back(k);
  for (const auto& k : stable) {
    const nlohmann::json* v = lookup(j, k);
    if (!v)
      throw InputError(
          fmt::format("{}: field '{}': missing (not a summary.json written by tandem run --out)", path, k));
    if (!v->is_number()) throw InputError(fmt::format("{}: field '{}': expected a number, got {}", path, k, v->dump()));
  }
  return j;
}

// A run's finished requests from its requests.csv: id -> (ttft_ms, tpot_ms, e2e_ms); empty
// cells (tpot of a one-token request) are NaN. Empty map if the file is absent.
struct Latencies {
  double ttft, tpot, e2e;
};
std::map<int64_t, Latencies> finished_requests(const std::string& dir) {
  std::map<int64_t, Latencies> out;
  const std::string path = dir + "/requests.csv";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return out;
  CsvFile csv(path);
  const size_t id = csv.column_index("id"), status = csv.column_index("status"), ttft = csv.column_index("ttft_ms"),
               tpot = csv.column_index("tpot_ms"), e2e = csv.column_index("e2e_ms");
  if (id == CsvFile::npos || status == CsvFile::npos || ttft == CsvFile::npos || tpot == CsvFile::npos ||
      e2e == CsvFile::npos)
    return out;
  std::vector<std::string> row;
  const auto cell = [&](size_t c) { return row[c].empty() ? NAN : csv.number(row, c, 0, 1e300); };
  while (csv.next(row)) {
    if (row.size() <= std::max({id, status, ttft, tpot, e2e}) || row[status] != "finished") continue;
    out[int64_t(csv.number(row, id, 0, 9e15))] = {cell(ttft), cell(tpot), cell(e2e)};
  }
  return out;
}

struct Stats {
  double mean, p50, p90, p99;
};
Stats stats_of(std::vector<double> v) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  if (v.empty()) return {NAN, NAN, NAN, NAN};
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))]; };
  double sum = 0;
  for (double x : v) sum += x;
  return {sum / double(v.size()), at(0.5), at(0.9), at(0.99)};
}

// Notes before the table: what makes the two runs' figures not directly comparable. When they
// finished different requests, the latency percentiles are also given over the requests both
// finished (from requests.csv), so that the comparison cannot mislead.
void print_comparability_notes(const nlohmann::json& a, const nlohmann::json& b, const std::string& dir_a,
                               const std::string& dir_b, std::ostream& os) {
  const auto str = [](const nlohmann::json& j, const char* k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?");
  };
  const auto num = [](const nlohmann::json& j, const std::string& k) {
    const nlohmann::json* v = lookup(j, k);
    return v && v->is_number() ? v->get<double>() : NAN;
  };
  if (str(a, "workload") != str(b, "workload"))
    fmt::print(os, "note: different workloads: A is '{}', B is '{}'\n", str(a, "workload"), str(b, "workload"));
  else if (num(a, "requests.total") != num(b, "requests.total"))
    fmt::print(os, "note: different request tables: A has {} requests, B has {}\n", num(a, "requests.total"),
               num(b, "requests.total"));
  // Cancelled requests are neither finished nor failed: the note names all three (a summary.json
  // from before cancels has no count, read as 0).
  const auto cancelled = [&](const nlohmann::json& j) {
    const double c = num(j, "requests.cancelled");
    return std::isnan(c) ? 0.0 : c;
  };
  if (num(a, "requests.finished") == num(b, "requests.finished") &&
      num(a, "requests.failed") == num(b, "requests.failed") && cancelled(a) == cancelled(b))
    return;
  fmt::print(os,
             "note: A finished {} requests ({} failed, {} cancelled), B finished {} ({} failed, {} cancelled): the "
             "latency figures below are over different request sets\n",
             num(a, "requests.finished"), num(a, "requests.failed"), cancelled(a), num(b, "requests.finished"),
             num(b, "requests.failed"), cancelled(b));
  const auto ra = finished_requests(dir_a), rb = finished_requests(dir_b);
  std::vector<double> ta, tb, pa, pb, ea, eb;
  for (const auto& [id, x] : ra)
    if (auto it = rb.find(id); it != rb.end()) {
      ta.push_back(x.ttft), tb.push_back(it->second.ttft);
      pa.push_back(x.tpot), pb.push_back(it->second.tpot);
      ea.push_back(x.e2e), eb.push_back(it->second.e2e);
    }
  if (ta.empty()) {
    fmt::print(os, "note: no request finished in both runs (or a requests.csv is missing)\n");
    return;
  }
  fmt::print(os, "over the {} requests both finished:\n", ta.size());
  fmt::print(os, "{:<34}{:>14}{:>14}{:>12}\n", "metric", "A", "B", "(B-A)/A");
  for (const auto& [name, va, vb] :
       {std::tuple{"ttft_ms", &ta, &tb}, std::tuple{"tpot_ms", &pa, &pb}, std::tuple{"e2e_ms", &ea, &eb}}) {
    const Stats x = stats_of(*va), y = stats_of(*vb);
    for (const auto& [p, xv, yv] : {std::tuple{"mean", x.mean, y.mean}, std::tuple{"p50", x.p50, y.p50},
                                    std::tuple{"p90", x.p90, y.p90}, std::tuple{"p99", x.p99, y.p99}}) {
      const std::string rel = xv != 0 && !std::isnan(xv) && !std::isnan(yv)
                                  ? fmt::format("{:+.1f}%", 100.0 * (yv - xv) / std::fabs(xv))
                                  : "-";
      fmt::print(os, "{:<34}{:>14.4g}{:>14.4g}{:>12}\n", fmt::format("common.{}.{}", name, p), xv, yv, rel);
    }
  }
  fmt::print(os, "all requests each run finished:\n");
}

// A run's layout object (null for a summary.json from before tandem recorded it).
const nlohmann::json& layout_of(const nlohmann::json& j) {
  static const nlohmann::json none;
  const nlohmann::json* l = lookup(j, "layout");
  return l && l->is_object() ? *l : none;
}
int64_t layout_count(const nlohmann::json& l, const char* key) {
  const nlohmann::json* v = l.is_object() ? lookup(l, key) : nullptr;
  return v && v->is_number_integer() ? v->get<int64_t>() : 0;
}
bool layout_flag(const nlohmann::json& l, const char* key) {
  const nlohmann::json* v = l.is_object() ? lookup(l, key) : nullptr;
  return v && v->is_boolean() && v->get<bool>();
}

// What the two runs ran on: a warning when the GPU (or, without GPUs, rank) counts differ, naming
// the equal-hardware baseline; a note when only the instance counts differ, or a layout is unknown.
void print_hardware_notes(const nlohmann::json& a, const nlohmann::json& b, std::ostream& os) {
  const nlohmann::json &la = layout_of(a), &lb = layout_of(b);
  if (layout_text(la) == "layout unknown" || layout_text(lb) == "layout unknown") {
    for (const auto& [name, l] : {std::pair{"A", &la}, std::pair{"B", &lb}})
      if (layout_text(*l) == "layout unknown")
        fmt::print(os,
                   "note: {}'s layout is unknown (its summary.json was written before tandem recorded one): whether "
                   "the two ran on equal hardware cannot be told\n",
                   name);
    return;
  }
  // GPUs when both hold some; else ranks (a CPU run, or simulated against measured on the CPU).
  const bool gpus = layout_count(la, "num_gpus") > 0 && layout_count(lb, "num_gpus") > 0;
  const char* key = gpus ? "num_gpus" : "num_ranks";
  const char* unit = gpus ? "GPU" : "rank";
  const int64_t ha = layout_count(la, key), hb = layout_count(lb, key);
  const int64_t ia = layout_count(la, "num_instances"), ib = layout_count(lb, "num_instances");
  const auto many = [&](int64_t n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); };
  if (ha == hb) {
    if (ia != ib)
      fmt::print(os, "note: equal hardware ({} each) in different instance counts: A {}, B {}\n", many(ha, unit), ia,
                 ib);
    return;
  }
  fmt::print(os,
             "warning: not equal hardware: A runs {} on {}, B {} on {}; throughput, goodput and capacity grow with "
             "hardware\n",
             many(ia, "instance"), many(ha, unit), many(ib, "instance"), many(hb, unit));
  // The smaller run as colocated replicas of its own TP on the larger run's hardware.
  const bool a_smaller = ha < hb;
  const nlohmann::json& small = a_smaller ? la : lb;
  const int64_t big = a_smaller ? hb : ha, own = a_smaller ? ha : hb;
  const int64_t n_small = layout_count(small, "num_instances");
  const int64_t per = n_small > 0 && own % n_small == 0 ? own / n_small : 0;  // each replica's share
  if (!layout_flag(small, "disaggregation") && per > 0 && big % per == 0)
    fmt::print(os,
               "warning: the equal-hardware baseline for this comparison is {}'s workload with --set "
               "engine.data_parallel={} ({} colocated replicas, {})\n",
               a_smaller ? "A" : "B", big / per, big / per, many(big, unit));
  else
    fmt::print(os, "warning: compare with a run of {} for equal hardware\n", many(std::max(ha, hb), unit));
}

// Per-instance rows, by role and place within the role (instances.prefill[0].steps): a prefill
// instance is never set against a colocated one. A one-instance summary.json without
// `instances` (older files) gives its run-wide figures as colocated[0].
std::vector<std::pair<std::string, double>> instance_rows(const nlohmann::json& j) {
  std::vector<std::pair<std::string, double>> out;
  const nlohmann::json* in = lookup(j, "instances");
  if (!in || !in->is_array()) {
    const nlohmann::json* l = lookup(j, "layout");
    if (l && l->is_object() && layout_count(*l, "num_instances") > 1) return out;
    for (const auto& [from, to] : {std::pair{"steps", "steps"}, std::pair{"kv_cache.mean_util", "kv_mean_util"},
                                   std::pair{"kv_cache.peak_util", "kv_peak_util"}})
      if (const nlohmann::json* v = lookup(j, from); v && v->is_number())
        out.emplace_back(fmt::format("instances.colocated[0].{}", to), v->get<double>());
    return out;
  }
  std::map<std::string, int> seen;
  for (const nlohmann::json& i : *in) {
    if (!i.is_object()) continue;
    const std::string role = i.contains("role") && i["role"].is_string() ? i["role"].get<std::string>() : "instance";
    const int k = seen[role]++;
    for (const char* f : {"steps", "busy_fraction", "kv_mean_util", "kv_peak_util", "mfu"})
      if (i.contains(f) && i[f].is_number())
        out.emplace_back(fmt::format("instances.{}[{}].{}", role, k, f), i[f].get<double>());
  }
  return out;
}

}  // namespace

int compare_runs(const std::string& dir_a, const std::string& dir_b, std::ostream& os) {
  nlohmann::json a, b;
  try {
    a = load_summary(dir_a);
    b = load_summary(dir_b);
  } catch (const InputError& e) {
    std::cerr << "tandem compare: " << e.what() << "\n";
    return 2;
  }
  auto text = [](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string("?");
  };
  auto label = [&](const nlohmann::json& j, const std::string& dir) {
    return fmt::format("{} ({}, {}, {})", dir, text(j, "backend"), text(j, "policy"), layout_text(layout_of(j)));
  };
  std::vector<std::string> keys;
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"mean", "p50", "p90", "p99", "max", "std"}) keys.push_back(fmt::format("{}.{}", m, p));
  for (const char* k : {"throughput.requests_per_s",
                        "throughput.output_tokens_per_s",
                        "throughput.total_tokens_per_s",
                        "goodput.requests_per_s",
                        "attainment.ttft.fraction",  // over all requests; failed ones are misses
                        "attainment.tpot.fraction",
                        "attainment.both.fraction",
                        "requests.finished",
                        "requests.failed",
                        "requests.cancelled",
                        "jitter_ms",
                        "steps_mix.decode_steps_with_prefill_share",
                        "prefix_cache.hit_rate",
                        "prefix_cache.block_hit_rate",
                        "prefix_cache.hit_tokens",
                        "prefix_cache.hits",
                        "prefix_cache.evictions",
                        "kv_cache.mean_util",
                        "kv_cache.peak_util",
                        "utilisation.model_flops",
                        "utilisation.mfu",                     // null where the peak is unknown: printed as "-"
                        "disaggregation.transfers.delivered",  // 1P1D: printed when either run has it
                        "disaggregation.transfers.failed",
                        "disaggregation.bytes",
                        "disaggregation.transfer_ms.p50",
                        "disaggregation.transfer_ms.p99",
                        "disaggregation.transfer_ms.max",
                        "disaggregation.ttft_after_transfer_ms.p50",
                        "disaggregation.ttft_after_transfer_ms.p99",
                        "steps",
                        "makespan_s",
                        "sim_s",
                        "wall_s"})
    keys.push_back(k);
  // The optional metrics (goodput, steps_mix, ...) too: a number or absent, checked before printing;
  // an MFU may also be null (summary.json writes null where the hardware's peak is unknown).
  const auto unknown = [](const std::string& k, const nlohmann::json* v) {
    return k == "utilisation.mfu" && v->is_null();
  };
  for (const auto& k : keys)
    for (const auto& [j, dir] : {std::pair{&a, &dir_a}, std::pair{&b, &dir_b}})
      if (const nlohmann::json* v = lookup(*j, k); v && !v->is_number() && !unknown(k, v)) {
        std::cerr << fmt::format("tandem compare: {}/summary.json: field '{}': expected a number, got {}\n", *dir, k,
                                 v->dump());
        return 2;
      }
  fmt::print(os, "A = {}\nB = {}\n", label(a, dir_a), label(b, dir_b));
  // Which first token each run's ttft_ms (and so TPOT, ITL, goodput) counts.
  for (const auto& [name, j] : {std::pair{"A", &a}, std::pair{"B", &b}}) {
    const nlohmann::json& l = layout_of(*j);
    const bool at_p = l.is_object() && l.contains("first_token_from") && l["first_token_from"] == "prefill";
    fmt::print(os, "TTFT {}: {}{}\n", name, first_token_text(l),
               at_p ? " (a client served by the decode instance: disaggregation.ttft_after_transfer_ms)" : "");
  }
  print_hardware_notes(a, b, os);
  if (layout_count(layout_of(a), "num_instances") > 1 || layout_count(layout_of(b), "num_instances") > 1)
    fmt::print(os,
               "note: steps, steps_mix and prefix_cache count every instance of a run together; the instances.* rows "
               "give each instance's (by role), '-' where a run has no such instance\n");
  try {
    print_comparability_notes(a, b, dir_a, dir_b, os);
  } catch (const InputError& e) {
    std::cerr << "tandem compare: " << e.what() << "\n";
    return 2;
  }
  // Rows: the keys above, then each instance's (by role). A row that one run has not (a 1P1D
  // figure of a colocated run, an instance of a role the other run lacks) prints "-" there.
  std::vector<std::tuple<std::string, std::optional<double>, std::optional<double>>> rows;
  const auto number = [](const nlohmann::json* v) {
    return v && v->is_number() ? std::optional(v->get<double>()) : std::nullopt;
  };
  for (const auto& k : keys) {
    const nlohmann::json* va = lookup(a, k);
    const nlohmann::json* vb = lookup(b, k);
    if (!va && !vb) continue;
    rows.emplace_back(k, number(va), number(vb));
  }
  // A's instances in their order, then B's that A has not; each instance's figures together.
  const std::vector<std::pair<std::string, double>> ia = instance_rows(a), ib = instance_rows(b);
  const std::map<std::string, double> ma(ia.begin(), ia.end()), mb(ib.begin(), ib.end());
  std::vector<std::string> instance_keys;
  for (const auto* v : {&ia, &ib})
    for (const auto& [k, x] : *v)
      if (std::find(instance_keys.begin(), instance_keys.end(), k) == instance_keys.end()) instance_keys.push_back(k);
  for (const std::string& k : instance_keys) {
    const auto fa = ma.find(k), fb = mb.find(k);
    rows.emplace_back(k, fa != ma.end() ? std::optional(fa->second) : std::nullopt,
                      fb != mb.end() ? std::optional(fb->second) : std::nullopt);
  }
  // The metric column fits the longest key printed (34 unless a 1P1D or instance key is longer).
  size_t width = 34;
  for (const auto& [k, x, y] : rows) width = std::max(width, k.size() + 1);
  fmt::print(os, "{:<{}}{:>14}{:>14}{:>12}\n", "metric", width, "A", "B", "(B-A)/A");
  const auto cell = [](const std::optional<double>& v) { return v ? fmt::format("{:.4g}", *v) : std::string("-"); };
  for (const auto& [k, x, y] : rows) {
    std::string rel = "-";
    if (x && y && *x != 0)
      rel = fmt::format("{:+.1f}%", 100.0 * (*y - *x) / std::fabs(*x));
    else if (x && y && *x == 0 && *y == 0)
      rel = "0.0%";
    fmt::print(os, "{:<{}}{:>14}{:>14}{:>12}\n", k, width, cell(x), cell(y), rel);
  }
  return 0;
}

}  // namespace tandem
