// A profiled hardware profile (tandem calibrate --model): parsing, with every error naming
// its field, and the YAML that calibrate writes and `tandem validate` prints.
#include <stdexcept>

#include "sim/config_sections.h"

namespace tandem::config_detail {

namespace {
const std::vector<const char*> kKinds = {"prefill", "multi", "decode", "mixed"};

ProfileStep parse_step(const Field& f) {
  f.expect_map({"kind", "seqs", "tokens", "context", "sampled", "idle", "ms"});
  ProfileStep s;
  s.kind = f["kind"].as_string();
  if (std::find_if(kKinds.begin(), kKinds.end(), [&](const char* k) { return s.kind == k; }) == kKinds.end())
    f["kind"].fail(fmt::format("unknown step kind '{}' (known: prefill, multi, decode, mixed)", s.kind));
  s.seqs = int32_t(f["seqs"].as_int(1, 1 << 20));
  s.tokens = int32_t(f["tokens"].as_int(1, kI32Max));
  s.context = int32_t(f["context"].as_int(0, kI32Max));
  s.sampled = f["sampled"].as_bool();
  s.idle = f.has("idle") && f["idle"].as_bool();
  s.seconds = f["ms"].as_double(1e-9, 1e9) * 1e-3;
  if (s.kind == "prefill" && s.seqs != 1) f["seqs"].fail("a prefill step has one sequence");
  if (s.kind == "prefill" && s.sampled) f["sampled"].fail("a prefill step is measured without sampling");
  if (s.kind == "decode" && s.tokens != 1) f["tokens"].fail("a decode step has one token per sequence");
  if (s.kind == "decode" && !s.sampled) f["sampled"].fail("a decode step samples every sequence");
  if (s.kind == "multi" && s.context != 0) f["context"].fail("a multi step has no cached context");
  return s;
}
}  // namespace

std::shared_ptr<const OperatorProfile> parse_profiled(const Field& f) {
  f.expect_map({"backend", "model", "threads", "tp", "hardware", "code_version", "measured_at", "engine",
                "graph_buckets", "idle_factor", "idle_samples", "loop_gap_us", "refine", "raw"});
  auto p = std::make_shared<OperatorProfile>();
  p->backend = f["backend"].as_string();
  p->model = f["model"].as_string();
  p->threads = int32_t(f.get_int("threads", 0, 0, 1 << 16));
  p->tp = int32_t(f.get_int("tp", 1, 1, 4096));
  p->hardware = f.get_string("hardware", "");
  p->code_version = f.get_string("code_version", "");
  p->measured_at = f.get_string("measured_at", "");
  p->engine = f.get_string("engine", "");
  p->graph_buckets = f.has("graph_buckets") && f["graph_buckets"].as_bool();
  p->idle_factor = f.get_double("idle_factor", 1.0, 0.1, 100);
  p->idle_samples = int32_t(f.get_int("idle_samples", 0, 0, kI32Max));
  p->loop_gap_s = f.get_double("loop_gap_us", 0, 0, 1e9) * 1e-6;
  if (f.has("refine")) {
    const Field r = f["refine"];
    r.expect_map({"decode", "prefill", "mixed", "steps"});
    p->refine_decode = r.get_double("decode", 1, 0.01, 100);
    p->refine_prefill = r.get_double("prefill", 1, 0.01, 100);
    p->refine_mixed = r.get_double("mixed", 1, 0.01, 100);
    p->refine_steps = int32_t(r.get_int("steps", 0, 0, kI32Max));
  }
  if (!f["raw"].present()) f["raw"].fail("missing (the measured steps)");
  for (const Field& item : f["raw"].items()) p->raw.push_back(parse_step(item));
  try {
    derive_curves(*p);
  } catch (const std::invalid_argument& e) {
    f["raw"].fail(e.what());
  }
  return p;
}

YAML::Node profiled_yaml(const OperatorProfile& p) {
  YAML::Node n;
  n["backend"] = p.backend;
  n["model"] = p.model;
  n["threads"] = p.threads;
  n["tp"] = p.tp;
  for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"hardware", p.hardware},
                                   {"code_version", p.code_version},
                                   {"measured_at", p.measured_at},
                                   {"engine", p.engine}})
    if (!value.empty()) n[key] = value;  // an empty string would not read back
  n["graph_buckets"] = p.graph_buckets;
  n["idle_factor"] = yaml_number(p.idle_factor);
  n["idle_samples"] = p.idle_samples;
  n["loop_gap_us"] = yaml_number(p.loop_gap_s * 1e6);
  n["refine"]["decode"] = yaml_number(p.refine_decode);
  n["refine"]["prefill"] = yaml_number(p.refine_prefill);
  n["refine"]["mixed"] = yaml_number(p.refine_mixed);
  n["refine"]["steps"] = p.refine_steps;
  n["refine"].SetStyle(YAML::EmitterStyle::Flow);
  YAML::Node raw(YAML::NodeType::Sequence);
  for (const ProfileStep& s : p.raw) {
    YAML::Node r;
    r["kind"] = s.kind;
    r["seqs"] = s.seqs;
    r["tokens"] = s.tokens;
    r["context"] = s.context;
    r["sampled"] = s.sampled;
    if (s.idle) r["idle"] = true;
    r["ms"] = yaml_number(s.seconds * 1e3);
    r.SetStyle(YAML::EmitterStyle::Flow);
    raw.push_back(r);
  }
  n["raw"] = raw;
  return n;
}

std::string profile_file_text(const OperatorProfile& p, const std::string& name, double memory_gb,
                              const std::string& comment) {
  YAML::Node n;
  n["name"] = name;
  n["memory_gb"] = yaml_number(memory_gb);
  n["profiled"] = profiled_yaml(p);
  YAML::Emitter out;
  out << n;
  return comment + out.c_str() + "\n";
}

std::string fitted_profile_file_text(const FittedCoefficients& c, const std::string& name, double memory_gb,
                                     const std::string& comment) {
  HardwareSpec h;
  h.name = name;
  h.memory_bytes = memory_gb * 1e9;
  h.fitted = c;
  YAML::Emitter out;
  out << hardware_yaml(h);  // the same emitter as `tandem validate`'s hardware section
  return comment + out.c_str() + "\n";
}

}  // namespace tandem::config_detail
