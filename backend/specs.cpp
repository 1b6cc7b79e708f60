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
  const double mlp = double(mlp_matrices()) * h * ffn;
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

// A preset's shape, every field named. Llama-style unless said otherwise (SwiGLU, RoPE, untied).
ModelSpec shape(const char* name, int32_t layers, int32_t hidden, int32_t heads, int32_t kv_heads, int32_t ffn,
                int32_t vocab, const char* dtype, int32_t max_model_len, double rope_theta) {
  ModelSpec m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.dtype = dtype;
  m.max_model_len = max_model_len;
  m.rope_theta = rope_theta;
  return m;
}
// OPT (Zhang et al. 2022, Table 1, and the models' config.json): ReLU two-matrix MLP of 4 x hidden,
// learned positions (2,048), LM head tied to the token embedding, vocabulary 50,272, fp16.
ModelSpec opt(const char* name, int32_t layers, int32_t hidden, int32_t heads) {
  ModelSpec m = shape(name, layers, hidden, heads, heads, 4 * hidden, 50272, "fp16", 2048, 10000.0);
  m.mlp = "relu";
  m.positions = "learned";
  m.tie_embeddings = true;
  return m;
}
ModelSpec gelu(ModelSpec m) {
  m.mlp = "gelu";
  return m;
}

const std::array kModels = {
    // Llama-3-8B shape (Meta's config.json: 32 layers, 4096 hidden, 32/8 heads, 14336 ffn).
    shape("llama3-8b", 32, 4096, 32, 8, 14336, 128256, "bf16", 8192, 500000.0),
    // Llama-3.1-8B: the same shape with a 131,072-token context (long-prompt traces such as
    // Mooncake's). Its RoPE frequency scaling for long contexts is not modelled by the real
    // backends (dummy weights make it moot; a real 3.1 checkpoint would need it).
    shape("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, "bf16", 131072, 500000.0),
    // Llama-2-7B shape (the model of the Vidur comparison in stage 1's report).
    shape("llama2-7b", 32, 4096, 32, 32, 11008, 32000, "fp16", 4096, 10000.0),
    // Llama-2-13B and -70B (Touvron et al. 2023; config.json): 70B has 8 KV heads (GQA).
    shape("llama2-13b", 40, 5120, 40, 40, 13824, 32000, "fp16", 4096, 10000.0),
    shape("llama2-70b", 80, 8192, 64, 8, 28672, 32000, "fp16", 4096, 10000.0),
    // Llama-3-70B (config.json): Llama-2-70B's layers with the 128,256-token vocabulary.
    shape("llama3-70b", 80, 8192, 64, 8, 28672, 128256, "bf16", 8192, 500000.0),
    // Mistral-7B v0.1 (config.json). Its 4,096-token sliding window is not modelled: attention
    // is priced over the whole context, which overcharges contexts beyond 4,096 tokens.
    shape("mistral-7b", 32, 4096, 32, 8, 14336, 32000, "bf16", 32768, 10000.0),
    // Yi-34B (01.AI, config.json).
    shape("yi-34b", 60, 7168, 56, 8, 20480, 64000, "bf16", 4096, 5000000.0),
    // Falcon-180B (TII; config as TensorRT-LLM's Falcon example lists it): GELU two-matrix MLP of
    // 4 x hidden, RoPE, 8 KV heads, untied LM head. Its parallel attention + MLP costs the same FLOPs.
    gelu(shape("falcon-180b", 80, 14848, 232, 8, 59392, 65024, "bf16", 2048, 10000.0)),
    opt("opt-13b", 40, 5120, 40),
    opt("opt-66b", 64, 9216, 72),
    opt("opt-175b", 96, 12288, 96),
    // Small shapes for the CPU reference backend: tests, and benchmarks (about 125M parameters).
    shape("tiny", 4, 256, 8, 4, 688, 4096, "fp32", 2048, 10000.0),
    shape("llama-100m", 12, 768, 12, 4, 2048, 32000, "fp32", 4096, 10000.0),
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
    // The cards of the papers and of users. Memory, the dense (not sparse) bf16/fp16 matrix rate,
    // the memory bandwidth and the link are NVIDIA's datasheet figures. The rate and bandwidth
    // used are assumed achievable fractions of them, 0.80 and 0.90: the fractions measured on the
    // H200 above (788 of 989 TFLOP/s, 4.3 of 4.8 TB/s), carried over, not measured on these cards.
    // Step overhead and all-reduce latency are assumed, as for the H200.
    HardwareSpec{"a100-40gb", 249.6e12, 1.3995e12, 150e-6, 40e9, 300e9, 8e-6,
                 "datasheet (A100 SXM 40GB): 312 TFLOP/s dense bf16, 1.555 TB/s, 40 GB, NVLink 3 300 GB/s per "
                 "direction; assumed: 0.80 of the rate and 0.90 of the bandwidth achievable (the H200's measured "
                 "fractions), 150 us/step, 8 us per all-reduce",
                 std::nullopt, nullptr, ""},
    HardwareSpec{"a100-80gb", 249.6e12, 1.8351e12, 150e-6, 80e9, 300e9, 8e-6,
                 "datasheet (A100 SXM 80GB): 312 TFLOP/s dense bf16, 2.039 TB/s, 80 GB, NVLink 3 300 GB/s per "
                 "direction; assumed: 0.80 of the rate and 0.90 of the bandwidth achievable (the H200's measured "
                 "fractions), 150 us/step, 8 us per all-reduce",
                 std::nullopt, nullptr, ""},
    HardwareSpec{"h100-sxm", 791.2e12, 3.015e12, 150e-6, 80e9, 450e9, 8e-6,
                 "datasheet (H100 SXM): 989 TFLOP/s dense bf16, 3.35 TB/s, 80 GB, NVLink 4 450 GB/s per direction; "
                 "assumed: 0.80 of the rate and 0.90 of the bandwidth achievable (the H200's measured fractions), "
                 "150 us/step, 8 us per all-reduce",
                 std::nullopt, nullptr, ""},
    HardwareSpec{"h100-pcie", 604.8e12, 1.8e12, 150e-6, 80e9, 64e9, 15e-6,
                 "datasheet (H100 PCIe): 756 TFLOP/s dense bf16, 2.0 TB/s, 80 GB, PCIe Gen5 x16 64 GB/s per "
                 "direction; assumed: 0.80 of the rate and 0.90 of the bandwidth achievable (the H200's measured "
                 "fractions), 150 us/step, 15 us per all-reduce",
                 std::nullopt, nullptr, ""},
    HardwareSpec{"l40s", 289.6e12, 0.7776e12, 150e-6, 48e9, 32e9, 15e-6,
                 "datasheet (L40S): 362 TFLOP/s dense bf16, 0.864 TB/s, 48 GB, PCIe Gen4 x16 32 GB/s per direction "
                 "(no NVLink); assumed: 0.80 of the rate and 0.90 of the bandwidth achievable (the H200's measured "
                 "fractions), 150 us/step, 15 us per all-reduce",
                 std::nullopt, nullptr, ""},
};

// Links between a prefill and a decode instance. Bandwidths are the nominal rates per direction
// (NVLink and PCIe from NVIDIA's and PCI-SIG's figures; InfiniBand HDR/NDR and Ethernet by their
// names' line rates: 200 Gb/s = 25 GB/s), with no achievable fraction taken off; latencies are
// assumed. A channel measured by `tandem calibrate --channel` replaces both.
const std::array kLinks = {
    LinkPreset{"nvlink3", 300, 8, "nominal: NVLink 3 (A100) 300 GB/s per direction; assumed: 8 us per transfer"},
    LinkPreset{"nvlink4", 450, 8, "nominal: NVLink 4 (H100, H200) 450 GB/s per direction; assumed: 8 us per transfer"},
    LinkPreset{"pcie4", 32, 10, "nominal: PCIe Gen4 x16 32 GB/s per direction; assumed: 10 us per transfer"},
    LinkPreset{"pcie5", 64, 10, "nominal: PCIe Gen5 x16 64 GB/s per direction; assumed: 10 us per transfer"},
    LinkPreset{"ib200", 25, 5, "nominal: InfiniBand HDR 200 Gb/s = 25 GB/s per direction; assumed: 5 us per transfer"},
    LinkPreset{"ib400", 50, 5, "nominal: InfiniBand NDR 400 Gb/s = 50 GB/s per direction; assumed: 5 us per transfer"},
    LinkPreset{"eth25", 3.125, 50, "nominal: 25 GbE = 3.125 GB/s per direction; assumed: 50 us per transfer (TCP)"},
    LinkPreset{"eth100", 12.5, 30, "nominal: 100 GbE = 12.5 GB/s per direction; assumed: 30 us per transfer (TCP)"},
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
std::optional<LinkPreset> link_preset(const std::string& name) {
  for (const auto& l : kLinks)
    if (l.name == name) return l;
  return std::nullopt;
}
std::string link_preset_names() { return names(kLinks); }

}  // namespace tandem
