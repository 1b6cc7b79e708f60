#include "sim/compare.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "sim/config.h"
#include "sim/csv.h"

namespace tandem {

namespace {
nlohmann::json load_summary(const std::string& dir) {
  const std::string path = dir + "/summary.json";
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open (is '{}' a run folder written with --out?)", path, dir));
  nlohmann::json j;
  try {
    require_regular_file(path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  } catch (const std::ios_base::failure& e) {
    throw InputError(fmt::format("{}: cannot read: {}", path, e.what()));
  }
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object (a summary.json written by tandem run --out)", path));
  return j;
}

const nlohmann::json* lookup(const nlohmann::json& j, const std::string& dotted) {
  const nlohmann::json* cur = &j;
  size_t start = 0;
  while (start <= dotted.size()) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur->is_number() ? cur : nullptr;
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
  fmt::print(os, "A = {}\nB = {}\n", label(a, dir_a), label(b, dir_b));
  fmt::print(os, "{:<34}{:>14}{:>14}{:>12}\n", "metric", "A", "B", "(B-A)/A");
  std::vector<std::string> keys;
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"mean", "p50", "p90", "p99", "max", "std"}) keys.push_back(fmt::format("{}.{}", m, p));
  for (const char* k : {"throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
                        "goodput.requests_per_s", "requests.finished", "requests.failed", "requests.cancelled",
                        "jitter_ms", "steps_mix.decode_steps_with_prefill_share", "prefix_cache.hit_rate", "kv_cache.mean_util", "kv_cache.peak_util", "steps",
                        "makespan_s", "sim_s", "wall_s"})
    keys.push_back(k);
  for (const auto& k : keys) {
    const nlohmann::json* va = lookup(a, k);
    const nlohmann::json* vb = lookup(b, k);
    if (!va && !vb) continue;
    const double x = va ? va->get<double>() : NAN, y = vb ? vb->get<double>() : NAN;
    std::string rel = "-";
    if (va && vb && x != 0) rel = fmt::format("{:+.1f}%", 100.0 * (y - x) / std::fabs(x));
    else if (va && vb && x == 0 && y == 0) rel = "0.0%";
    fmt::print(os, "{:<34}{:>14.4g}{:>14.4g}{:>12}\n", k, x, y, rel);
  }
  return 0;
}

}  // namespace tandem
