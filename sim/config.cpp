#include "sim/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/checkpoint.h"
#include "sim/csv.h"
#include "sim/yaml_reader.h"

namespace tandem {
namespace {

constexpr int64_t kI32Max = INT32_MAX;
constexpr double kHuge = 1e300;

void load_empirical(DistSpec& d, const Field& f);

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
    f["dist"].fail(fmt::format("unknown distribution '{}' (known: fixed, uniform, lognormal, mixture, empirical)", kind));
  }
  return d;
}

void load_empirical(DistSpec& d, const Field& f) {
  try {
    require_regular_file(d.path);
  } catch (const InputError& e) {
    f["path"].fail(e.what());
  }
  CsvFile csv(d.path);
  const size_t col = csv.column_index(d.column);
  if (col == CsvFile::npos) f["column"].fail(fmt::format("column '{}' not in {} (header: {})", d.column, d.path, csv.header_text()));
  std::vector<std::string> row;
  while (csv.next(row)) d.samples.push_back(csv.number(row, col, 0, kHuge));
  if (d.samples.empty()) f["path"].fail(fmt::format("{} has no rows", d.path));
}

ModelSpec parse_model(const Field& f) {
  ModelSpec m;
  if (!f.present()) f.fail(fmt::format("missing (a preset name: {}; or an inline spec)", model_preset_names()));
  if (f.is_scalar()) {
    auto p = model_preset(f.as_string());
    if (!p) f.fail(fmt::format("unknown model preset '{}' (known: {})", f.as_string(), model_preset_names()));
    return *p;
  }
  f.expect_map({"preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype", "max_model_len",
                "rope_theta", "rms_norm_eps", "checkpoint"});
  if (f.has("checkpoint")) {  // shape from the checkpoint's config.json; weights loaded by the backend
    for (const char* k : {"preset", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "rope_theta", "rms_norm_eps"})
      if (f.has(k)) f[k].fail("comes from the checkpoint's config.json; remove it");
    m.checkpoint = f["checkpoint"].as_path();
    m.name = f.get_string("name", std::filesystem::path(m.checkpoint).filename().string());
    m.dtype = "fp32";
    const HfLlamaConfig c = Checkpoint(m.checkpoint).config();
    m.max_model_len = int32_t(f.get_int("max_model_len", c.max_position_embeddings, 1, c.max_position_embeddings));
    apply_hf_config(c, m);
    m.dtype = f.get_string("dtype", m.dtype);
    return m;
  }
  if (f.has("preset")) {
    auto p = model_preset(f["preset"].as_string());
    if (!p) f["preset"].fail(fmt::format("unknown model preset '{}' (known: {})", f["preset"].as_string(), model_preset_names()));
    m = *p;
  } else {
    m.name = "custom";
    for (const char* k : {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_model_len"})
      if (!f.has(k)) f[k].fail("missing (an inline model needs layers, hidden, heads, kv_heads, ffn, vocab, max_model_len)");
  }
  m.name = f.get_string("name", m.name);
  m.layers = int32_t(f.get_int("layers", m.layers, 1, 4096));
  m.hidden = int32_t(f.get_int("hidden", m.hidden, 1, 1 << 20));
  m.heads = int32_t(f.get_int("heads", m.heads, 1, 4096));
  m.kv_heads = int32_t(f.get_int("kv_heads", m.kv_heads, 1, 4096));
  m.ffn = int32_t(f.get_int("ffn", m.ffn, 1, 1 << 22));
  m.vocab = int32_t(f.get_int("vocab", m.vocab, 2, kI32Max));
  m.max_model_len = int32_t(f.get_int("max_model_len", m.max_model_len, 1, kI32Max));
  m.dtype = f.get_string("dtype", m.dtype);
  m.rope_theta = f.get_double("rope_theta", m.rope_theta, 1, 1e12);
  m.rms_norm_eps = f.get_double("rms_norm_eps", m.rms_norm_eps, 1e-12, 1);
  if (m.dtype != "bf16" && m.dtype != "fp16" && m.dtype != "fp32" && m.dtype != "fp8")
    f["dtype"].fail(fmt::format("unknown dtype '{}' (known: bf16, fp16, fp32, fp8)", m.dtype));
  if (m.hidden % m.heads != 0) f["heads"].fail(fmt::format("hidden ({}) must be divisible by heads ({})", m.hidden, m.heads));
  if (m.heads % m.kv_heads != 0) f["kv_heads"].fail(fmt::format("heads ({}) must be divisible by kv_heads ({})", m.heads, m.kv_heads));
  return m;
}

FittedCoefficients parse_fitted(const Field& f) {
  f.expect_map({"backend", "model", "threads", "overhead_us", "per_token_us", "per_seq_us", "per_attn_pair_ns",
                "per_context_token_ns", "per_sample_us", "idle_factor"});
  FittedCoefficients c;
  c.backend = f["backend"].as_string();
  c.model = f["model"].as_string();
  c.threads = int32_t(f.get_int("threads", 0, 0, 1 << 16));
  c.overhead_s = f["overhead_us"].as_double(0, 1e12) * 1e-6;
  c.per_token_s = f["per_token_us"].as_double(0, 1e12) * 1e-6;
  c.per_seq_s = f["per_seq_us"].as_double(0, 1e12) * 1e-6;
  c.per_attn_pair_s = f["per_attn_pair_ns"].as_double(0, 1e12) * 1e-9;
  c.per_context_token_s = f["per_context_token_ns"].as_double(0, 1e12) * 1e-9;
  c.per_sample_s = f["per_sample_us"].as_double(0, 1e12) * 1e-6;
  c.idle_factor = f.get_double("idle_factor", 1.0, 0.1, 100);
  return c;
}

HardwareSpec parse_hardware_map(const Field& f, HardwareSpec h) {
  f.expect_map({"preset", "name", "peak_tflops", "mem_bandwidth_tbs", "step_overhead_us", "memory_gb", "fitted",
                "link_bandwidth_gbs", "link_latency_us"});
  if (f.has("fitted")) {  // a calibrated profile: the fitted model needs no roofline numbers
    h.name = f.get_string("name", "fitted");
    h.fitted = parse_fitted(f["fitted"]);
    h.memory_bytes = f.get_double("memory_gb", 0, 0, 1e9) * 1e9;
    h.source = fmt::format("fitted to measured {} steps ({} threads)", h.fitted->backend, h.fitted->threads);
    return h;
  }
  if (f.has("preset")) {
    auto p = hardware_preset(f["preset"].as_string());
    if (!p) f["preset"].fail(fmt::format("unknown hardware preset '{}' (known: {})", f["preset"].as_string(), hardware_preset_names()));
    h = *p;
  } else if (h.name.empty()) {
    h.name = "custom";
    for (const char* k : {"peak_tflops", "mem_bandwidth_tbs", "step_overhead_us", "memory_gb"})
      if (!f.has(k)) f[k].fail("missing (inline hardware needs peak_tflops, mem_bandwidth_tbs, step_overhead_us, memory_gb)");
    h.source = "workload file";
  }
  h.name = f.get_string("name", h.name);
  h.peak_flops = f.get_double("peak_tflops", h.peak_flops / 1e12, 1e-6, 1e9) * 1e12;
  h.mem_bandwidth = f.get_double("mem_bandwidth_tbs", h.mem_bandwidth / 1e12, 1e-9, 1e6) * 1e12;
  h.step_overhead_s = f.get_double("step_overhead_us", h.step_overhead_s * 1e6, 0, 1e9) * 1e-6;
  h.memory_bytes = f.get_double("memory_gb", h.memory_bytes / 1e9, 1e-6, 1e9) * 1e9;
  h.link_bandwidth = f.get_double("link_bandwidth_gbs", h.link_bandwidth / 1e9, 0, 1e9) * 1e9;
  h.link_latency_s = f.get_double("link_latency_us", h.link_latency_s * 1e6, 0, 1e9) * 1e-6;
  return h;
}

HardwareSpec parse_hardware(const Field& f) {
  if (!f.present()) f.fail(fmt::format("missing (a preset name: {}; an inline spec; or a profile .yaml)", hardware_preset_names()));
  if (f.is_scalar()) {
    const std::string s = f.as_string();
    if (s.ends_with(".yaml") || s.ends_with(".yml")) {  // a hardware profile file
      const std::string path = f.as_path();
      try {
        require_regular_file(path);
      } catch (const InputError& e) {
        f.fail(fmt::format("hardware profile: {}", e.what()));
      }
      YAML::Node root;
      try {
        root = YAML::LoadFile(path);
      } catch (const YAML::BadFile&) {
        f.fail(fmt::format("cannot read hardware profile '{}'", path));
      } catch (const YAML::Exception& e) {
        throw InputError(fmt::format("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
      }
      const YamlSource src{path, {}, {}};  // the profile's errors name the profile file
      return parse_hardware_map(Field(root, "hardware", &src), {});
    }
    auto p = hardware_preset(s);
    if (!p) f.fail(fmt::format("unknown hardware preset '{}' (known: {}; or a profile file ending in .yaml)", s, hardware_preset_names()));
    return *p;
  }
  return parse_hardware_map(f, {});
}

EngineSpec parse_engine(const Field& f) {
  EngineSpec e;
  if (!f.present()) return e;
  f.expect_map({"policy", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "kv_memory_gb",
                "gpu_memory_utilization", "state_slots", "deterministic", "tp", "cuda_graph", "cuda_attention"});
  const std::string pol = f.get_string("policy", "continuous");
  if (pol == "continuous") e.policy = BatchingPolicy::Continuous;
  else if (pol == "static") e.policy = BatchingPolicy::Static;
  else f["policy"].fail(fmt::format("unknown policy '{}' (known: static, continuous)", pol));
  e.max_num_seqs = int32_t(f.get_int("max_num_seqs", e.max_num_seqs, 1, 1 << 20));
  e.max_num_batched_tokens = int32_t(f.get_int("max_num_batched_tokens", e.max_num_batched_tokens, 1, kI32Max));
  e.block_size = int32_t(f.get_int("block_size", e.block_size, 1, 1 << 16));
  e.num_kv_blocks = f.get_int("num_kv_blocks", 0, 1, kI32Max);
  e.kv_memory_gb = f.get_double("kv_memory_gb", 0, 1e-9, 1e9);
  e.gpu_memory_utilization = f.get_double("gpu_memory_utilization", e.gpu_memory_utilization, 0.01, 1.0);
  e.state_slots = int32_t(f.get_int("state_slots", -1, 0, kI32Max));
  if (f.has("deterministic")) e.deterministic = f["deterministic"].as_bool();
  if (f.has("cuda_graph")) e.cuda_graph = f["cuda_graph"].as_bool();
  e.cuda_attention = f.get_string("cuda_attention", e.cuda_attention);
  if (e.cuda_attention != "simt" && e.cuda_attention != "mma")
    f["cuda_attention"].fail(fmt::format("unknown attention kernel '{}' (known: simt, mma)", e.cuda_attention));
  e.tp = int32_t(f.get_int("tp", 1, 1, 1024));
  if (f.has("num_kv_blocks") && f.has("kv_memory_gb")) f["kv_memory_gb"].fail("give num_kv_blocks or kv_memory_gb, not both");
  return e;
}

ArrivalSpec parse_arrival(const Field& f) {
  ArrivalSpec a;
  const std::string p = f["process"].as_string();
  if (p == "poisson") {
    f.expect_map({"process", "rate"});
    a.kind = ArrivalSpec::Kind::Poisson;
    a.rate = f["rate"].as_double(1e-9, 1e9);
  } else if (p == "gamma") {
    f.expect_map({"process", "rate", "cv"});
    a.kind = ArrivalSpec::Kind::Gamma;
    a.rate = f["rate"].as_double(1e-9, 1e9);
    a.cv = f["cv"].as_double(1e-3, 1e3);
  } else if (p == "constant") {
    f.expect_map({"process", "rate"});
    a.kind = ArrivalSpec::Kind::Constant;
    a.rate = f["rate"].as_double(1e-9, 1e9);
  } else if (p == "burst") {
    f.expect_map({"process", "size", "interval_s"});
    a.kind = ArrivalSpec::Kind::Burst;
    a.burst_size = f.get_int("size", 0, 1, INT64_MAX);
    a.interval_s = f.get_double("interval_s", 0, 0, 1e9);
    if (a.burst_size > 0 && !f.has("interval_s")) f["interval_s"].fail("missing (bursts of a given size need the time between them)");
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
  if (fmt_name == "azure") t.format = TraceSpec::Format::Azure;
  else if (fmt_name == "mooncake") t.format = TraceSpec::Format::Mooncake;
  else if (fmt_name == "vidur") t.format = TraceSpec::Format::Vidur;
  else f["format"].fail(fmt::format("unknown trace format '{}' (known: azure, mooncake, vidur)", fmt_name));
  t.path = f["path"].as_path();
  try {
    require_regular_file(t.path);
  } catch (const InputError& e) {
    f["path"].fail(e.what());
  }
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
      e.expect_map({"request", "at_s"});
      c.explicit_cancels.push_back({e["request"].as_int(0, INT64_MAX), e["at_s"].as_double(0, 1e12)});
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
    s.expect_map({"groups", "prefix_len", "fraction"});
    r.shared_prefix.groups = int32_t(s["groups"].as_int(1, 10'000'000));
    r.shared_prefix.prefix_len = parse_dist(s["prefix_len"], "", 1);
    r.shared_prefix.fraction = s.get_double("fraction", 1.0, 0, 1);
  }
  if (f.has("cancel")) {
    r.cancel = parse_cancel(f["cancel"]);
    if (!r.trace)
      for (size_t i = 0; i < r.cancel.explicit_cancels.size(); ++i)
        if (r.cancel.explicit_cancels[i].request >= r.count)
          f["cancel"]["at"].items()[i]["request"].fail(fmt::format("{} is beyond the last request ({})",
                                                                 r.cancel.explicit_cancels[i].request, r.count - 1));
  }
  return r;
}

// Apply `--set a.b.c=value`: the value is parsed as YAML, so numbers, strings and
// mappings all work. Intermediate mappings are created; unknown keys are caught by the parser.
void apply_override(YAML::Node& root, const Override& o, YamlSource& src) {
  if (o.key.empty()) throw InputError(fmt::format("{}: --set: empty key", src.file));
  std::vector<std::string> parts;
  std::stringstream ss(o.key);
  for (std::string p; std::getline(ss, p, '.');) {
    if (p.empty()) throw InputError(fmt::format("{}: --set {}={}: empty path component", src.file, o.key, o.value));
    parts.push_back(p);
  }
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: --set {}={}: value is not valid YAML: {}", src.file, o.key, o.value, e.msg));
  }
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (next.IsDefined() && !next.IsNull() && !next.IsMap()) {
      // e.g. `hardware: h200` then `--set hardware.step_overhead_us=...`: expand the preset.
      if (next.IsScalar()) {
        YAML::Node m(YAML::NodeType::Map);
        m["preset"] = next.Scalar();
        chain.back()[parts[i]] = m;
        next = chain.back()[parts[i]];
      } else {
        throw InputError(fmt::format("{}: --set {}={}: '{}' is not a mapping", src.file, o.key, o.value, parts[i]));
      }
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
  src.override_keys.push_back(o.key);
  src.override_texts.push_back(o.key + "=" + o.value);
}

}  // namespace

Workload parse_workload(const std::string& text, const std::string& path, const std::vector<Override>& overrides) {
  YamlSource src{path, {}, {}};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}:{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw InputError(fmt::format("{}:1:1: a workload is a mapping of name, seed, model, hardware, engine, requests, slo", path));
  for (const auto& o : overrides) apply_override(root, o, src);

  const Field top(root, "", &src);
  top.expect_map({"name", "seed", "model", "hardware", "engine", "requests", "slo"});
  Workload w;
  w.path = path;
  w.name = top.get_string("name", std::filesystem::path(path).stem().string());
  w.seed = static_cast<uint64_t>(top.get_int("seed", 0, 0, INT64_MAX));
  w.model = parse_model(top["model"]);
  w.hardware = parse_hardware(top["hardware"]);
  if (w.hardware.fitted && w.hardware.fitted->model != w.model.name)
    top["hardware"].fail(fmt::format("the profile was fitted on model '{}', but the workload's model is '{}'",
                                     w.hardware.fitted->model, w.model.name));
  w.engine = parse_engine(top["engine"]);
  if (const int32_t tp = w.engine.tp; tp > 1) {
    const Field f = top["engine"]["tp"];
    if (!w.hardware.fitted && w.hardware.link_bandwidth <= 0)
      f.fail("tensor parallelism needs hardware.link_bandwidth_gbs (the all-reduces go over it)");
    if (w.model.heads % tp) f.fail(fmt::format("{} does not divide the model's heads ({})", tp, w.model.heads));
    if (w.model.kv_heads % tp) f.fail(fmt::format("{} does not divide the model's KV heads ({})", tp, w.model.kv_heads));
    if (w.model.ffn % tp) f.fail(fmt::format("{} does not divide the model's ffn ({})", tp, w.model.ffn));
  }
  w.requests = parse_requests(top["requests"]);
  if (top.has("slo")) {
    const Field s = top["slo"];
    s.expect_map({"ttft_ms", "tpot_ms"});
    w.slo.ttft_ms = s.get_double("ttft_ms", 0, 1e-9, 1e12);
    w.slo.tpot_ms = s.get_double("tpot_ms", 0, 1e-9, 1e12);
  }

  // Resolve the KV cache size.
  EngineSpec& e = w.engine;
  const double block_bytes = double(e.block_size) * w.model.kv_bytes_per_token();
  double blocks = 0;
  if (e.num_kv_blocks > 0) {
    blocks = double(e.num_kv_blocks);
  } else {
    const double budget = e.kv_memory_gb > 0 ? e.kv_memory_gb * 1e9
                                             : w.hardware.memory_bytes * e.gpu_memory_utilization - w.model.weight_bytes();
    if (budget <= 0)
      top["engine"].fail(fmt::format("the model's weights ({:.1f} GB) leave no memory for the KV cache "
                                     "({:.1f} GB x gpu_memory_utilization {}); set engine.kv_memory_gb or engine.num_kv_blocks",
                                     w.model.weight_bytes() / 1e9, w.hardware.memory_bytes / 1e9, e.gpu_memory_utilization));
    blocks = std::floor(budget / block_bytes);
  }
  if (blocks < 1) top["engine"].fail("the KV cache holds no block (raise kv_memory_gb or num_kv_blocks)");
  // The block pool's bookkeeping is 8 bytes a block: cap it at 2^27 blocks (1 GB).
  constexpr double kMaxBlocks = double(1 << 27);
  if (blocks > kMaxBlocks)
    top["engine"].fail(fmt::format("the KV cache would have {:.0f} blocks; at most {:.0f} are supported "
                                   "(raise block_size, or lower num_kv_blocks / kv_memory_gb)", blocks, kMaxBlocks));
  e.resolved_kv_blocks = static_cast<int32_t>(std::min(blocks, double(kI32Max)));
  return w;
}

Workload load_workload(const std::string& path, const std::vector<Override>& overrides) {
  require_regular_file(path);
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open workload file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_workload(ss.str(), path, overrides);
}

namespace {
// Shortest text that reads back as the same double (yaml-cpp would print 17 digits).
std::string num(double v) { return fmt::format("{:.12g}", v); }

YAML::Node dist_yaml(const DistSpec& d) {
  YAML::Node n;
  switch (d.kind) {
    case DistSpec::Kind::Fixed: n["dist"] = "fixed"; n["value"] = num(d.value); break;
    case DistSpec::Kind::Uniform: n["dist"] = "uniform"; n["min"] = num(d.min); n["max"] = num(d.max); break;
    case DistSpec::Kind::Lognormal:
      n["dist"] = "lognormal"; n["median"] = num(d.median); n["sigma"] = num(d.sigma); n["min"] = num(d.min);
      if (d.max < 1e18) n["max"] = num(d.max);
      break;
    case DistSpec::Kind::Mixture:
      n["dist"] = "mixture";
      for (const auto& c : d.components) {
        YAML::Node cn = dist_yaml(c.dist);
        cn["weight"] = num(c.weight);
        n["components"].push_back(cn);
      }
      break;
    case DistSpec::Kind::Empirical:
      n["dist"] = "empirical"; n["path"] = d.path; n["column"] = d.column; break;
  }
  return n;
}
}  // namespace

std::string to_yaml(const Workload& w) {
  YAML::Node n;
  n["name"] = w.name;
  n["seed"] = w.seed;
  const ModelSpec& m = w.model;
  n["model"]["name"] = m.name;
  n["model"]["layers"] = m.layers;
  n["model"]["hidden"] = m.hidden;
  n["model"]["heads"] = m.heads;
  n["model"]["kv_heads"] = m.kv_heads;
  n["model"]["ffn"] = m.ffn;
  n["model"]["vocab"] = m.vocab;
  n["model"]["dtype"] = m.dtype;
  n["model"]["max_model_len"] = m.max_model_len;
  if (!m.checkpoint.empty()) {
    for (const char* k : {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab"}) n["model"].remove(k);
    n["model"]["checkpoint"] = m.checkpoint;
  } else {
    n["model"]["rope_theta"] = num(m.rope_theta);
    n["model"]["rms_norm_eps"] = num(m.rms_norm_eps);
  }
  const HardwareSpec& h = w.hardware;
  n["hardware"]["name"] = h.name;
  if (h.fitted) {
    const FittedCoefficients& c = *h.fitted;
    n["hardware"]["fitted"]["backend"] = c.backend;
    n["hardware"]["fitted"]["model"] = c.model;
    n["hardware"]["fitted"]["threads"] = c.threads;
    n["hardware"]["fitted"]["overhead_us"] = num(c.overhead_s * 1e6);
    n["hardware"]["fitted"]["per_token_us"] = num(c.per_token_s * 1e6);
    n["hardware"]["fitted"]["per_seq_us"] = num(c.per_seq_s * 1e6);
    n["hardware"]["fitted"]["per_attn_pair_ns"] = num(c.per_attn_pair_s * 1e9);
    n["hardware"]["fitted"]["per_context_token_ns"] = num(c.per_context_token_s * 1e9);
    n["hardware"]["fitted"]["per_sample_us"] = num(c.per_sample_s * 1e6);
    n["hardware"]["fitted"]["idle_factor"] = num(c.idle_factor);
    n["hardware"]["memory_gb"] = num(h.memory_bytes / 1e9);
  } else {
    n["hardware"]["peak_tflops"] = num(h.peak_flops / 1e12);
    n["hardware"]["mem_bandwidth_tbs"] = num(h.mem_bandwidth / 1e12);
    n["hardware"]["step_overhead_us"] = num(h.step_overhead_s * 1e6);
    n["hardware"]["memory_gb"] = num(h.memory_bytes / 1e9);
    n["hardware"]["link_bandwidth_gbs"] = num(h.link_bandwidth / 1e9);
    n["hardware"]["link_latency_us"] = num(h.link_latency_s * 1e6);
  }
  const EngineSpec& e = w.engine;
  n["engine"]["policy"] = std::string(to_string(e.policy));
  n["engine"]["max_num_seqs"] = e.max_num_seqs;
  n["engine"]["max_num_batched_tokens"] = e.max_num_batched_tokens;
  n["engine"]["block_size"] = e.block_size;
  n["engine"]["num_kv_blocks"] = e.resolved_kv_blocks;
  n["engine"]["gpu_memory_utilization"] = num(e.gpu_memory_utilization);
  if (e.state_slots >= 0) n["engine"]["state_slots"] = e.state_slots;
  n["engine"]["deterministic"] = e.deterministic;
  n["engine"]["cuda_graph"] = e.cuda_graph;
  n["engine"]["cuda_attention"] = e.cuda_attention;
  n["engine"]["tp"] = e.tp;
  const RequestsSpec& r = w.requests;
  if (r.trace) {
    const TraceSpec& t = *r.trace;
    static const char* fmts[] = {"azure", "mooncake", "vidur"};
    n["requests"]["trace"]["format"] = fmts[int(t.format)];
    n["requests"]["trace"]["path"] = t.path;
    n["requests"]["trace"]["time_scale"] = num(t.time_scale);
    n["requests"]["trace"]["rate_scale"] = num(t.rate_scale);
    n["requests"]["trace"]["start_s"] = num(t.start_s);
    n["requests"]["trace"]["duration_s"] = num(t.duration_s);
    n["requests"]["trace"]["limit"] = t.limit;
    n["requests"]["trace"]["hash_block_size"] = t.hash_block_size;
  } else {
    static const char* procs[] = {"poisson", "gamma", "constant", "burst"};
    n["requests"]["count"] = r.count;
    n["requests"]["arrival"]["process"] = procs[int(r.arrival.kind)];
    if (r.arrival.kind == ArrivalSpec::Kind::Burst) {
      if (r.arrival.burst_size > 0) {
        n["requests"]["arrival"]["size"] = r.arrival.burst_size;
        n["requests"]["arrival"]["interval_s"] = num(r.arrival.interval_s);
      }
    } else {
      n["requests"]["arrival"]["rate"] = num(r.arrival.rate);
      if (r.arrival.kind == ArrivalSpec::Kind::Gamma) n["requests"]["arrival"]["cv"] = num(r.arrival.cv);
    }
    n["requests"]["prompt_len"] = dist_yaml(r.prompt_len);
    n["requests"]["output_len"] = dist_yaml(r.output_len);
  }
  if (r.shared_prefix.groups > 0) {
    n["requests"]["shared_prefix"]["groups"] = r.shared_prefix.groups;
    n["requests"]["shared_prefix"]["prefix_len"] = dist_yaml(r.shared_prefix.prefix_len);
    n["requests"]["shared_prefix"]["fraction"] = num(r.shared_prefix.fraction);
  }
  if (!r.cancel.explicit_cancels.empty() || r.cancel.fraction > 0) {
    for (const auto& c : r.cancel.explicit_cancels) {
      YAML::Node cn;
      cn["request"] = c.request;
      cn["at_s"] = num(c.at_s);
      n["requests"]["cancel"]["at"].push_back(cn);
    }
    if (r.cancel.fraction > 0) {
      n["requests"]["cancel"]["fraction"] = num(r.cancel.fraction);
      n["requests"]["cancel"]["after_s"] = dist_yaml(r.cancel.after_s);
    }
  }
  if (w.slo.any()) {
    if (w.slo.ttft_ms > 0) n["slo"]["ttft_ms"] = num(w.slo.ttft_ms);
    if (w.slo.tpot_ms > 0) n["slo"]["tpot_ms"] = num(w.slo.tpot_ms);
  }
  YAML::Emitter out;
  out << n;
  // Derived values as comments, so the output stays a valid workload (paths are resolved).
  return fmt::format("{}\n# derived: model {:.3f} B parameters, {:.0f} bytes of KV per token; KV cache {} tokens "
                     "({:.1f} GB)\n# hardware numbers: {}\n",
                     out.c_str(), m.params() / 1e9, m.kv_bytes_per_token(), int64_t{e.resolved_kv_blocks} * e.block_size,
                     double(e.resolved_kv_blocks) * e.block_size * m.kv_bytes_per_token() / 1e9,
                     h.source.empty() ? "given in the workload" : h.source);
}

}  // namespace tandem
