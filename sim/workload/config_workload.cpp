// Workload files: the top level (load, --set overrides, the checks that span sections, the
// KV cache size) and the resolved YAML. Each section's parser and emitter live with that
// section: config_model.cpp (model, hardware), config_engine.cpp, config_requests.cpp. What
// follows from a parsed workload (its KV capacity, scheduler knobs, instances) is config.cpp's.
#include "sim/workload/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "backend/cost_model.h"
#include "sim/workload/config_sections.h"
#include "sim/base/csv.h"
#include "sim/base/yaml_reader.h"

namespace tandem {

std::string config_detail::yaml_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

using namespace config_detail;

namespace {
// The least value a length distribution can draw (as generate_requests rounds it).
double dist_min(const DistSpec& d) {
  switch (d.kind) {
    case DistSpec::Kind::Fixed: return d.value;
    case DistSpec::Kind::Uniform:
    case DistSpec::Kind::Lognormal: return d.min;
    case DistSpec::Kind::Mixture: {
      double m = 1e300;
      for (const auto& c : d.components)
        if (c.weight > 0) m = std::min(m, dist_min(c.dist));
      return m;
    }
    case DistSpec::Kind::Empirical: {
      double m = 1e300;
      for (double v : d.samples) m = std::min(m, v);
      return m;
    }
  }
  return 0;
}
}  // namespace

// Synthetic lengths whose every draw can never run make a run in which every request fails
// at arrival: that is a mistake in the file, refused naming the field (a trace's rows are
// data, and fail one by one with their reason).
void refuse_lengths_that_never_fit(const Workload& w, const Field& requests) {
  if (w.requests.trace) return;
  const auto as_len = [](double v) { return std::llround(std::clamp(v, 0.0, double(INT32_MAX))); };
  const int64_t prompt = as_len(dist_min(w.requests.prompt_len)), output = as_len(dist_min(w.requests.output_len));
  const int64_t kv_tokens = int64_t{w.engine.resolved_kv_blocks} * w.engine.block_size;
  if (prompt + output > w.model.max_model_len)
    requests["prompt_len"].fail(fmt::format(
        "every request would fail at arrival: prompts of at least {} tokens and outputs of at least {} exceed "
        "model.max_model_len ({})",
        prompt, output, w.model.max_model_len));
  if (prompt + output > kv_tokens)
    requests["prompt_len"].fail(fmt::format(
        "every request would fail at arrival: prompts of at least {} tokens and outputs of at least {} exceed the KV "
        "cache ({} blocks of {} tokens)",
        prompt, output, w.engine.resolved_kv_blocks, w.engine.block_size));
}

namespace {

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
    std::optional<YAML::Mark> second;
    value = load_one_document(o.value, &second);  // an empty value stays null: refused as empty by the reader
    if (second)
      throw InputError(fmt::format("{}: --set {}={}: the value holds more than one YAML document (one value, no '---')",
                                   src.file, o.key, o.value));
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

// The KV cache in blocks (kv_capacity), checked: errors name `at` (the engine section, or the
// instance's field that gave it a cache of its own) and the keys that set the size.
void resolve_kv_blocks(const ModelSpec& m, const HardwareSpec& hw, EngineSpec& e, const Field& at,
                       const std::string& size_keys, const std::string& tp_key) {
  const KvCapacity c = kv_capacity(m, hw, e);
  if (c.source == KvCapacity::Source::DeviceMemory && c.kv_bytes_per_gpu <= 0) {
    const std::string weights =
        c.tp == 1 ? fmt::format("the model's weights ({:.1f} GB)", c.weight_bytes_per_gpu / 1e9)
                  : fmt::format(
                        "the model's weights per GPU ({:.1f} GB at tp {}: {:.1f} GB linear / {} ranks + "
                        "{:.1f} GB embedding and LM head)",
                        c.weight_bytes_per_gpu / 1e9, c.tp, c.linear_bytes / 1e9, c.tp, c.embedding_bytes / 1e9);
    at.fail(fmt::format("{} leave no memory for the KV cache ({:.1f} GB x gpu_memory_utilization {}); set {}{}",
                        weights, c.memory_per_gpu / 1e9, c.utilization, size_keys,
                        c.tp == 1 ? "" : ", or raise " + tp_key));
  }
  if (c.blocks < 1) at.fail("the KV cache holds no block (raise kv_memory_gb or num_kv_blocks)");
  // The block pool's bookkeeping is 8 bytes a block: cap it at 2^27 blocks (1 GB).
  constexpr double kMaxBlocks = double(1 << 27);
  if (c.blocks > kMaxBlocks)
    at.fail(
        fmt::format("the KV cache would have {:.0f} blocks; at most {:.0f} are supported "
                    "(raise block_size, or lower num_kv_blocks / kv_memory_gb)",
                    c.blocks, kMaxBlocks));
  e.resolved_kv_blocks = static_cast<int32_t>(std::min(c.blocks, double(kI32Max)));
  e.kv_derivation = c.text();
}

// A stage 4 instance's own hardware or tp, held to what the workload's are held to (the texts
// of parse_workload's checks); errors name the instance's field.
void check_instance_hardware(const Workload& w, const InstanceOverrides& o, const Field& f) {
  if (!o.hardware && !o.tp) return;
  const HardwareSpec& hw = o.hardware ? *o.hardware : w.hardware;
  const int32_t tp = o.tp.value_or(w.engine.tp);
  const Field at = f[o.hardware ? "hardware" : "tp"];
  if (hw.fitted && hw.fitted->model != w.model.name)
    at.fail(fmt::format("the profile was fitted on model '{}', but the workload's model is '{}'", hw.fitted->model,
                        w.model.name));
  if (hw.profiled && hw.profiled->model != w.model.name)
    at.fail(fmt::format("the profile was measured on model '{}', but the workload's model is '{}'", hw.profiled->model,
                        w.model.name));
  if (hw.profiled && hw.profiled->tp != tp)
    at.fail(fmt::format("the hardware profile was measured at tp {}, this instance runs at tp {}: calibrate at this tp",
                        hw.profiled->tp, tp));
  if (tp > 1 && !hw.fitted && !hw.profiled && hw.link_bandwidth <= 0)
    at.fail("tensor parallelism needs hardware.link_bandwidth_gbs (the all-reduces go over it)");
}

// A stage 4 instance whose tp, hardware or num_kv_blocks differs from the engine's gets a cache of
// its own (each instance's memory is its own GPUs'); otherwise it takes the engine's.
void resolve_instance_kv_blocks(const Workload& w, InstanceOverrides& o, const Field& f, const char* role) {
  if (!o.tp && !o.num_kv_blocks && !o.hardware) return;
  EngineSpec e = w.engine;
  if (o.tp) e.tp = *o.tp;
  if (o.num_kv_blocks) {
    e.num_kv_blocks = *o.num_kv_blocks;
    e.kv_memory_gb = 0;
  }
  resolve_kv_blocks(w.model, o.hardware ? *o.hardware : w.hardware, e,
                    f[o.num_kv_blocks ? "num_kv_blocks"
                      : o.hardware    ? "hardware"
                                      : "tp"],
                    fmt::format("disaggregation.{}.num_kv_blocks, engine.kv_memory_gb or engine.num_kv_blocks", role),
                    fmt::format("disaggregation.{}.tp", role));
  o.resolved_kv_blocks = e.resolved_kv_blocks;
  o.kv_derivation = e.kv_derivation;
}

}  // namespace

std::vector<Override> parse_sets(const std::vector<std::string>& sets) {
  std::vector<Override> out;
  for (const auto& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw InputError(fmt::format("--set {}: expected KEY=VALUE", s));
    out.push_back({s.substr(0, eq), s.substr(eq + 1)});
  }
  return out;
}

Workload parse_workload(const std::string& text, const std::string& path, const std::vector<Override>& overrides) {
  YamlSource src{path, {}, {}};
  // A second document ('---') would be ignored without a word: refused.
  YAML::Node root = load_yaml_file_document(text, path, "a workload");
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    throw InputError(
        fmt::format("{}:1:1: a workload is a mapping of name, seed, model, hardware, engine, requests, slo", path));
  for (const auto& o : overrides) apply_override(root, o, src);

  const Field top(root, "", &src);
  // Without aliases a node takes at least half a byte of the text (file or --set values).
  int64_t text_bytes = int64_t(text.size()) + 16;
  for (const auto& o : overrides) text_bytes += int64_t(o.key.size() + o.value.size()) + 16;
  top.refuse_tags(2 * text_bytes);
  // A sweep file (a base workload, a grid, rates or a capacity search) is not a workload: say so
  // rather than call its first key unknown.
  if (top.has("workload") && (top.has("rates") || top.has("capacity") || top.has("grid") || top.has("configs")))
    throw InputError(fmt::format(
        "{}:1:1: this is a sweep file (workload, configs, grid, rates or capacity), not a workload: run it with "
        "tandem sweep {}, or check it with tandem sweep plan {} --out DIR",
        path, path, path));
  top.expect_map({"name", "seed", "model", "hardware", "engine", "requests", "slo", "disaggregation"});
  Workload w;
  w.path = path;
  w.name = top.get_string("name", std::filesystem::path(path).stem().string());
  w.seed = static_cast<uint64_t>(top.get_int("seed", 0, 0, INT64_MAX));
  w.model = parse_model(top["model"]);
  w.hardware = parse_hardware(top["hardware"]);
  if (w.hardware.fitted && w.hardware.fitted->model != w.model.name)
    top["hardware"].fail(fmt::format("the profile was fitted on model '{}', but the workload's model is '{}'",
                                     w.hardware.fitted->model, w.model.name));
  if (w.hardware.profiled && w.hardware.profiled->model != w.model.name)
    top["hardware"].fail(fmt::format("the profile was measured on model '{}', but the workload's model is '{}'",
                                     w.hardware.profiled->model, w.model.name));
  w.engine = parse_engine(top["engine"]);
  if (w.hardware.profiled && w.hardware.profiled->tp != w.engine.tp)
    top["engine"]["tp"].fail(
        fmt::format("the hardware profile was measured at tp {}, this workload runs at tp {}: "
                    "calibrate at this tp",
                    w.hardware.profiled->tp, w.engine.tp));
  if (const int32_t tp = w.engine.tp; tp > 1) {
    const Field f = top["engine"]["tp"];
    if (!w.hardware.fitted && !w.hardware.profiled && w.hardware.link_bandwidth <= 0)
      f.fail("tensor parallelism needs hardware.link_bandwidth_gbs (the all-reduces go over it)");
    // The same rule (and text) the backends apply when they shard the weights.
    if (const std::string why = w.model.tp_split_problem(tp); !why.empty()) f.fail(why);
  }
  w.requests = parse_requests(top["requests"]);
  if (top.has("slo")) {
    const Field s = top["slo"];
    s.expect_map({"ttft_ms", "tpot_ms"});
    w.slo.ttft_ms = s.get_double("ttft_ms", 0, 1e-9, 1e12);
    w.slo.tpot_ms = s.get_double("tpot_ms", 0, 1e-9, 1e12);
  }

  resolve_kv_blocks(w.model, w.hardware, w.engine, top["engine"], "engine.kv_memory_gb or engine.num_kv_blocks",
                    "engine.tp");
  w.disaggregation = parse_disaggregation(top["disaggregation"], w.engine, w.model, w.hardware);
  if (w.disaggregation.enabled) {
    check_instance_hardware(w, w.disaggregation.prefill, top["disaggregation"]["prefill"]);
    check_instance_hardware(w, w.disaggregation.decode, top["disaggregation"]["decode"]);
    resolve_instance_kv_blocks(w, w.disaggregation.prefill, top["disaggregation"]["prefill"], "prefill");
    resolve_instance_kv_blocks(w, w.disaggregation.decode, top["disaggregation"]["decode"], "decode");
  }
  if (!w.requests.cancel.phase_cancels.empty() && !w.disaggregation.enabled)
    top["requests"]["cancel"]["at"].fail(
        "a cancel at a phase (prefill, parked, transfer, received, decode) needs disaggregation.enabled: true");
  if (w.disaggregation.enabled && w.engine.data_parallel != 1)
    top["engine"]["data_parallel"].fail(
        "data_parallel replicas and disaggregation (1 prefill + 1 decode) are exclusive");
  refuse_lengths_that_never_fit(w, top["requests"]);
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
// Text from the workload (a hardware name, a profile's provenance, a path) put in a comment line
// of the resolved YAML: a control character would end the comment or the line, and what
// follows would be read as YAML (a fuzz finding: a hardware name with \x00 in it), so it is
// written as \xNN.
std::string comment_text(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

// What the workload's cost model predicts for a few reference steps, so that a profile can be
// checked by eye before a run (and a roofline preset compared with a measured profile).
// `whose`: which instance's (empty: the workload's).
std::string reference_steps(const Workload& w, const std::string& whose = "") {
  const auto model = make_cost_model(w.model, w.hardware, w.engine.tp);
  const int32_t len = w.model.max_model_len, max_seqs = w.engine.max_num_seqs;
  const int32_t max_tokens = w.engine.max_num_batched_tokens;
  // (context before, new tokens): a decode or a prompt's chunk, as implied_prompt_len says.
  const auto ms = [&](std::vector<std::pair<int32_t, int32_t>> seqs) {
    StepPlan p;
    for (auto [c0, n] : seqs) p.add({ReqId(p.seqs.size()), n, c0, true, {}}, implied_prompt_len(c0, n));
    return model->estimate(p).total_s() * 1e3;
  };
  const int32_t ctx = std::min(1024, len - 1), big = std::min(32, max_seqs), pre = std::min({512, max_tokens, len});
  const int32_t chunk = std::min({512, max_tokens, len / 2}), mix_decodes = std::min(16, max_seqs - 1);
  std::vector<std::pair<int32_t, int32_t>> dec(size_t(big), {ctx, 1}), mixed(size_t(mix_decodes), {ctx, 1});
  mixed.push_back({0, std::min(256, pre)});
  return fmt::format(
      "# predicted step times (ms){}, {}: decode 1 x {} ctx {:.4g}; decode {} x {} ctx {:.4g}; "
      "prefill {} tokens {:.4g}; chunk {} over {} cached {:.4g}; mixed {} prompt + {} decodes {:.4g}\n",
      whose, comment_text(model->inputs().substr(0, model->inputs().find(':'))), ctx, ms({{ctx, 1}}), big, ctx, ms(dec),
      pre, ms({{0, pre}}), chunk, len - chunk, ms({{len - chunk, chunk}}), std::min(256, pre), mix_decodes, ms(mixed));
}
}  // namespace

std::string to_yaml(const Workload& w) {
  YAML::Node n;
  n["name"] = w.name;
  n["seed"] = w.seed;
  n["model"] = model_yaml(w.model);
  n["hardware"] = hardware_yaml(w.hardware);
  n["engine"] = engine_yaml(w.engine);
  n["requests"] = requests_yaml(w.requests);
  if (w.slo.any()) {
    if (w.slo.ttft_ms > 0) n["slo"]["ttft_ms"] = yaml_number(w.slo.ttft_ms);
    if (w.slo.tpot_ms > 0) n["slo"]["tpot_ms"] = yaml_number(w.slo.tpot_ms);
  }
  if (w.disaggregation.enabled) n["disaggregation"] = disaggregation_yaml(w.disaggregation);
  YAML::Emitter out;
  out << n;
  // Derived values as comments, so the output stays a valid workload (paths are resolved).
  const ModelSpec& m = w.model;
  const EngineSpec& e = w.engine;
  // How each cache's size was derived (KvCapacity): the engine's, and a stage 4 instance's own.
  std::string kv = e.kv_derivation.empty() ? "" : fmt::format("# KV cache: {}\n", comment_text(e.kv_derivation));
  const std::pair<const char*, const InstanceOverrides*> instances[] = {{"prefill", &w.disaggregation.prefill},
                                                                        {"decode", &w.disaggregation.decode}};
  // An instance's own hardware: what its cost model predicts, and where its numbers come from.
  std::string steps = reference_steps(w);
  const auto source = [](const HardwareSpec& h) {
    return h.source.empty() ? std::string("given in the workload") : comment_text(h.source);
  };
  std::string hardware = fmt::format("# hardware numbers: {}\n", source(w.hardware));
  if (w.disaggregation.enabled) {
    const std::vector<InstanceSpec> specs = instance_specs(w);
    for (size_t i = 0; i < 2; ++i) {
      const auto& [role, o] = instances[i];
      if (o->resolved_kv_blocks > 0)
        kv += fmt::format("# KV cache, {} (tp {}): {}\n", role, o->tp.value_or(e.tp), comment_text(o->kv_derivation));
      if (o->hardware) {
        steps += reference_steps(instance_workload(w, specs[i]), fmt::format(", {} instance", role));
        hardware += fmt::format("# hardware numbers, {} instance: {}\n", role, source(*o->hardware));
      }
    }
  }
  return fmt::format(
             "{}\n{}# derived: model {:.3f} B parameters, {:.0f} bytes of KV per token; KV cache {} tokens "
             "({:.1f} GB)\n{}{}",
             out.c_str(), steps, m.params() / 1e9, m.kv_bytes_per_token(), int64_t{e.resolved_kv_blocks} * e.block_size,
             double(e.resolved_kv_blocks) * e.block_size * m.kv_bytes_per_token() / 1e9, kv, hardware) +
         (e.prefix_caching_off_reason.empty()
              ? ""
              : fmt::format("# prefix caching off: {}\n", comment_text(e.prefix_caching_off_reason)));
}

}  // namespace tandem
