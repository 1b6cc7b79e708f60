#include "sim/sweep/sweep_results.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"
#include "sim/outputs/outputs_schema.h"
#include "sim/sweep/sweep_run.h"
#include "sim/sweep/sweep_vllm.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

// A CSV cell: quoted where it holds a comma, a quote or a line break (names and values of
// grid keys may; the metrics never do).
std::string cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q.append(c == '"' ? 2 : 1, c);
  q.push_back('"');
  return q;
}

std::string num(const nlohmann::json& j) {
  if (j.is_number_integer()) return fmt::format("{}", j.get<int64_t>());
  if (j.is_number()) return fmt::format("{}", j.get<double>());
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  return "";
}

std::string param_of(const nlohmann::json& point, const std::string& key) {
  for (const auto& kv : point["params"])
    if (kv[0] == key) return kv[1].get<std::string>();
  return "";
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out.flush()) throw std::runtime_error(fmt::format("{}: cannot write", tmp));
  }
  fs::rename(tmp, path);
}

// Requests that did not finish make a row's latency percentiles cover fewer requests than its
// neighbours': said in the row, never left for the reader to discover.
std::string unfinished_note(const nlohmann::json& run) {
  const nlohmann::json& m = run["metrics"];
  const int64_t total = m.value("requests.total", int64_t(0)), finished = m.value("requests.finished", int64_t(0));
  if (finished == total) return "";
  return fmt::format("{} of {} finished ({} failed, {} cancelled): latencies over the finished only", finished, total,
                     m.value("requests.failed", int64_t(0)), m.value("requests.cancelled", int64_t(0)));
}

// A point's layout (null in a result from before tandem recorded it), and where the first token
// that its ttft_ms counts comes from ("" when unknown).
const nlohmann::json& layout_of_point(const nlohmann::json& point) {
  static const nlohmann::json none;
  return point.is_object() && point.contains("layout") && point["layout"].is_object() ? point["layout"] : none;
}
std::string first_token_from(const nlohmann::json& point) {
  const nlohmann::json& l = layout_of_point(point);
  return l.contains("first_token_from") && l["first_token_from"].is_string() ? l["first_token_from"].get<std::string>()
                                                                             : "";
}

// The run whose finished share a capacity row shows: the one at the capacity, or where there is
// none (below lo, cannot finish) the run at lo. Null when absent.
const nlohmann::json* capacity_run(const nlohmann::json& point, double lo) {
  const auto& c = point["capacity"];
  const double at = c["rate"].get<double>() > 0 ? c["rate"].get<double>() : lo;
  for (const auto& run : point["runs"])
    if (run["rate"].get<double>() == at) return &run;
  return nullptr;
}
// "497/500": finished of all requests of a run.
std::string finished_of(const nlohmann::json* run) {
  if (!run) return "-";
  const auto& m = (*run)["metrics"];
  return fmt::format("{}/{}", m.value("requests.finished", int64_t(0)), m.value("requests.total", int64_t(0)));
}
// The offered rate of a run (requests by its last arrival), "-" where absent.
std::string offered_of(const nlohmann::json* run) {
  return run && run->contains("offered_rate") && (*run)["offered_rate"].is_number()
             ? fmt::format("{:.4g}", (*run)["offered_rate"].get<double>())
             : "-";
}
std::string finished_share(const nlohmann::json* run) {
  if (!run) return "";
  const auto& m = (*run)["metrics"];
  const int64_t total = m.value("requests.total", int64_t(0));
  return total ? fmt::format("{}", double(m.value("requests.finished", int64_t(0))) / double(total)) : "";
}

std::string priced(const CostSpec& c) {
  std::string t;
  for (const auto& [name, usd] : c.gpu_hour_usd) t += fmt::format("{}{} {}", t.empty() ? "" : ", ", name, usd);
  return t;
}

// The GPUs a point holds (its layout's num_gpus; 0 when unknown).
int64_t gpus_of(const nlohmann::json& point) {
  const nlohmann::json& l = layout_of_point(point);
  return l.contains("num_gpus") && l["num_gpus"].is_number_integer() ? l["num_gpus"].get<int64_t>() : 0;
}
// What a point's GPUs cost an hour at the plan's prices; nullopt when its hardware is not known.
std::optional<double> usd_per_hour(const nlohmann::json& point, const CostSpec& cost) {
  if (!point.contains("gpus_by_hardware") || !point["gpus_by_hardware"].is_object()) return std::nullopt;
  double usd = 0;
  for (const auto& [name, gpus] : point["gpus_by_hardware"].items()) {
    const auto it = cost.gpu_hour_usd.find(name);
    if (it == cost.gpu_hour_usd.end()) return std::nullopt;
    usd += gpus.get<double>() * it->second;
  }
  return usd;
}
// A capacity that is a number (found, or at least hi); nullopt for below lo and cannot finish.
std::optional<double> capacity_number(const nlohmann::json& point) {
  const auto& c = point["capacity"];
  const std::string st = c["status"].get<std::string>();
  if (st != "found" && st != "at_least_hi") return std::nullopt;
  return c["rate"].get<double>();
}

// The cost of each point's capacity and, with cost.at_rate, the one-line answer: the cheapest
// configuration whose capacity is at least that rate (no point is scaled out: a point is the
// deployment it ran).
void write_cost_table(const SweepPlan& plan, const std::map<int64_t, nlohmann::json>& results, size_t name_w,
                      std::ostream& table) {
  const CostSpec& cost = *plan.cost;
  const std::string meets = cost.at_rate ? fmt::format("meets {:.4g}", *cost.at_rate) : "";
  fmt::print(table, "\n{:<{}}  {:>4}  {:>8}  {:>12}  {:>10}  {}\n", "point", name_w, "GPUs", "$/hour", "capacity/GPU",
             "requests/$", meets);
  const nlohmann::json* best = nullptr;
  double best_usd = 0, best_cap = 0;
  bool unknown_beyond_hi = false;
  for (const auto& p : plan.points) {
    const auto it = results.find(p.index);
    if (it == results.end() || it->second.contains("error") || !it->second.contains("capacity")) continue;
    const nlohmann::json& r = it->second;
    const std::optional<double> cap = capacity_number(r), usd = usd_per_hour(r, cost);
    const int64_t gpus = gpus_of(r);
    std::string verdict;
    if (cost.at_rate) {
      const bool lower_bound = r["capacity"]["status"] == "at_least_hi";
      const bool ok = cap && *cap >= *cost.at_rate;
      verdict = ok ? "yes" : (lower_bound ? "unknown (capacity >= hi)" : "no");
      unknown_beyond_hi = unknown_beyond_hi || (!ok && lower_bound);
      if (ok && usd && (!best || *usd < best_usd || (*usd == best_usd && *cap > best_cap)))
        best = &r, best_usd = *usd, best_cap = *cap;
    }
    fmt::print(table, "{:<{}}  {:>4}  {:>8}  {:>12}  {:>10}  {}\n", p.name, name_w, gpus ? std::to_string(gpus) : "-",
               usd ? fmt::format("{:.2f}", *usd) : "-", cap && gpus ? fmt::format("{:.4g}", *cap / double(gpus)) : "-",
               cap && usd && *usd > 0 ? fmt::format("{:.0f}", *cap * 3600 / *usd) : "-", verdict);
  }
  if (cost.at_rate) {
    // Others at the same price that also meet it: named, the answer being the one with the most headroom.
    std::string tied;
    for (const auto& [index, r] : results)
      if (best && &r != best && !r.contains("error") && r.contains("capacity") && capacity_number(r) &&
          *capacity_number(r) >= *cost.at_rate && usd_per_hour(r, cost) == best_usd)
        tied += (tied.empty() ? "" : ", ") + r["name"].get<std::string>();
    if (best)
      fmt::print(table, "cheapest meeting the SLO at {} {:.4g}: {} ({}) at ${:.2f}/hour, capacity {:.4g}{}\n",
                 plan.rate_key, *cost.at_rate, (*best)["name"].get<std::string>(),
                 layout_brief(layout_of_point(*best)), best_usd, best_cap,
                 tied.empty() ? "" : fmt::format(" (the highest capacity of those at that price; also: {})", tied));
    else
      fmt::print(table, "cheapest meeting the SLO at {} {:.4g}: none of these configurations meets it{}\n",
                 plan.rate_key, *cost.at_rate, unknown_beyond_hi ? " within the searched bracket (raise hi)" : "");
  }
  fmt::print(table,
             "cost: $/GPU-hour {}{}; $/hour = the point's GPUs x their price; requests/$ = capacity x 3600 / $/hour; "
             "each point as it ran (none scaled out)\n",
             priced(cost), cost.example_prices ? " (tandem's example prices, not quotes: set cost.gpu_hour_usd)" : "");
}

}  // namespace

std::string LoadedResults::other_build_text() const {
  std::string t;
  for (size_t i = 0; i < other_build.size() && i < 3; ++i)
    t += fmt::format("{}{} (point {}) was run by build {}", i ? "; " : "", other_build[i].file, other_build[i].index,
                     other_build[i].build.empty() ? "(none recorded)" : other_build[i].build);
  if (other_build.size() > 3) t += fmt::format("; and {} more", other_build.size() - 3);
  return t;
}

LoadedResults load_results(const SweepPlan& plan, const std::string& dir, const std::string& build) {
  std::map<std::string, int64_t> by_key;
  for (const auto& p : plan.points) by_key[p.key] = p.index;
  LoadedResults loaded;
  auto& out = loaded.points;
  std::error_code ec;
  const fs::path rdir = fs::path(dir) / "results";
  if (!fs::is_directory(rdir, ec)) return loaded;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(rdir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = parse_json_strict(ss.str());
    } catch (const std::exception& e) {
      throw InputError(fmt::format("{}: not a point result: {}", f.string(), e.what()));
    }
    if (!j.is_array()) j = nlohmann::json::array({j});
    for (auto& r : j) {
      if (!r.is_object() || !r.contains("key") || !r["key"].is_string() || !r.contains("runs"))
        throw InputError(fmt::format("{}: not a point result (no key or runs)", f.string()));
      // The build first: a result that copied the plan's key (tandem before #34) still names its build.
      const std::string by = r.contains("build") && r["build"].is_string() ? r["build"].get<std::string>() : "";
      if (by != build) {
        const int64_t index = r.contains("index") && r["index"].is_number_integer() ? r["index"].get<int64_t>() : -1;
        loaded.other_build.push_back({(fs::path("results") / f.filename()).string(), by, index});
        continue;
      }
      const auto it = by_key.find(r["key"].get<std::string>());
      if (it == by_key.end()) {
        ++loaded.stale;
        continue;
      }
      r["index"] = it->second;  // the plan's index: a result kept from an earlier grid may have had another
      // An error result never replaces a complete one.
      if (auto o = out.find(it->second); o != out.end() && !o->second.contains("error") && r.contains("error"))
        continue;
      out[it->second] = std::move(r);
    }
  }
  return loaded;
}

void write_point_result(const std::string& dir, const nlohmann::json& result) {
  fs::create_directories(fs::path(dir) / "results");
  write_file(fmt::format("{}/results/point-{}.json", dir, result["index"].get<int64_t>()), result.dump(1) + "\n");
}

std::vector<int64_t> write_sweep_outputs(const SweepPlan& plan, const std::map<int64_t, nlohmann::json>& results,
                                         const std::string& dir, std::ostream& table) {
  const auto& metrics = sweep_metric_columns();
  // Appends are one piece at a time: GCC 12 warns (-Wrestrict, a false positive) on chains of +.
  std::string keys;
  for (const auto& k : plan.param_keys) keys.append(",").append(cell(k));
  std::string csv = "index,name";
  csv.append(keys).append(",rate,offered_rate,meets_slo,why");
  for (const auto& m : metrics) csv.append(",").append(m);
  csv.append(",layout,layout.first_token_from,note\n");
  std::string cap_csv = "index,name";
  cap_csv.append(keys).append(",status,capacity,offered_at_capacity,first_missed,limited_by,runs,requests,finished_share");
  cap_csv.append(",gpus,capacity_per_gpu").append(plan.cost ? ",usd_per_hour,requests_per_usd" : "");
  cap_csv.append(",mfu_at_capacity\n");
  std::vector<int64_t> missing;
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : plan.points) {
    const auto it = results.find(p.index);
    if (it == results.end() || it->second.contains("error")) {
      missing.push_back(p.index);
      if (it != results.end()) points.push_back(it->second);
      continue;
    }
    const nlohmann::json& r = it->second;
    points.push_back(r);
    std::string lead = fmt::format("{},{}", p.index, cell(p.name));
    for (const auto& k : plan.param_keys) lead.append(",").append(cell(param_of(r, k)));
    for (const auto& run : r["runs"]) {
      csv.append(fmt::format("{},{},{},{},{}", lead, num(run["rate"]), num(run["offered_rate"]),
                             run.contains("meets_slo") ? num(run["meets_slo"]) : "", cell(run.value("why", ""))));
      for (const auto& m : metrics) csv.append(",").append(run["metrics"].contains(m) ? num(run["metrics"][m]) : "");
      csv.append(",").append(cell(layout_brief(layout_of_point(r))));
      csv.append(",").append(cell(first_token_from(r)));
      csv.append(",").append(cell(unfinished_note(run))).append("\n");
    }
    if (r.contains("capacity")) {
      const auto& c = r["capacity"];
      std::string limited = c.value("why", "");
      for (const auto& run : r["runs"])
        if (limited.empty() && run["rate"] == c["first_missed"]) limited = run.value("why", "");
      const nlohmann::json* at = capacity_run(r, plan.capacity ? plan.capacity->lo : 0);
      const std::string st = c["status"].get<std::string>();
      // No number where no rate meets the SLO: an empty capacity, never a 0 read as a rate.
      const bool has_rate = st == "found" || st == "at_least_hi";
      cap_csv.append(fmt::format("{},{},{},{},{},{},{},{},{}", lead, st, st == "cannot_finish" ? "" : num(c["rate"]),
                                 has_rate && at ? num((*at)["offered_rate"]) : "", c["first_missed"].get<double>() > 0 ? num(c["first_missed"]) : "", cell(limited),
                                 num(c["runs"]), at ? num((*at)["metrics"].value("requests.total", nlohmann::json())) : "",
                                 finished_share(at)));
      // Per GPU and per dollar: the capacity over the GPUs the point holds, and the requests an
      // hour at the capacity over what those GPUs cost an hour.
      const std::optional<double> cap = capacity_number(r);
      const int64_t gpus = gpus_of(r);
      cap_csv.append(fmt::format(",{},{}", gpus ? std::to_string(gpus) : "",
                                 cap && gpus ? fmt::format("{}", *cap / double(gpus)) : ""));
      if (plan.cost) {
        const std::optional<double> usd = usd_per_hour(r, *plan.cost);
        cap_csv.append(fmt::format(",{},{}", usd ? fmt::format("{}", *usd) : "",
                                   usd && cap && *usd > 0 ? fmt::format("{}", *cap * 3600 / *usd) : ""));
      }
      // The run at the capacity: its MFU (empty without a capacity or where the peak is unknown).
      const bool mfu = at && has_rate && (*at)["metrics"].contains("utilisation.mfu");
      cap_csv.append(",").append(mfu ? num((*at)["metrics"]["utilisation.mfu"]) : "");
      cap_csv.append("\n");
    }
  }
  fs::create_directories(dir);
  write_file(dir + "/results.csv", csv);
  if (plan.capacity) write_file(dir + "/capacity.csv", cap_csv);
  nlohmann::json all = {{"format", "tandem-sweep-results"}, {"version", 1},     {"sweep", plan.sweep_path},
                        {"rate_key", plan.rate_key},        {"points", points}, {"missing", missing}};
  write_file(dir + "/results.json", all.dump(1) + "\n");
  write_vllm_sweep_layout(results, dir);

  // The table: a line per point (capacity) or per point and rate.
  size_t name_w = 5;
  for (const auto& p : plan.points) name_w = std::max(name_w, p.name.size());
  name_w = std::min<size_t>(name_w, 60);
  // Each point's layout (GPUs, and in 1P1D which first token its TTFT counts), so that points on
  // different hardware are not read as alike.
  size_t layout_w = 6;
  bool any_multi = false;
  const auto layout_cell = [&](int64_t index) {
    const auto it = results.find(index);
    return it == results.end() ? std::string("-") : layout_brief(layout_of_point(it->second));
  };
  for (const auto& p : plan.points) {
    layout_w = std::max(layout_w, layout_cell(p.index).size());
    if (const auto it = results.find(p.index); it != results.end()) {
      const nlohmann::json& l = layout_of_point(it->second);
      any_multi = any_multi || (l.contains("num_instances") && l["num_instances"].is_number_integer() &&
                                l["num_instances"].get<int64_t>() > 1);
    }
  }
  const auto layout_footer = [&] {
    if (any_multi)
      fmt::print(table,
                 "layout: the GPUs each point ran on (dpN: N colocated replicas); 1P1D's TTFT@P counts the prefill "
                 "instance's first token, TTFT@D the decode instance's (disaggregation.first_token_from: decode)\n");
  };
  bool any_unfinished = false;
  if (plan.capacity) {
    fmt::print(table, "{:<{}}  {:>12}  {:>8}  {:<13}  {:>5}  {:>9}  {:<{}}  {}\n", "point", name_w, "capacity",
               "offered", "status", "runs", "finished", "layout", layout_w, "limited by (first rate missed)");
    for (const auto& p : plan.points) {
      const auto it = results.find(p.index);
      if (it == results.end() || it->second.contains("error")) {
        fmt::print(table, "{:<{}}  {:>12}  {}\n", p.name, name_w, "-",
                   it == results.end() ? "not run" : "error: " + it->second["error"].get<std::string>());
        continue;
      }
      const auto& c = it->second["capacity"];
      std::string limited = c.value("why", "");
      for (const auto& run : it->second["runs"])
        if (limited.empty() && run["rate"] == c["first_missed"])
          limited = fmt::format("{} at {:.4g}", run.value("why", ""), run["rate"].get<double>());
      const std::string st = c["status"];
      const std::string cap = st == "below_lo"        ? fmt::format("< {:.4g}", plan.capacity->lo)
                              : st == "at_least_hi"   ? fmt::format(">= {:.4g}", plan.capacity->hi)
                              : st == "cannot_finish" ? std::string("none")
                                                      : fmt::format("{:.4g}", c["rate"].get<double>());
      const nlohmann::json* at = capacity_run(it->second, plan.capacity->lo);
      fmt::print(table, "{:<{}}  {:>12}  {:>8}  {:<13}  {:>5}  {:>9}  {:<{}}  {}\n", p.name, name_w, cap,
                 st == "found" || st == "at_least_hi" ? offered_of(at) : "-", st, c["runs"].get<int>(),
                 finished_of(at), layout_cell(p.index), layout_w, limited);
    }
    fmt::print(
        table,
        "capacity: the highest {} that met {} (in {}) counting every request of a run (a failed or cancelled one "
        "is a miss); offered: that run's requests over the time to its last arrival; finished: of all requests at "
        "the capacity (or at lo); results.csv has every run\n",
        plan.rate_key,
        [&] {
          const SweepSlo& s = plan.capacity->slo;
          std::string t;
          const auto add = [&](const char* n, const std::optional<double>& v) {
            if (v) t += (t.empty() ? "" : ", ") + fmt::format("{} <= {}", n, *v);
          };
          add("ttft_p99_ms", s.ttft_p99_ms), add("tpot_p99_ms", s.tpot_p99_ms), add("itl_p99_ms", s.itl_p99_ms);
          if (s.goodput_min) t += (t.empty() ? "" : ", ") + fmt::format("goodput >= {}", *s.goodput_min);
          return t;
        }(),
        fmt::format("[{}, {}], tolerance {}", plan.capacity->lo, plan.capacity->hi, plan.capacity->tolerance));
    layout_footer();
    if (plan.cost) write_cost_table(plan, results, name_w, table);
  } else {
    fmt::print(table, "{:<{}}  {:>8}  {:>8}  {:>11}  {:>11}  {:>11}  {:>9}  {:>11}  {}\n", "point", name_w, "rate",
               "offered", "ttft p99 ms", "tpot p99 ms", "itl p99 ms", "req/s", "finished", "layout");
    for (const auto& p : plan.points) {
      const auto it = results.find(p.index);
      if (it == results.end() || it->second.contains("error")) {
        fmt::print(table, "{:<{}}  {}\n", p.name, name_w,
                   it == results.end() ? "not run" : "error: " + it->second["error"].get<std::string>());
        continue;
      }
      for (const auto& run : it->second["runs"]) {
        const auto& m = run["metrics"];
        const auto g = [&](const char* k) { return m.contains(k) ? fmt::format("{:.4g}", m[k].get<double>()) : "-"; };
        const bool unfinished = !unfinished_note(run).empty();
        any_unfinished = any_unfinished || unfinished;
        fmt::print(
            table, "{:<{}}  {:>8.4g}  {:>8}  {:>11}  {:>11}  {:>11}  {:>9}  {:>10}{}  {}\n", p.name, name_w,
            run["rate"].get<double>(), offered_of(&run), g("ttft_ms.p99"), g("tpot_ms.p99"), g("itl_ms.p99"),
            g("throughput.requests_per_s"),
            fmt::format("{}/{}", m.value("requests.finished", int64_t(0)), m.value("requests.total", int64_t(0))),
            unfinished ? "*" : " ", layout_cell(p.index));
      }
    }
    fmt::print(table, "offered: the run's requests over the time to its last arrival (vLLM's count / rate); "
                      "requests.arrival.normalize: true makes it the rate\n");
    layout_footer();
    if (any_unfinished)
      fmt::print(table,
                 "* not every request finished: that row's latencies are over fewer requests than a complete row's; "
                 "--keep-runs keeps each run's folder (DIR/runs), and `tandem compare A B` compares two of them on the "
                 "requests both finished\n");
  }
  return missing;
}

}  // namespace tandem
