#include "backend/specs.h"

#include <array>
#include <numeric>

#include <fmt/format.h>

namespace tandem {

int32_t ModelSpec::dtype_bytes() const {
  if (dtype == "fp32") return 4;
  if (dtype == "fp8") return 1;
  return 2;  // bf16, fp16
}

double ModelSpec::linear_params() const {
  const double h = hidden, q = double(heads) * head_dim(), kv = double(kv_heads) * head_dim();
  const double attn = h * q + 2.0 * h * kv + q * h;
  const double mlp = 3.0 * h * ffn;
  return layers * (attn + mlp);
}

std::string ModelSpec::tp_split_problem(int32_t tp) const {
  if (tp < 1) return fmt::format("{} is not a rank count (at least 1)", tp);
  if (heads % tp) return fmt::format("{} does not divide the model's heads ({})", tp, heads);
  if (kv_heads % tp) return fmt::format("{} does not divide the model's KV heads ({})", tp, kv_heads);
  if (ffn % tp) return fmt::format("{} does not divide the model's ffn ({})", tp, ffn);
  return {};
}

int32_t ModelSpec::reduction_segments() const {
  const int64_t g = std::gcd(std::gcd(int64_t(heads), int64_t(kv_heads)), int64_t(ffn));
  int32_t s = 1;
  while (s < 8 && g > 0 && g % (2 * s) == 0) s *= 2;
  return s;
}

namespace {

const std::array kModels = {
    // Llama-3-8B shape (Meta's config.json: 32 layers, 4096 hidden, 32/8 heads, 14336 ffn).
    ModelSpec{"llama3-8b", 32, 4096, 32, 8, 14336, 128256, "bf16", 8192, 500000.0, 1e-5, false, ""},
    // Llama-3.1-8B: the same shape with a 131,072-token context (long-prompt traces such as
    // Mooncake's). Its RoPE frequency scaling for long contexts is not modelled by the real
    // backends (dummy weights make it moot; a real 3.1 checkpoint would need it).
    ModelSpec{"llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, "bf16", 131072, 500000.0, 1e-5, false, ""},
    // Llama-2-7B shape (the model of the Vidur comparison in stage 1's report).
    ModelSpec{"llama2-7b", 32, 4096, 32, 32, 11008, 32000, "fp16", 4096, 10000.0, 1e-5, false, ""},
    // Small shapes for the CPU reference backend: tests, and benchmarks (about 125M parameters).
    ModelSpec{"tiny", 4, 256, 8, 4, 688, 4096, "fp32", 2048, 10000.0, 1e-5, false, ""},
    ModelSpec{"llama-100m", 12, 768, 12, 4, 2048, 32000, "fp32", 4096, 10000.0, 1e-5, false, ""},
};

const std::array kHardware = {
    // Bandwidth and GEMM rate measured on an H200 of this workplace (device copy 4.3 TB/s,
    // dense bf16 GEMM ~788 TFLOP/s on random data); memory is the datasheet's 141 GB; the
    // per-step overhead is an assumption until a calibrated profile replaces it.
    HardwareSpec{"h200", 788e12, 4.3e12, 150e-6, 141e9, 450e9, 8e-6,
                 "measured: 4.3 TB/s copy, 788 TFLOP/s bf16 GEMM; datasheet: 141 GB, NVLink 450 GB/s per direction; "
                 "assumed: 150 us/step, 8 us per all-reduce",
                 std::nullopt, nullptr, ""},
    // The same card over PCIe Gen5 x16 instead of NVLink (for tensor parallelism).
    HardwareSpec{"h200-pcie", 788e12, 4.3e12, 150e-6, 141e9, 64e9, 15e-6,
                 "as h200; datasheet: PCIe Gen5 x16 64 GB/s per direction; assumed: 15 us per all-reduce", std::nullopt,
                 nullptr, ""},
    // The vendor's datasheet figures for the H200 SXM, for comparison.
    HardwareSpec{"h200-datasheet", 989e12, 4.8e12, 150e-6, 141e9, 450e9, 8e-6,
                 "datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB; assumed: 150 us/step", std::nullopt, nullptr,
                 ""},
};

template <class Arr>
std::string names(const Arr& a) {
  std::string s;
  for (const auto& x : a) s.append(s.empty() ? "" : ", ").append(x.name);
  return s;
}

}  // namespace

std::optional<ModelSpec> model_preset(const std::string& name) {
  for (const auto& m : kModels)
    if (m.name == name) return m;
  return std::nullopt;
}
std::optional<HardwareSpec> hardware_preset(const std::string& name) {
  for (const auto& h : kHardware)
    if (h.name == name) return h;
  return std::nullopt;
}
std::string model_preset_names() { return names(kModels); }
std::string hardware_preset_names() { return names(kHardware); }

}  // namespace tandem
