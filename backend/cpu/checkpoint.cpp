// safetensors + config.json reader/writer. Every input is untrusted: sizes and offsets are
// checked against the file size before anything is allocated or read, so a truncated or
// garbage file gives an InputError, never a crash or a huge allocation.
#include "backend/cpu/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Tensor bytes are copied straight into host floats/halves; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");

// The reference implementation refuses headers over 100 MB; so do we, so that a garbage
// length in a large shard cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeader = 100'000'000;

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Element size of every safetensors dtype; 0 = unknown (still indexed: read() rejects it).
uint64_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}
bool readable(const std::string& d) { return d == "F32" || d == "BF16" || d == "F16"; }

// --- config.json ---
const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;  // HF writes null for "unset"
}
int32_t get_int(const json& j, const std::string& file, const char* key, std::optional<int32_t> dflt = {}) {
  const json* v = find_key(j, key);
  if (!v) {
    if (dflt) return *dflt;
    fail("{}: missing required key '{}'", file, key);
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > std::numeric_limits<int32_t>::max())
    fail("{}: key '{}' must be a positive 32-bit integer, got {}", file, key, v->dump());
  return static_cast<int32_t>(v->get<int64_t>());
}
double get_double(const json& j, const std::string& file, const char* key, double dflt) {
  const json* v = find_key(j, key);
  if (!v) return dflt;
  if (!v->is_number() || !(v->get<double>() > 0))
    fail("{}: key '{}' must be a positive number, got {}", file, key, v->dump());
  return v->get<double>();
}

// Refuses what is not a plain file before it is opened: a FIFO would block the open, and
// /dev/zero (or a link to it) would be read without end.
void require_plain_file(const fs::path& p, const char* what) {
  std::error_code ec;
  const auto st = fs::status(p, ec);
  if (ec || !fs::exists(st)) fail("{}: cannot open ({})", p.string(), what);
  if (!fs::is_regular_file(st)) fail("{}: not a regular file ({})", p.string(), what);
}

HfLlamaConfig parse_config(const std::string& file) {
  require_plain_file(file, "a checkpoint folder needs config.json");
  std::error_code ec;
  if (const uint64_t size = fs::file_size(file, ec); !ec && size > kMaxHeader)
    fail("{}: {} bytes; a config.json is a few kB (at most {} accepted)", file, size, kMaxHeader);
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open (a checkpoint folder needs config.json)", file);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = parse_json_strict(ss.str());
  } catch (const JsonDuplicateKey& e) {
    fail("{}: key '{}' appears twice", file, e.key);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_object()) fail("{}: not a JSON object", file);
  HfLlamaConfig c;
  c.hidden_size = get_int(j, file, "hidden_size");
  c.intermediate_size = get_int(j, file, "intermediate_size");
  c.num_hidden_layers = get_int(j, file, "num_hidden_layers");
  c.num_attention_heads = get_int(j, file, "num_attention_heads");
  c.num_key_value_heads = get_int(j, file, "num_key_value_heads", c.num_attention_heads);  // MHA when absent
  c.vocab_size = get_int(j, file, "vocab_size");
  c.max_position_embeddings = get_int(j, file, "max_position_embeddings");
  c.rms_norm_eps = get_double(j, file, "rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = get_double(j, file, "rope_theta", c.rope_theta);
  if (const json* v = find_key(j, "tie_word_embeddings")) {
    if (!v->is_boolean()) fail("{}: key 'tie_word_embeddings' must be a boolean, got {}", file, v->dump());
    c.tie_word_embeddings = v->get<bool>();
  }
  if (const json* v = find_key(j, "torch_dtype")) {
    if (!v->is_string()) fail("{}: key 'torch_dtype' must be a string, got {}", file, v->dump());
    c.torch_dtype = v->get<std::string>();
  }
  // The shape must be one the model can run: whole heads, whole query groups, and an even
  // head dim (RoPE rotates pairs of dimensions).
  if (c.hidden_size % c.num_attention_heads != 0)
    fail("{}: num_attention_heads ({}) must divide hidden_size ({})", file, c.num_attention_heads, c.hidden_size);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail("{}: num_key_value_heads ({}) must divide num_attention_heads ({})", file, c.num_key_value_heads,
         c.num_attention_heads);
  const int32_t head_dim = c.hidden_size / c.num_attention_heads;
  if (head_dim % 2 != 0)
    fail("{}: the head dim hidden_size / num_attention_heads = {} / {} = {} must be even (RoPE rotates pairs)", file,
         c.hidden_size, c.num_attention_heads, head_dim);
  if (const json* v = find_key(j, "head_dim"); v && !(v->is_number_integer() && v->get<int64_t>() == head_dim))
    fail("{}: key 'head_dim' is {}, but this backend needs hidden_size / num_attention_heads = {}", file, v->dump(),
         head_dim);
  return c;
}

}  // namespace

// --- 16-bit conversions (round to nearest even; NaN stays NaN, overflow goes to inf) ---
uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN, keep sign
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);  // carries into the exponent correctly
}
float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  // Round m >> shift to nearest, ties to even.
  auto rne = [](uint32_t m, int shift) {
    const uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return r + (rem > half || (rem == half && (r & 1u)) ? 1u : 0u);
  };
  if (ax >= 0x38800000u) return static_cast<uint16_t>(sign | rne(ax - 0x38000000u, 13));  // normal: rebias 127 -> 15
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);                              // <= 2^-25: ties to even zero
  // Subnormal half: units of 2^-24. value = m * 2^(e-150), so units = m >> (126 - e).
  const uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint16_t>(sign | rne(m, static_cast<int>(126 - e)));  // may round up to the smallest normal
}
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

// --- reader ---
Checkpoint::Checkpoint(const std::string& folder) : folder_(folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) fail("{}: not a checkpoint folder (no such directory)", folder);
  config_ = parse_config((fs::path(folder) / "config.json").string());
  std::vector<std::string> files;
  try {
    for (const auto& de : fs::directory_iterator(folder))
      if (de.path().extension() == ".safetensors") {
        require_plain_file(de.path(), "a safetensors shard");
        files.push_back(de.path().string());
      }
  } catch (const fs::filesystem_error& e) {
    fail("{}: cannot list folder: {}", folder, e.what());
  }
  if (files.empty()) fail("{}: no *.safetensors files", folder);
  std::sort(files.begin(), files.end());  // deterministic error messages
  for (const auto& f : files) index_file(f);
}

void Checkpoint::index_file(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) fail("{}: cannot open", path);
  if (size < 8) fail("{}: truncated ({} bytes, shorter than the 8-byte header length)", path, size);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8 || n > kMaxHeader)
    fail("{}: header length {} is impossible for a {}-byte file (not a safetensors file, or truncated)", path, n, size);
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) fail("{}: truncated while reading the header", path);
  json h;
  try {
    h = parse_json_strict(text);
  } catch (const JsonDuplicateKey& e) {
    fail("{}: header: key '{}' appears twice", path, e.key);
  } catch (const json::exception&) {
    fail("{}: header is not a JSON object (not a safetensors file?)", path);
  }
  if (!h.is_object()) fail("{}: header is not a JSON object (not a safetensors file?)", path);
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;  // this file's tensors, to check that they tile the data buffer

  const uint64_t data_start = 8 + n, buffer = size - data_start;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const char* why) { fail("{}: tensor '{}': {}", path, name, why); };
    if (!t.is_object()) bad("header entry is not an object");
    const auto dt = t.find("dtype"), sh = t.find("shape"), off = t.find("data_offsets");
    if (dt == t.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
    if (sh == t.end() || !sh->is_array()) bad("missing 'shape' array");
    if (off == t.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("'data_offsets' must be [begin, end] with non-negative integers");
    Entry e{path, dt->get<std::string>(), {}, 0, 0};
    uint64_t numel = 1;  // saturating: only compared with byte counts bounded by the file size
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      numel = (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) ? std::numeric_limits<uint64_t>::max()
                                                                               : numel * dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end) bad("data_offsets begin > end");
    const uint64_t esz = dtype_size(e.dtype);
    if (esz && (numel > (end - begin) / esz || numel * esz != end - begin))
      fail("{}: tensor '{}': data_offsets span {} bytes, but shape {} of {} needs {}", path, name, end - begin,
           shape_str(e.shape), e.dtype,
           numel > std::numeric_limits<uint64_t>::max() / esz ? std::string("over 2^64") : std::to_string(numel * esz));
    if (end > buffer)
      fail("{}: tensor '{}': data ends at byte {} of a {}-byte data buffer: file truncated", path, name, end, buffer);
    e.offset = data_start + begin;
    e.nbytes = end - begin;
    spans.push_back({begin, end, name});
    const auto [it, inserted] = tensors_.emplace(name, e);
    if (!inserted) fail("tensor '{}' appears in two shards: {} and {}", name, it->second.file, path);
  }
  // As the reference implementation: sorted by offsets, the tensors tile the data buffer
  // exactly, with no overlap, no gap and no trailing bytes.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  uint64_t at = 0;
  const std::string* prev = nullptr;
  for (const Span& sp : spans) {
    if (sp.begin < at)
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (which ends at {})", path, sp.name, sp.begin,
           sp.end, *prev, at);
    if (sp.begin > at)
      fail(
          "{}: tensor '{}': data starts at byte {}, but the data before it ends at {}: a gap the reference "
          "implementation refuses",
          path, sp.name, sp.begin, at);
    at = sp.end;
    prev = &sp.name;
  }
  if (at != buffer)
    fail(
        "{}: {} bytes after the last tensor's data (the data buffer is {} bytes, the tensors cover {}); the reference "
        "implementation refuses trailing bytes",
        path, buffer - at, buffer, at);
}

TensorF32 Checkpoint::read(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("tensor '{}' not found in {}", name, folder_);
  const Entry& e = it->second;
  if (!readable(e.dtype))
    fail("{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be read", e.file, name, e.dtype);
  if (!expected_shape.empty() && expected_shape != e.shape)
    fail("{}: tensor '{}' has shape {}, expected {}", e.file, name, shape_str(e.shape), shape_str(expected_shape));
  TensorF32 t{e.shape, std::vector<float>(e.nbytes / dtype_size(e.dtype))};
  std::ifstream in(e.file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(e.offset));
  std::vector<uint16_t> half(e.dtype == "F32" ? 0 : t.data.size());
  char* dst = e.dtype == "F32" ? reinterpret_cast<char*>(t.data.data()) : reinterpret_cast<char*>(half.data());
  // The file was checked when indexed; a failure here means it shrank since.
  if (!in || !in.read(dst, static_cast<std::streamsize>(e.nbytes)))
    fail("{}: tensor '{}': read failed (file truncated?)", e.file, name);
  if (e.dtype == "BF16") std::transform(half.begin(), half.end(), t.data.begin(), bf16_to_f32);
  if (e.dtype == "F16") std::transform(half.begin(), half.end(), t.data.begin(), f16_to_f32);
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

// --- writers ---
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorF32>>& tensors,
                       const std::string& dtype) {
  if (!readable(dtype)) fail("{}: cannot write dtype '{}' (F32, BF16 or F16)", path, dtype);
  const uint64_t esz = dtype_size(dtype);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();  // keeps the given order in the header too
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail("{}: tensor '{}' has a negative dimension in shape {}", path, name, shape_str(t.shape));
      numel *= static_cast<uint64_t>(d);
    }
    if (numel != t.data.size())
      fail("{}: tensor '{}' has {} values for shape {}", path, name, t.data.size(), shape_str(t.shape));
    if (name == "__metadata__" || h.contains(name)) fail("{}: tensor name '{}' is reserved or repeated", path, name);
    h[name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {off, off + numel * esz}}};
    off += numel * esz;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the reference writer pads so the data starts 8-aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create", path);
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xFF);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) {
    if (dtype == "F32") {
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
      continue;
    }
    std::vector<uint16_t> half(t.data.size());
    std::transform(t.data.begin(), t.data.end(), half.begin(), dtype == "BF16" ? f32_to_bf16 : f32_to_f16);
    out.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(half.size() * 2));
  }
  if (!out.flush()) fail("{}: write failed", path);
}

void write_hf_config(const std::string& folder, const HfLlamaConfig& c) {
  nlohmann::ordered_json j = {{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_hidden_layers", c.num_hidden_layers},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_key_value_heads", c.num_key_value_heads},
                              {"vocab_size", c.vocab_size},
                              {"max_position_embeddings", c.max_position_embeddings},
                              {"rms_norm_eps", c.rms_norm_eps},
                              {"rope_theta", c.rope_theta},
                              {"tie_word_embeddings", c.tie_word_embeddings}};
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  const std::string path = (fs::path(folder) / "config.json").string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create", path);
  out << j.dump(2) << '\n';
  if (!out.flush()) fail("{}: write failed", path);
}

void apply_hf_config(const HfLlamaConfig& c, ModelSpec& m) {
  m.hidden = c.hidden_size;
  m.ffn = c.intermediate_size;
  m.layers = c.num_hidden_layers;
  m.heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.vocab = c.vocab_size;
  m.rope_theta = c.rope_theta;
  m.rms_norm_eps = c.rms_norm_eps;
  m.tie_embeddings = c.tie_word_embeddings;
  if (m.max_model_len <= 0 || m.max_model_len > c.max_position_embeddings) m.max_model_len = c.max_position_embeddings;
}

}  // namespace tandem
