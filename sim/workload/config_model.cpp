// The workload's model and hardware sections: parsing (presets, inline specs, checkpoint
// config.json, hardware profile files) and the resolved YAML that `tandem validate` prints.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <fstream>
#include <sstream>

#include <filesystem>

#include "backend/cpu/checkpoint.h"
#include "sim/workload/config_sections.h"
#include "sim/base/csv.h"

namespace tandem::config_detail {

ModelSpec parse_model(const Field& f) {
  ModelSpec m;
  if (!f.present()) f.fail(fmt::format("missing (a preset name: {}; or an inline spec)", model_preset_names()));
  if (f.is_scalar()) {
    auto p = model_preset(f.as_string());
    if (!p) f.fail(fmt::format("unknown model preset '{}' (known: {})", f.as_string(), model_preset_names()));
    return *p;
  }
  f.expect_map({"preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype", "max_model_len",
                "rope_theta", "rms_norm_eps", "checkpoint", "mlp", "positions", "tie_embeddings"});
  if (f.has("checkpoint")) {  // shape from the checkpoint's config.json; weights loaded by the backend
    for (const char* k : {"preset", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "rope_theta",
                          "rms_norm_eps", "mlp", "positions", "tie_embeddings"})
      if (f.has(k)) f[k].fail("comes from the checkpoint's config.json; remove it");
    m.checkpoint = f["checkpoint"].as_path();
    m.name = f.get_string("name", std::filesystem::path(m.checkpoint).filename().string());
    m.dtype = "fp32";
    HfLlamaConfig c;
    try {
      c = Checkpoint(m.checkpoint).config();
    } catch (const InputError& e) {  // named against the field that points at the folder
      f["checkpoint"].fail(e.what());
    }
    m.max_model_len = int32_t(f.get_int("max_model_len", c.max_position_embeddings, 1, c.max_position_embeddings));
    apply_hf_config(c, m);
    m.dtype = f.get_string("dtype", m.dtype);
    return m;
  }
  if (f.has("preset")) {
    auto p = model_preset(f["preset"].as_string());
    if (!p)
      f["preset"].fail(
          fmt::format("unknown model preset '{}' (known: {})", f["preset"].as_string(), model_preset_names()));
    m = *p;
  } else {
    m.name = "custom";
    for (const char* k : {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_model_len"})
      if (!f.has(k))
        f[k].fail("missing (an inline model needs layers, hidden, heads, kv_heads, ffn, vocab, max_model_len)");
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
  m.mlp = f.get_string("mlp", m.mlp);
  if (m.mlp != "swiglu" && m.mlp != "gelu" && m.mlp != "relu")
    f["mlp"].fail(fmt::format("unknown MLP '{}' (known: swiglu (gate, up, down), gelu and relu (up, down))", m.mlp));
  m.positions = f.get_string("positions", m.positions);
  if (m.positions != "rope" && m.positions != "learned")
    f["positions"].fail(fmt::format("unknown positions '{}' (known: rope, learned)", m.positions));
  if (f.has("tie_embeddings")) m.tie_embeddings = f["tie_embeddings"].as_bool();
  if (m.dtype != "bf16" && m.dtype != "fp16" && m.dtype != "fp32" && m.dtype != "fp8")
    f["dtype"].fail(fmt::format("unknown dtype '{}' (known: bf16, fp16, fp32, fp8)", m.dtype));
  if (m.hidden % m.heads != 0)
    f["heads"].fail(fmt::format("hidden ({}) must be divisible by heads ({})", m.hidden, m.heads));
  if (m.heads % m.kv_heads != 0)
    f["kv_heads"].fail(fmt::format("heads ({}) must be divisible by kv_heads ({})", m.heads, m.kv_heads));
  if (m.head_dim() % 2 != 0)
    f["heads"].fail(
        fmt::format("the head dim hidden / heads = {} / {} = {} must be even (RoPE rotates pairs of dimensions)",
                    m.hidden, m.heads, m.head_dim()));
  return m;
}

YAML::Node model_yaml(const ModelSpec& m) {
  YAML::Node n;
  n["name"] = m.name;
  n["layers"] = m.layers;
  n["hidden"] = m.hidden;
  n["heads"] = m.heads;
  n["kv_heads"] = m.kv_heads;
  n["ffn"] = m.ffn;
  n["vocab"] = m.vocab;
  n["dtype"] = m.dtype;
  n["max_model_len"] = m.max_model_len;
  if (!m.checkpoint.empty()) {  // the shape comes from config.json: the checkpoint alone reads back the same
    for (const char* k : {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab"}) n.remove(k);
    n["checkpoint"] = yaml_path(m.checkpoint);
  } else {
    n["rope_theta"] = yaml_number(m.rope_theta);
    n["rms_norm_eps"] = yaml_number(m.rms_norm_eps);
    // Absent at the Llama defaults (swiglu, rope, untied): those models print as before; the
    // others read back to the same shape without their preset.
    if (m.mlp != "swiglu") n["mlp"] = m.mlp;
    if (m.positions != "rope") n["positions"] = m.positions;
    if (m.tie_embeddings) n["tie_embeddings"] = true;
  }
  return n;
}

namespace {

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

// An inline hardware mapping, or the top level of a profile file (same keys).
HardwareSpec parse_hardware_map(const Field& f, HardwareSpec h) {
  f.expect_map({"preset", "name", "peak_tflops", "mem_bandwidth_tbs", "step_overhead_us", "memory_gb", "fitted",
                "profiled", "link_bandwidth_gbs", "link_latency_us"});
  if (f.has("fitted") && f.has("profiled")) f["profiled"].fail("a profile is either fitted or profiled, not both");
  if (f.has("profiled")) {  // per-operator tables measured on a backend: no roofline numbers either
    for (const char* k :
         {"preset", "peak_tflops", "mem_bandwidth_tbs", "step_overhead_us", "link_bandwidth_gbs", "link_latency_us"})
      if (f.has(k)) f[k].fail("a profiled hardware profile takes its step times from its measured table; remove it");
    h.name = f.get_string("name", "profiled");
    h.profiled = parse_profiled(f["profiled"]);
    h.memory_bytes = f.get_double("memory_gb", 0, 0, 1e9) * 1e9;
    const OperatorProfile& p = *h.profiled;
    h.source = fmt::format("profiled: {} steps measured on the {} backend ({}; code {}; {})", p.raw.size(), p.backend,
                           p.hardware.empty() ? "hardware not recorded" : p.hardware,
                           p.code_version.empty() ? "unknown" : p.code_version, p.measured_at);
    return h;
  }
  if (f.has("fitted")) {  // a calibrated profile: the fitted model needs no roofline numbers
    h.name = f.get_string("name", "fitted");
    h.fitted = parse_fitted(f["fitted"]);
    h.memory_bytes = f.get_double("memory_gb", 0, 0, 1e9) * 1e9;
    h.source = fmt::format("fitted to measured {} steps ({} threads)", h.fitted->backend, h.fitted->threads);
    return h;
  }
  if (f.has("preset")) {
    auto p = hardware_preset(f["preset"].as_string());
    if (!p)
      f["preset"].fail(
          fmt::format("unknown hardware preset '{}' (known: {})", f["preset"].as_string(), hardware_preset_names()));
    h = *p;
  } else if (h.name.empty()) {
    h.name = "custom";
    for (const char* k : {"peak_tflops", "mem_bandwidth_tbs", "step_overhead_us", "memory_gb"})
      if (!f.has(k))
        f[k].fail("missing (inline hardware needs peak_tflops, mem_bandwidth_tbs, step_overhead_us, memory_gb)");
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

}  // namespace

HardwareSpec parse_hardware(const Field& f, const HardwareSpec& base) {
  // Over a roofline base only: a profile's measured tables would ignore the numbers given here.
  if (f.is_map() && !base.fitted && !base.profiled) {
    HardwareSpec h = parse_hardware_map(f, base);
    if (!f.has("preset") && !f.has("fitted") && !f.has("profiled"))
      h.source =
          fmt::format("{}; this instance's numbers as given", base.source.empty() ? "workload file" : base.source);
    return h;
  }
  return parse_hardware(f);
}

HardwareSpec parse_hardware(const Field& f) {
  if (!f.present())
    f.fail(fmt::format("missing (a preset name: {}; an inline spec; or a profile .yaml)", hardware_preset_names()));
  if (f.is_scalar()) {
    const std::string s = f.as_string();
    if (s.ends_with(".yaml") || s.ends_with(".yml")) {  // a hardware profile file
      const std::string path = f.as_path();
      f.require_file(path, "hardware profile");
      YAML::Node doc;
      std::optional<YAML::Mark> second;
      {
        std::ifstream in(path, std::ios::binary);
        if (!in) f.fail(fmt::format("cannot read hardware profile '{}'", path));
        std::stringstream text;
        text << in.rdbuf();
        try {
          doc = load_one_document(text.str(), &second);
        } catch (const YAML::Exception& e) {
          throw InputError(fmt::format("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
        }
      }
      if (second)
        throw InputError(fmt::format("{}:{}:{}: a second YAML document ('---'); a hardware profile is one document",
                                     path, second->line + 1, second->column + 1));
      const YamlSource src{path, {}, {}};  // the profile's errors name the profile file
      const Field root(doc, "hardware", &src);
      std::error_code ec;
      root.refuse_tags(2 * (int64_t(std::filesystem::file_size(path, ec)) + 16));
      HardwareSpec h = parse_hardware_map(root, {});
      h.profile_path = path;
      return h;
    }
    auto p = hardware_preset(s);
    if (!p)
      f.fail(fmt::format("unknown hardware preset '{}' (known: {}; or a profile file ending in .yaml)", s,
                         hardware_preset_names()));
    return *p;
  }
  return parse_hardware_map(f, {});
}

// A fitted profile prints its coefficients (in the profile file's units) instead of the
// roofline numbers, which it does not use.
YAML::Node hardware_yaml(const HardwareSpec& h) {
  YAML::Node n;
  if (h.profiled) {  // the file, or (inline in a workload) the whole table
    if (!h.profile_path.empty()) return YAML::Node(yaml_path(h.profile_path));
    n["name"] = h.name;
    n["memory_gb"] = yaml_number(h.memory_bytes / 1e9);
    n["profiled"] = profiled_yaml(*h.profiled);
    return n;
  }
  n["name"] = h.name;
  if (h.fitted) {
    const FittedCoefficients& c = *h.fitted;
    n["fitted"]["backend"] = c.backend;
    n["fitted"]["model"] = c.model;
    n["fitted"]["threads"] = c.threads;
    n["fitted"]["overhead_us"] = yaml_number(c.overhead_s * 1e6);
    n["fitted"]["per_token_us"] = yaml_number(c.per_token_s * 1e6);
    n["fitted"]["per_seq_us"] = yaml_number(c.per_seq_s * 1e6);
    n["fitted"]["per_attn_pair_ns"] = yaml_number(c.per_attn_pair_s * 1e9);
    n["fitted"]["per_context_token_ns"] = yaml_number(c.per_context_token_s * 1e9);
    n["fitted"]["per_sample_us"] = yaml_number(c.per_sample_s * 1e6);
    n["fitted"]["idle_factor"] = yaml_number(c.idle_factor);
    n["memory_gb"] = yaml_number(h.memory_bytes / 1e9);
  } else {
    n["peak_tflops"] = yaml_number(h.peak_flops / 1e12);
    n["mem_bandwidth_tbs"] = yaml_number(h.mem_bandwidth / 1e12);
    n["step_overhead_us"] = yaml_number(h.step_overhead_s * 1e6);
    n["memory_gb"] = yaml_number(h.memory_bytes / 1e9);
    n["link_bandwidth_gbs"] = yaml_number(h.link_bandwidth / 1e9);
    n["link_latency_us"] = yaml_number(h.link_latency_s * 1e6);
  }
  return n;
}

}  // namespace tandem::config_detail
