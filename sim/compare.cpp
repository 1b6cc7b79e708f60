#include "sim/compare.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "sim/config.h"
#include "sim/csv.h"
#include "core/json_strict.h"

namespace tandem {

namespace {
// The node at a dotted path, whatever its type; nullptr where absent.
const nlohmann::json* lookup(const nlohmann::json& j, const std::string& dotted);

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
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object (a summary.json written by tandem run --out)", path));
  // The stable metrics (README, Outputs) must be there, as numbers; without them the
  // comparison would print nan.
  std::vector<std::string> stable;
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"mean", "p50", "p90", "p99", "count"}) stable.push_back(fmt::format("{}.{}", m, p));
  for (const char* k : {"throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
                        "requests.total", "requests.finished", "requests.failed", "requests.cancelled", "jitter_ms",
                        "prefix_cache.hit_rate", "kv_cache.mean_util", "kv_cache.peak_util", "steps", "makespan_s",
                        "sim_s", "wall_s"})
    stable.push_back(k);
  for (const auto& k : stable) {
    const nlohmann::json* v = lookup(j, k);
    if (!v) throw InputError(fmt::format("{}: field '{}': missing (not a summary.json written by tandem run --out)", path, k));
    if (!v->is_number()) throw InputError(fmt::format("{}: field '{}': expected a number, got {}", path, k, v->dump()));
  }
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
  return cur;
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
  for (const char* k : {"throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
                        "goodput.requests_per_s", "requests.finished", "requests.failed", "requests.cancelled",
                        "jitter_ms", "steps_mix.decode_steps_with_prefill_share", "prefix_cache.hit_rate",
                        "prefix_cache.block_hit_rate", "prefix_cache.hit_tokens", "prefix_cache.hits", "prefix_cache.evictions", "kv_cache.mean_util", "kv_cache.peak_util", "steps",
                        "makespan_s", "sim_s", "wall_s"})
    keys.push_back(k);
  // The optional metrics (goodput, steps_mix, ...) too: a number or absent, checked before printing.
  for (const auto& k : keys)
    for (const auto& [j, dir] : {std::pair{&a, &dir_a}, std::pair{&b, &dir_b}})
      if (const nlohmann::json* v = lookup(*j, k); v && !v->is_number()) {
        std::cerr << fmt::format("tandem compare: {}/summary.json: field '{}': expected a number, got {}\n", *dir, k, v->dump());
        return 2;
      }
  fmt::print(os, "A = {}\nB = {}\n", label(a, dir_a), label(b, dir_b));
  fmt::print(os, "{:<34}{:>14}{:>14}{:>12}\n", "metric", "A", "B", "(B-A)/A");
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
