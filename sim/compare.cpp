#include "sim/compare.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/json_strict.h"
#include "sim/config.h"
#include "sim/csv.h"

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
  if (num(a, "requests.finished") == num(b, "requests.finished") &&
      num(a, "requests.failed") == num(b, "requests.failed"))
    return;
  fmt::print(os,
             "note: A finished {} requests ({} failed), B finished {} ({} failed): the latency figures below are "
             "over different request sets\n",
             num(a, "requests.finished"), num(a, "requests.failed"), num(b, "requests.finished"),
             num(b, "requests.failed"));
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
    return fmt::format("{} ({}, {})", dir, text(j, "backend"), text(j, "policy"));
  };
  std::vector<std::string> keys;
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"mean", "p50", "p90", "p99", "max", "std"}) keys.push_back(fmt::format("{}.{}", m, p));
  for (const char* k : {"throughput.requests_per_s",
                        "throughput.output_tokens_per_s",
                        "throughput.total_tokens_per_s",
                        "goodput.requests_per_s",
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
  // The optional metrics (goodput, steps_mix, ...) too: a number or absent, checked before printing.
  for (const auto& k : keys)
    for (const auto& [j, dir] : {std::pair{&a, &dir_a}, std::pair{&b, &dir_b}})
      if (const nlohmann::json* v = lookup(*j, k); v && !v->is_number()) {
        std::cerr << fmt::format("tandem compare: {}/summary.json: field '{}': expected a number, got {}\n", *dir, k,
                                 v->dump());
        return 2;
      }
  fmt::print(os, "A = {}\nB = {}\n", label(a, dir_a), label(b, dir_b));
  try {
    print_comparability_notes(a, b, dir_a, dir_b, os);
  } catch (const InputError& e) {
    std::cerr << "tandem compare: " << e.what() << "\n";
    return 2;
  }
  // The metric column fits the longest key printed (34 unless a 1P1D key is).
  size_t width = 34;
  for (const auto& k : keys)
    if (lookup(a, k) || lookup(b, k)) width = std::max(width, k.size() + 1);
  fmt::print(os, "{:<{}}{:>14}{:>14}{:>12}\n", "metric", width, "A", "B", "(B-A)/A");
  for (const auto& k : keys) {
    const nlohmann::json* va = lookup(a, k);
    const nlohmann::json* vb = lookup(b, k);
    if (!va && !vb) continue;
    const double x = va ? va->get<double>() : NAN, y = vb ? vb->get<double>() : NAN;
    std::string rel = "-";
    if (va && vb && x != 0)
      rel = fmt::format("{:+.1f}%", 100.0 * (y - x) / std::fabs(x));
    else if (va && vb && x == 0 && y == 0)
      rel = "0.0%";
    fmt::print(os, "{:<{}}{:>14.4g}{:>14.4g}{:>12}\n", k, width, x, y, rel);
  }
  return 0;
}

}  // namespace tandem
