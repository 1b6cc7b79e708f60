// A profiled hardware profile (tandem calibrate --model): parsing, with every error naming
// its field, and the YAML that calibrate writes and `tandem validate` prints.
#include <stdexcept>

#include "backend/cost_model.h"
#include "sim/workload/config_sections.h"

namespace tandem::config_detail {

namespace {
const std::vector<const char*> kKinds = {"prefill", "multi", "decode", "mixed", "allreduce"};

ProfileStep parse_step(const Field& f) {
  f.expect_map({"kind", "seqs", "tokens", "context", "sampled", "idle", "ms"});
  ProfileStep s;
  s.kind = f["kind"].as_string();
  if (std::find_if(kKinds.begin(), kKinds.end(), [&](const char* k) { return s.kind == k; }) == kKinds.end())
    f["kind"].fail(fmt::format("unknown step kind '{}' (known: prefill, multi, decode, mixed, allreduce)", s.kind));
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
  if (s.kind == "allreduce" && (s.seqs != 1 || s.context != 0 || s.sampled || s.idle))
    f["kind"].fail("an allreduce entry has seqs 1, context 0, and is neither sampled nor after idle");
  return s;
}
}  // namespace

std::shared_ptr<const OperatorProfile> parse_profiled(const Field& f) {
  f.expect_map({"backend", "model", "threads", "tp", "hardware", "code_version", "measured_at", "engine",
                "graph_buckets", "mixed_fit", "idle_factor", "idle_samples", "loop_gap_us", "refine", "refine_by_size",
                "conditions", "raw"});
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
  p->mixed_fit = f.has("mixed_fit") && f["mixed_fit"].as_bool();
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
  if (f.has("refine_by_size")) {  // optional: profiles from before it price by kind alone
    const Field r = f["refine_by_size"];
    r.expect_map({"decode", "prefill", "mixed"});
    for (int k = 0; k < 3; ++k) {
      const char* kind = step_kind_name(StepKind(k));
      if (!r.has(kind)) continue;
      for (const Field& item : r[kind].items()) {
        item.expect_map({"upto", "factor", "steps"});
        SizeResidual c;
        c.upto = int32_t(item["upto"].as_int(1, 1 << 30));
        if ((c.upto & (c.upto - 1)) != 0) item["upto"].fail("a size class ends at a power of two (1, 2, 4, ...)");
        if (!p->refine_by_size[k].empty() && c.upto <= p->refine_by_size[k].back().upto)
          item["upto"].fail("the size classes go in ascending order, each once");
        c.factor = item["factor"].as_double(0.01, 100);
        c.steps = int32_t(item.get_int("steps", 0, 0, kI32Max));
        p->refine_by_size[k].push_back(c);
      }
    }
  }
  if (f.has("conditions")) {  // a record, optional: profiles from before it read as unknown
    const Field c = f["conditions"];
    c.expect_map({"load_before", "load_after", "others_grid", "steal_grid", "others_serving", "cpu_share_grid", "reference",
                  "reference_before_ms", "reference_after_ms", "repeat_median", "repeat_over", "repeat_compared",
                  "repeat_worst", "grid_tries", "accepted_noisy"});
    CalibrationConditions& k = p->conditions;
    k.load_before = c.get_double("load_before", -1, -1, 1e6);
    k.load_after = c.get_double("load_after", -1, -1, 1e6);
    k.others_grid = c.get_double("others_grid", -1, -1, 1);
    k.steal_grid = c.get_double("steal_grid", -1, -1, 1);
    k.others_serving = c.get_double("others_serving", -1, -1, 1);
    k.cpu_share_grid = c.get_double("cpu_share_grid", -1, -1, 1e6);
    k.reference = c.get_string("reference", "");
    k.reference_before_ms = c.get_double("reference_before_ms", 0, 0, 1e9);
    k.reference_after_ms = c.get_double("reference_after_ms", 0, 0, 1e9);
    k.repeat_median = c.get_double("repeat_median", -1, -1, 1e6);
    k.repeat_over = int32_t(c.get_int("repeat_over", 0, 0, kI32Max));
    k.repeat_compared = int32_t(c.get_int("repeat_compared", 0, 0, kI32Max));
    k.repeat_worst = c.get_string("repeat_worst", "");
    k.grid_tries = int32_t(c.get_int("grid_tries", 1, 1, 1000));
    k.accepted_noisy = c.has("accepted_noisy") && c["accepted_noisy"].as_bool();
  }
  if (!f["raw"].present()) f["raw"].fail("missing (the measured steps)");
  for (const Field& item : f["raw"].items()) {
    p->raw.push_back(parse_step(item));
    if (p->raw.back().kind == "allreduce" && p->tp == 1)
      item["kind"].fail("allreduce entries belong to a profile measured at tp > 1 (this one has tp 1)");
  }
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
  if (p.mixed_fit) n["mixed_fit"] = true;  // absent: the profiles before it read as they did
  n["idle_factor"] = yaml_number(p.idle_factor);
  n["idle_samples"] = p.idle_samples;
  n["loop_gap_us"] = yaml_number(p.loop_gap_s * 1e6);
  n["refine"]["decode"] = yaml_number(p.refine_decode);
  n["refine"]["prefill"] = yaml_number(p.refine_prefill);
  n["refine"]["mixed"] = yaml_number(p.refine_mixed);
  n["refine"]["steps"] = p.refine_steps;
  n["refine"].SetStyle(YAML::EmitterStyle::Flow);
  for (int k = 0; k < 3; ++k)  // absent when no class was kept: the profiles before it read as they did
    for (const SizeResidual& c : p.refine_by_size[k]) {
      YAML::Node e;
      e["upto"] = c.upto;
      e["factor"] = yaml_number(c.factor);
      e["steps"] = c.steps;
      e.SetStyle(YAML::EmitterStyle::Flow);
      n["refine_by_size"][step_kind_name(StepKind(k))].push_back(e);
    }
  const CalibrationConditions& k = p.conditions;
  YAML::Node c;
  c["load_before"] = yaml_number(k.load_before);
  c["load_after"] = yaml_number(k.load_after);
  c["others_grid"] = yaml_number(k.others_grid);
  c["steal_grid"] = yaml_number(k.steal_grid);
  c["others_serving"] = yaml_number(k.others_serving);
  c["cpu_share_grid"] = yaml_number(k.cpu_share_grid);
  if (!k.reference.empty()) c["reference"] = k.reference;
  c["reference_before_ms"] = yaml_number(k.reference_before_ms);
  c["reference_after_ms"] = yaml_number(k.reference_after_ms);
  c["repeat_median"] = yaml_number(k.repeat_median);
  c["repeat_over"] = k.repeat_over;
  c["repeat_compared"] = k.repeat_compared;
  if (!k.repeat_worst.empty()) c["repeat_worst"] = k.repeat_worst;
  if (k.grid_tries > 1) c["grid_tries"] = k.grid_tries;  // absent: one grid, as every profile before it
  c["accepted_noisy"] = k.accepted_noisy;
  n["conditions"] = c;
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
