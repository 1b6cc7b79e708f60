// Internal to the workload parser (sim/config*.cpp), not a public interface: one parse and
// one emit function per section of a workload file. Each section's parser sits in the same
// file as its emitter (config_model.cpp, config_engine.cpp, config_requests.cpp), so a new
// field is added to both in one place; config.cpp strings them together, checks what spans
// sections (fitted profile vs model, tensor parallelism, the KV cache size) and emits the
// top level.
#pragma once
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>

#include "sim/workload/config.h"
#include "sim/base/yaml_reader.h"

namespace tandem::config_detail {

inline constexpr int64_t kI32Max = INT32_MAX;
inline constexpr double kHuge = 1e300;  // "no upper bound" for a double field

// Shortest text that reads back as the same double (yaml-cpp would print 17 digits).
inline std::string yaml_number(double v) { return fmt::format("{:.12g}", v); }
// A file path as the resolved YAML writes it: absolute, so that the file (a run folder's
// workload.resolved.yaml, validate's output saved anywhere) runs again from any directory.
std::string yaml_path(const std::string& path);

// Parsers: read one section (its Field names it in errors) and apply its defaults.
// Emitters: the resolved section as a YAML mapping, in the order `tandem validate` prints.

// config_model.cpp. A model is a preset name, an inline spec, or a checkpoint folder (its
// config.json is read here); hardware is a preset, an inline spec, or a profile file.
ModelSpec parse_model(const Field& f);
HardwareSpec parse_hardware(const Field& f);
// A stage 4 instance's hardware: as above, or a mapping without `preset` over `base` (the
// workload's roofline hardware: only the numbers given change).
HardwareSpec parse_hardware(const Field& f, const HardwareSpec& base);
YAML::Node model_yaml(const ModelSpec& m);
YAML::Node hardware_yaml(const HardwareSpec& h);

// config_profile.cpp: the `profiled:` section of a hardware profile (tandem calibrate --model).
std::shared_ptr<const OperatorProfile> parse_profiled(const Field& f);
YAML::Node profiled_yaml(const OperatorProfile& p);
// A whole profile file: `comment` (lines starting with '#') first.
// The file `calibrate --workload` writes (the older linear fit), through hardware_yaml.
std::string fitted_profile_file_text(const FittedCoefficients& c, const std::string& name, double memory_gb,
                                     const std::string& comment);
std::string profile_file_text(const OperatorProfile& p, const std::string& name, double memory_gb,
                              const std::string& comment);

// config_engine.cpp. The KV cache size is resolved later (it needs the model and hardware).
EngineSpec parse_engine(const Field& f);
YAML::Node engine_yaml(const EngineSpec& e);

// config_disaggregation.cpp: stage 4's section, checked against the engine it overrides.
DisaggregationSpec parse_disaggregation(const Field& f, const EngineSpec& engine, const ModelSpec& model,
                                        const HardwareSpec& hardware);
YAML::Node disaggregation_yaml(const DisaggregationSpec& d);

// config_requests.cpp: the synthetic generator (count, arrival, length distributions) or a
// trace, plus shared prefixes and cancellations.
RequestsSpec parse_requests(const Field& f);
YAML::Node requests_yaml(const RequestsSpec& r);

}  // namespace tandem::config_detail
