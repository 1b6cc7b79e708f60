#include "sim/sweep/sweep_file.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"
#include "core/utf8.h"
#include "sim/base/csv.h"
#include "sim/version.h"
#include "sim/base/yaml_reader.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path, const char* what) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open {}", path, what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string hex128(XXH128_hash_t h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

// XXH3-128 of a file's bytes, read in 1 MiB pieces.
std::string file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<char> buf(1 << 20);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
    XXH3_128bits_update(st, buf.data(), size_t(in.gcount()));
  const std::string h = hex128(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return h;
}

// A grid value or a `set:` value as the text `--set` takes: a scalar as written, a mapping or a
// sequence in YAML's flow style.
std::string value_text(const Field& f) {
  if (f.is_scalar()) return f.node().Scalar();
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  e << f.node();
  return e.c_str();
}

// `set:` mappings: dotted keys (as --set) or nested mappings, flattened to overrides in order.
void flatten_set(const Field& f, const std::string& prefix, std::vector<Override>& out) {
  if (!f.is_map()) f.fail("expected a mapping of workload keys (dotted, as --set takes them) to values");
  for (const auto& kv : f.node()) {
    if (!kv.first.IsScalar()) f.fail("a key must be a plain name");
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    const Field v = f[kv.first.Scalar()];
    if (!v.present()) v.fail("empty (give a value)");
    out.push_back({key, value_text(v)});
  }
}

std::string point_name(const std::string& config, const std::vector<Override>& grid_params) {
  std::string s = config;
  for (const auto& o : grid_params) s += (s.empty() ? "" : " ") + o.key + "=" + o.value;
  return s.empty() ? "base" : s;
}

// The absolute paths a resolved workload names (its scalars that start with '/'): each one that is
// a regular file counts in the point's key with its contents' hash, so a trace or a profile that
// changes changes the points that read it.
void collect_paths(const YAML::Node& n, std::set<std::string>& out) {
  if (n.IsScalar()) {
    if (n.Scalar().size() > 1 && n.Scalar()[0] == '/') out.insert(n.Scalar());
  } else if (n.IsMap()) {
    for (const auto& kv : n) collect_paths(kv.second, out);
  } else if (n.IsSequence()) {
    for (const auto& v : n) collect_paths(v, out);
  }
}

std::string mode_text(const std::string& rate_key, const std::vector<double>& rates,
                      const std::optional<CapacitySpec>& capacity) {
  if (!capacity) {
    std::string t = "rates " + rate_key;
    for (double r : rates) t += fmt::format(" {}", r);
    return t;
  }
  const CapacitySpec& c = *capacity;
  const auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{}", *v) : std::string("-"); };
  return fmt::format("capacity {} lo {} hi {} tol {} probes {} ttft {} tpot {} itl {} goodput {}", rate_key, c.lo,
                     c.hi, c.tolerance, c.probes, opt(c.slo.ttft_p99_ms), opt(c.slo.tpot_p99_ms), opt(c.slo.itl_p99_ms),
                     opt(c.slo.goodput_min));
}

// A point's key: the build, the mode, its resolved workload and the contents of the files that
// workload names (hashes cached by path across points).
std::string point_key(const std::string& build, const std::string& mode, const std::string& workload_yaml,
                      std::map<std::string, std::string>& hash_cache) {
  std::set<std::string> paths;
  try {
    collect_paths(YAML::Load(workload_yaml), paths);
  } catch (const YAML::Exception&) {
    // A workload that is not YAML (a plan edited by hand) fails when its point runs, with its
    // error in the point's result; its key is then its text's alone.
  }
  std::string id = build + "\n" + mode + "\n" + workload_yaml;
  for (const std::string& f : paths) {
    auto it = hash_cache.find(f);
    std::error_code ec;
    if (it == hash_cache.end() && fs::is_regular_file(f, ec)) it = hash_cache.emplace(f, file_hash(f)).first;
    if (it != hash_cache.end()) id += "\n" + f + " " + it->second;
  }
  return hex128(XXH3_128bits(id.data(), id.size())).substr(0, 24);
}

std::string priced_names(const CostSpec& c) {
  std::string t;
  for (const auto& [name, usd] : c.gpu_hour_usd) t += fmt::format("{}{} {}", t.empty() ? "" : ", ", name, usd);
  return t;
}

nlohmann::json cost_json(const CostSpec& c) {
  nlohmann::json j = {{"gpu_hour_usd", c.gpu_hour_usd}, {"example_prices", c.example_prices}};
  if (c.at_rate) j["at_rate"] = *c.at_rate;
  return j;
}

}  // namespace

std::vector<std::string> hardware_names(const Workload& w) {
  std::vector<std::string> names = {w.hardware.name};
  if (w.disaggregation.enabled)
    for (const InstanceOverrides* o : {&w.disaggregation.prefill, &w.disaggregation.decode})
      if (o->hardware && std::find(names.begin(), names.end(), o->hardware->name) == names.end())
        names.push_back(o->hardware->name);
  return names;
}

std::string build_id() {
  static const std::string id = std::string(TANDEM_CODE_VERSION) + "/" + file_hash("/proc/self/exe").substr(0, 16);
  return id;
}

SweepSpec load_sweep(const std::string& path) {
  const std::string text = read_text(path, "sweep file");
  // Its names and values go into JSON (plan.json, results.json), which holds UTF-8 only.
  if (const size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
    const size_t line_start = text.rfind('\n', bad == 0 ? 0 : bad - 1);
    const size_t col = line_start == std::string::npos ? bad + 1 : bad - line_start;
    throw InputError(fmt::format("{}:{}:{}: not UTF-8 text (byte 0x{:02x})", path,
                                 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(bad), '\n'), col,
                                 static_cast<unsigned char>(text[bad])));
  }
  YamlSource src{path, {}, {}};
  YAML::Node root = load_yaml_file_document(text, path, "a sweep");
  if (!root.IsMap())
    throw InputError(
        fmt::format("{}:1:1: a sweep is a mapping of workload, set, configs, grid, and rates or capacity", path));
  const Field top(root, "", &src);
  top.refuse_tags(2 * int64_t(text.size()) + 16);
  top.expect_map({"workload", "set", "configs", "grid", "rates", "capacity", "rate_key", "cost"});
  SweepSpec s;
  s.path = path;
  if (!top.has("workload")) top["workload"].fail("missing: the base workload file (relative to this file's folder)");
  s.workload_path = top["workload"].as_path();
  top["workload"].require_file(s.workload_path, "the base workload");
  s.workload_path = fs::absolute(s.workload_path).lexically_normal().string();
  if (top.has("set")) flatten_set(top["set"], "", s.fixed);
  if (top.has("configs")) {
    std::set<std::string> names;
    for (const Field& c : top["configs"].items()) {
      c.expect_map({"name", "set"});
      SweepSpec::Config cfg;
      if (!c.has("name")) c["name"].fail("missing: each configuration has a name");
      cfg.name = c["name"].as_string();
      if (cfg.name.empty() || !names.insert(cfg.name).second) c["name"].fail("empty or given twice");
      if (c.has("set")) flatten_set(c["set"], "", cfg.set);
      s.configs.push_back(std::move(cfg));
    }
    if (s.configs.empty()) top["configs"].fail("an empty list (remove it for one configuration)");
  }
  if (top.has("grid")) {
    const Field g = top["grid"];
    if (!g.is_map()) g.fail("expected a mapping of workload keys to lists of values");
    for (const auto& kv : g.node()) {
      const Field axis = g[kv.first.Scalar()];
      if (!axis.is_seq()) axis.fail("expected a list of values");
      SweepSpec::Axis a{kv.first.Scalar(), {}};
      for (const Field& v : axis.items()) {
        if (!v.present()) v.fail("an empty value");
        a.values.push_back(value_text(v));
      }
      if (a.values.empty()) axis.fail("an empty list");
      s.grid.push_back(std::move(a));
    }
  }
  const bool has_rates = top.has("rates"), has_cap = top.has("capacity");
  if (has_rates == has_cap) top.fail("give exactly one of rates: [...] and capacity: {slo, lo, hi}");
  if (has_rates) {
    for (const Field& r : top["rates"].items()) {
      s.rates.push_back(r.as_double(1e-9, 1e9));
      if (std::count(s.rates.begin(), s.rates.end(), s.rates.back()) > 1) r.fail("given twice");
    }
    if (s.rates.empty()) top["rates"].fail("an empty list");
  } else {
    const Field c = top["capacity"];
    c.expect_map({"slo", "lo", "hi", "tolerance", "probes"});
    CapacitySpec cap;
    if (!c.has("slo"))
      c["slo"].fail("missing: what a rate must meet (ttft_p99_ms, tpot_p99_ms, itl_p99_ms, goodput_min)");
    const Field slo = c["slo"];
    slo.expect_map({"ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "goodput_min"});
    if (slo.has("ttft_p99_ms")) cap.slo.ttft_p99_ms = slo["ttft_p99_ms"].as_double(1e-9, 1e12);
    if (slo.has("tpot_p99_ms")) cap.slo.tpot_p99_ms = slo["tpot_p99_ms"].as_double(1e-9, 1e12);
    if (slo.has("itl_p99_ms")) cap.slo.itl_p99_ms = slo["itl_p99_ms"].as_double(1e-9, 1e12);
    if (slo.has("goodput_min")) cap.slo.goodput_min = slo["goodput_min"].as_double(1e-9, 1);
    if (!cap.slo.ttft_p99_ms && !cap.slo.tpot_p99_ms && !cap.slo.itl_p99_ms && !cap.slo.goodput_min)
      slo.fail("no term: give at least one of ttft_p99_ms, tpot_p99_ms, itl_p99_ms, goodput_min");
    if (!c.has("lo") || !c.has("hi")) c.fail("missing lo or hi: the bracket of rates searched");
    cap.lo = c["lo"].as_double(1e-9, 1e9);
    cap.hi = c["hi"].as_double(1e-9, 1e9);
    if (cap.hi <= cap.lo) c["hi"].fail(fmt::format("must be above lo ({})", cap.lo));
    cap.tolerance = c.get_double("tolerance", cap.tolerance, 1e-6, 10);
    cap.probes = int32_t(c.get_int("probes", cap.probes, 1, 64));
    s.capacity = cap;
  }
  if (top.has("cost")) {
    const Field c = top["cost"];
    if (!s.capacity) c.fail("needs a capacity search (capacity:): the cost is of the capacity found");
    c.expect_map({"gpu_hour_usd", "at_rate"});
    CostSpec cost;
    if (c.has("gpu_hour_usd")) {
      const Field g = c["gpu_hour_usd"];
      if (!g.is_map()) g.fail("expected a mapping of hardware names to $ per GPU-hour (e.g. {h200: 3.5})");
      for (const auto& kv : g.node()) cost.gpu_hour_usd[kv.first.Scalar()] = g[kv.first.Scalar()].as_double(1e-9, 1e6);
      if (cost.gpu_hour_usd.empty()) g.fail("an empty mapping (remove it for the example prices)");
    } else {
      cost.gpu_hour_usd = {kExampleGpuHourUsd.begin(), kExampleGpuHourUsd.end()};
      cost.example_prices = true;
    }
    if (c.has("at_rate")) cost.at_rate = c["at_rate"].as_double(1e-9, 1e9);
    s.cost = cost;
  }
  // The rate key: the arrival rate, or for a trace its rate_scale (a trace has no rate of its own).
  Workload base = load_workload(s.workload_path, s.fixed);
  if (top.has("rate_key")) {
    s.rate_key = top["rate_key"].as_string();
  } else if (base.requests.trace) {
    s.rate_key = "requests.trace.rate_scale";
  } else if (base.requests.arrival.kind == ArrivalSpec::Kind::Burst) {
    top.fail(
        "the base workload's arrivals are bursts, which have no rate: give rate_key (e.g. "
        "requests.arrival.interval_s) or use a poisson, gamma or constant arrival process");
  } else {
    s.rate_key = "requests.arrival.rate";
  }
  if (s.capacity && s.capacity->slo.goodput_min && base.slo.ttft_ms <= 0 && base.slo.tpot_ms <= 0)
    top["capacity"]["slo"]["goodput_min"].fail(
        "goodput is the share of requests meeting the workload's slo: section (ttft_ms, tpot_ms), and the base "
        "workload has none: add one to it (or to set:)");
  // Each value on its own over the base, so that a bad one is named at its line here.
  const auto check = [&](const Field& at, std::vector<Override> sets, const std::string& what) {
    try {
      (void)load_workload(s.workload_path, sets);
    } catch (const InputError& e) {
      at.fail(fmt::format("{} makes the workload invalid: {}", what, e.what()));
    }
  };
  const double probe_rate = s.capacity ? s.capacity->lo : s.rates.front();
  {
    auto sets = s.fixed;
    sets.push_back({s.rate_key, fmt::format("{}", probe_rate)});
    check(top.has("rate_key") ? top["rate_key"] : (has_rates ? top["rates"] : top["capacity"]["lo"]), sets,
          fmt::format("{}={}", s.rate_key, probe_rate));
  }
  for (size_t i = 0; i < s.configs.size(); ++i) {
    auto sets = s.fixed;
    sets.insert(sets.end(), s.configs[i].set.begin(), s.configs[i].set.end());
    check(top["configs"].items()[i], sets, fmt::format("configuration '{}'", s.configs[i].name));
  }
  for (const auto& a : s.grid) {
    const auto items = top["grid"][a.key].items();
    for (size_t i = 0; i < a.values.size(); ++i) {
      auto sets = s.fixed;
      sets.push_back({a.key, a.values[i]});
      check(items[i], sets, fmt::format("{}={}", a.key, a.values[i]));
    }
  }
  return s;
}

std::vector<SweepPoint> expand_points(const SweepSpec& spec) {
  std::vector<SweepSpec::Config> configs = spec.configs;
  if (configs.empty()) configs.push_back({"", {}});
  size_t combos = 1;
  for (const auto& a : spec.grid) {
    combos *= a.values.size();
    if (combos * configs.size() > 1'000'000)
      throw InputError(fmt::format("{}: the grid has more than 1,000,000 points; split the sweep", spec.path));
  }
  const std::string mode = mode_text(spec.rate_key, spec.rates, spec.capacity);
  std::map<std::string, std::string> file_hashes;
  std::vector<SweepPoint> out;
  for (const auto& cfg : configs)
    for (size_t c = 0; c < combos; ++c) {
      SweepPoint p;
      p.index = int64_t(out.size());
      std::vector<Override> grid_params;
      size_t rest = c;
      for (auto a = spec.grid.rbegin(); a != spec.grid.rend(); ++a) {  // the last axis varies fastest
        grid_params.insert(grid_params.begin(), {a->key, a->values[rest % a->values.size()]});
        rest /= a->values.size();
      }
      p.name = point_name(cfg.name, grid_params);
      p.params = cfg.set;
      p.params.insert(p.params.end(), grid_params.begin(), grid_params.end());
      auto sets = spec.fixed;
      sets.insert(sets.end(), p.params.begin(), p.params.end());
      Workload w;
      try {
        w = load_workload(spec.workload_path, sets);
      } catch (const InputError& e) {
        throw InputError(fmt::format("{}: point {} ({}): {}", spec.path, p.index, p.name, e.what()));
      }
      if (spec.capacity && spec.capacity->slo.goodput_min && w.slo.ttft_ms <= 0 && w.slo.tpot_ms <= 0)
        throw InputError(fmt::format("{}: point {} ({}): capacity.slo.goodput_min: its workload has no slo: section",
                                     spec.path, p.index, p.name));
      if (spec.cost)
        for (const std::string& hw : hardware_names(w))
          if (!spec.cost->gpu_hour_usd.contains(hw))
            throw InputError(fmt::format(
                "{}: point {} ({}): field 'cost.gpu_hour_usd': no price for its hardware '{}' (priced: {})", spec.path,
                p.index, p.name, hw, priced_names(*spec.cost)));
      p.workload_yaml = to_yaml(w);
      if (first_invalid_utf8(p.workload_yaml) != std::string::npos)
        throw InputError(
            fmt::format("{}: point {} ({}): the workload {} holds text that is not UTF-8 (plan.json "
                        "holds UTF-8 only)",
                        spec.path, p.index, p.name, spec.workload_path));
      p.key = point_key(build_id(), mode, p.workload_yaml, file_hashes);
      out.push_back(std::move(p));
    }
  return out;
}

namespace {
nlohmann::json capacity_json(const CapacitySpec& c) {
  nlohmann::json slo = nlohmann::json::object();
  if (c.slo.ttft_p99_ms) slo["ttft_p99_ms"] = *c.slo.ttft_p99_ms;
  if (c.slo.tpot_p99_ms) slo["tpot_p99_ms"] = *c.slo.tpot_p99_ms;
  if (c.slo.itl_p99_ms) slo["itl_p99_ms"] = *c.slo.itl_p99_ms;
  if (c.slo.goodput_min) slo["goodput_min"] = *c.slo.goodput_min;
  return {{"slo", slo}, {"lo", c.lo}, {"hi", c.hi}, {"tolerance", c.tolerance}, {"probes", c.probes}};
}
}  // namespace

void rekey_points(SweepPlan& plan, const std::vector<int64_t>& indices) {
  const std::string mode = mode_text(plan.rate_key, plan.rates, plan.capacity);
  std::map<std::string, std::string> file_hashes;
  for (int64_t i : indices) {
    SweepPoint& p = plan.points.at(size_t(i));
    p.key = point_key(build_id(), mode, p.workload_yaml, file_hashes);
  }
}

SweepPlan plan_from(const SweepSpec& spec, std::vector<SweepPoint> points) {
  SweepPlan p;
  p.build = build_id();
  p.sweep_path = spec.path;
  p.workload_path = spec.workload_path;
  p.rate_key = spec.rate_key;
  p.rates = spec.rates;
  p.capacity = spec.capacity;
  p.cost = spec.cost;
  for (const auto& pt : points)
    for (const auto& o : pt.params)
      if (std::find(p.param_keys.begin(), p.param_keys.end(), o.key) == p.param_keys.end())
        p.param_keys.push_back(o.key);
  p.points = std::move(points);
  return p;
}

nlohmann::json plan_json(const SweepSpec& spec, const std::vector<SweepPoint>& points) {
  nlohmann::json j;
  j["format"] = "tandem-sweep-plan";
  j["version"] = 1;
  j["sweep"] = fs::absolute(spec.path).lexically_normal().string();
  j["workload_path"] = spec.workload_path;
  j["build"] = build_id();
  j["rate_key"] = spec.rate_key;
  if (spec.capacity)
    j["capacity"] = capacity_json(*spec.capacity);
  else
    j["rates"] = spec.rates;
  if (spec.cost) j["cost"] = cost_json(*spec.cost);
  j["count"] = points.size();
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : points) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& o : p.params) params.push_back({o.key, o.value});
    pts.push_back(
        {{"index", p.index}, {"key", p.key}, {"name", p.name}, {"params", params}, {"workload", p.workload_yaml}});
  }
  j["points"] = pts;
  return j;
}

SweepPlan read_plan(const std::string& path) {
  const std::string text = read_text(path, "sweep plan");
  nlohmann::json j;
  try {
    j = parse_json_strict(text);
  } catch (const JsonDuplicateKey& e) {
    throw InputError(fmt::format("{}: key '{}' appears twice in one object", path, e.key));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  const auto bad = [&](const std::string& what) -> InputError {
    return InputError(fmt::format("{}: {} (not a plan written by tandem sweep plan)", path, what));
  };
  if (!j.is_object() || j.value("format", "") != "tandem-sweep-plan") throw bad("no 'format': 'tandem-sweep-plan'");
  if (j.value("version", 0) != 1) throw bad("unknown version (this build reads version 1)");
  SweepPlan p;
  try {
    p.sweep_path = j.at("sweep").get<std::string>();
    p.rate_key = j.at("rate_key").get<std::string>();
    p.build = j.at("build").get<std::string>();
    if (j.contains("capacity")) {
      const auto& c = j.at("capacity");
      CapacitySpec cap;
      const auto& slo = c.at("slo");
      if (slo.contains("ttft_p99_ms")) cap.slo.ttft_p99_ms = slo.at("ttft_p99_ms").get<double>();
      if (slo.contains("tpot_p99_ms")) cap.slo.tpot_p99_ms = slo.at("tpot_p99_ms").get<double>();
      if (slo.contains("itl_p99_ms")) cap.slo.itl_p99_ms = slo.at("itl_p99_ms").get<double>();
      if (slo.contains("goodput_min")) cap.slo.goodput_min = slo.at("goodput_min").get<double>();
      cap.lo = c.at("lo").get<double>();
      cap.hi = c.at("hi").get<double>();
      cap.tolerance = c.at("tolerance").get<double>();
      cap.probes = c.at("probes").get<int32_t>();
      if (!(cap.lo > 0 && cap.hi > cap.lo && cap.tolerance > 0 && cap.probes >= 1 && cap.probes <= 64))
        throw bad("capacity: lo, hi, tolerance or probes out of range");
      p.capacity = cap;
    } else {
      p.rates = j.at("rates").get<std::vector<double>>();
      if (p.rates.empty()) throw bad("no rates");
    }
    if (j.contains("cost")) {
      const auto& c = j.at("cost");
      CostSpec cost;
      cost.gpu_hour_usd = c.at("gpu_hour_usd").get<std::map<std::string, double>>();
      cost.example_prices = c.at("example_prices").get<bool>();
      if (c.contains("at_rate")) cost.at_rate = c.at("at_rate").get<double>();
      for (const auto& [name, usd] : cost.gpu_hour_usd)
        if (!(usd > 0)) throw bad(fmt::format("cost: the price of '{}' is not positive", name));
      p.cost = cost;
    }
    p.workload_path = j.at("workload_path").get<std::string>();
    for (const auto& pt : j.at("points")) {
      SweepPoint sp;
      sp.index = pt.at("index").get<int64_t>();
      if (sp.index != int64_t(p.points.size())) throw bad(fmt::format("point {} out of order", sp.index));
      sp.key = pt.at("key").get<std::string>();
      sp.name = pt.at("name").get<std::string>();
      for (const auto& kv : pt.at("params"))
        sp.params.push_back({kv.at(0).get<std::string>(), kv.at(1).get<std::string>()});
      sp.workload_yaml = pt.at("workload").get<std::string>();
      p.points.push_back(std::move(sp));
    }
    if (j.at("count").get<size_t>() != p.points.size()) throw bad("'count' differs from the number of points");
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("malformed: {}", e.what()));
  }
  for (const auto& pt : p.points)
    for (const auto& o : pt.params)
      if (std::find(p.param_keys.begin(), p.param_keys.end(), o.key) == p.param_keys.end())
        p.param_keys.push_back(o.key);
  return p;
}

}  // namespace tandem
