// Checkpoint folders (config.json + *.safetensors): round trips in every dtype, sharding, and
// an InputError (naming file and tensor) for each kind of bad input.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "backend/cpu/checkpoint.h"
#include "sim/workload/config.h"
#include "tests/test_helpers.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

// The shared temp folder, named for this file's tests.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("tandem_ckpt") {}
};

HfLlamaConfig tiny_config() {
  HfLlamaConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 32;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  c.torch_dtype = "bfloat16";
  return c;
}

TensorF32 ramp(std::vector<int64_t> shape, float scale = 1.0f) {
  TensorF32 t{std::move(shape), {}};
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  for (size_t i = 0; i < n; ++i) t.data.push_back(scale * (static_cast<float>(i) - static_cast<float>(n) / 2));
  return t;
}

// The message of the InputError f throws ("" and a failed check if it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL_CHECK("expected an InputError");
  return "";
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A safetensors file with a hand-written header; length_override replaces the 8-byte length.
void write_raw(const std::string& path, const std::string& header, size_t payload_bytes,
               std::optional<uint64_t> length_override = {}) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = length_override.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out << header << std::string(payload_bytes, '\x01');
}

}  // namespace

TEST_CASE("checkpoint: F32 round trip and config.json") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const TensorF32 a = ramp({2, 3}, 0.37f), scalar{{}, {42.5f}}, empty{{0, 4}, {}};
  write_safetensors(dir / "model.safetensors", {{"a", a}, {"s", scalar}, {"e", empty}}, "F32");

  const Checkpoint ck(dir.str());
  const HfLlamaConfig& c = ck.config();
  CHECK(c.hidden_size == 8);
  CHECK(c.intermediate_size == 16);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.vocab_size == 32);
  CHECK(c.max_position_embeddings == 64);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.tie_word_embeddings);
  CHECK(c.torch_dtype == "bfloat16");

  CHECK(ck.names() == std::vector<std::string>{"a", "e", "s"});
  CHECK(ck.has("a"));
  CHECK_FALSE(ck.has("b"));
  const TensorF32 ra = ck.read("a", {2, 3});
  CHECK(ra.shape == a.shape);
  CHECK(ra.data == a.data);  // F32 is bit-exact
  CHECK(ck.read("s").data == scalar.data);
  CHECK(ck.read("s").shape.empty());
  CHECK(ck.read("e", {0, 4}).data.empty());
}

TEST_CASE("checkpoint: BF16 round trip") {
  // Every finite bf16 value survives bf16 -> f32 -> bf16 exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(f32_to_bf16(f) == h);
  }
  // Round to nearest, ties to even (bf16 ulp at 1 is 2^-7).
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));

  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const TensorF32 exact{{4}, {1.0f, -2.0f, 0.5f, 3.140625f}};
  TensorF32 general{{64}, {}};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int i = 0; i < 64; ++i) general.data.push_back(nd(rng));
  write_safetensors(dir / "model.safetensors", {{"exact", exact}, {"general", general}}, "BF16");

  const Checkpoint ck(dir.str());
  CHECK(ck.read("exact").data == exact.data);
  const TensorF32 g = ck.read("general", {64});
  for (size_t i = 0; i < g.data.size(); ++i)
    CHECK(std::fabs(g.data[i] - general.data[i]) <= std::fabs(general.data[i]) * 0x1p-8f);
}

TEST_CASE("checkpoint: F16 round trip") {
  // Every non-NaN half (subnormals, infinities, -0 included) survives half -> f32 -> half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(f32_to_f16(f) == h);
  }
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(f32_to_f16(65519.0f) == 0x7BFF);  // below the midpoint to 2^16: largest finite
  CHECK(f32_to_f16(65520.0f) == 0x7C00);  // the midpoint ties to even: inf
  CHECK(f32_to_f16(0x1p-25f) == 0x0000);  // half the smallest subnormal ties to zero
  CHECK(f32_to_f16(0x1.8p-25f) == 0x0001);
  CHECK(f32_to_f16(0x1.ffcp-15f) == 0x0400);     // subnormal rounding up into the smallest normal
  CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);  // tie to even
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(std::isnan(f16_to_f32(f32_to_f16(NAN))));

  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const TensorF32 exact{{2, 3}, {1.0f, -2.5f, 65504.0f, 0x1p-24f, 0x1p-14f, 0.0f}};
  const TensorF32 general = ramp({5, 7}, 0.1f);
  write_safetensors(dir / "model.safetensors", {{"exact", exact}, {"general", general}}, "F16");
  const Checkpoint ck(dir.str());
  CHECK(ck.read("exact", {2, 3}).data == exact.data);
  const TensorF32 g = ck.read("general", {5, 7});
  for (size_t i = 0; i < g.data.size(); ++i)
    CHECK(std::fabs(g.data[i] - general.data[i]) <= std::fabs(general.data[i]) * 0x1p-11f);
}

TEST_CASE("checkpoint: sharded folder with two safetensors files") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const TensorF32 a = ramp({4, 2}), b = ramp({3}, 0.5f), c = ramp({2, 2, 2}, 2.0f);
  write_safetensors(dir / "model-00001-of-00002.safetensors", {{"layers.0.w", a}, {"embed", b}}, "F32");
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"layers.1.w", c}}, "BF16");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"bogus": "nowhere.safetensors"}})";

  const Checkpoint ck(dir.str());
  CHECK(ck.names() == std::vector<std::string>{"embed", "layers.0.w", "layers.1.w"});
  CHECK(ck.read("layers.0.w", {4, 2}).data == a.data);
  CHECK(ck.read("embed", {3}).data == b.data);
  CHECK(ck.read("layers.1.w", {2, 2, 2}).data == c.data);  // small integers: exact in bf16
  CHECK_FALSE(ck.has("bogus"));                            // the index file is not consulted
}

TEST_CASE("checkpoint: missing tensor") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  write_safetensors(dir / "model.safetensors", {{"a", ramp({2})}}, "F32");
  const Checkpoint ck(dir.str());
  const std::string msg = error_of([&] { ck.read("model.norm.weight"); });
  CHECK(contains(msg, "'model.norm.weight' not found"));
  CHECK(contains(msg, dir.str()));
}

TEST_CASE("checkpoint: wrong shape") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  write_safetensors(dir / "model.safetensors", {{"w", ramp({2, 3})}}, "F32");
  const Checkpoint ck(dir.str());
  const std::string msg = error_of([&] { ck.read("w", {3, 2}); });
  CHECK(contains(msg, "'w'"));
  CHECK(contains(msg, "shape [2, 3], expected [3, 2]"));
  CHECK(contains(msg, "model.safetensors"));
}

TEST_CASE("checkpoint: unsupported dtype") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  write_raw(dir / "model.safetensors", R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4);
  const Checkpoint ck(dir.str());  // indexing is fine: only reading it as floats is not
  CHECK(ck.has("q"));
  const std::string msg = error_of([&] { ck.read("q"); });
  CHECK(contains(msg, "'q'"));
  CHECK(contains(msg, "I8"));
}

TEST_CASE("checkpoint: truncated safetensors file") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const std::string file = dir / "model.safetensors";
  write_safetensors(file, {{"a", ramp({4})}, {"last", ramp({8})}}, "BF16");
  fs::resize_file(file, fs::file_size(file) - 3);
  std::string msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "truncated"));
  CHECK(contains(msg, "'last'"));
  CHECK(contains(msg, file));

  fs::resize_file(file, 5);  // not even the header length survives
  msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "truncated"));
  CHECK(contains(msg, file));
}

TEST_CASE("checkpoint: garbage safetensors header") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const std::string file = dir / "model.safetensors";
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  write_raw(file, good, 8, 0xFFFFFFFFFFFFFFF0ull);  // huge header length
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), file));
  write_raw(file, "this is not json at all!", 8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "not a JSON object"));
  write_raw(file, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);  // 3 floats in 8 bytes
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "'a'"));
  write_raw(file, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "'a'"));
  write_raw(file, R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "'a'"));  // numel overflows 64 bits
  write_raw(file, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "'a'"));
  write_raw(file, R"({"a":{"dtype":"F32","shape":[2]}})", 8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "data_offsets"));
  write_raw(file, R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  CHECK(Checkpoint(dir.str()).read("a", {2}).data.size() == 2);  // metadata is skipped
}

TEST_CASE("checkpoint: duplicate tensor across shards") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  write_safetensors(dir / "a.safetensors", {{"x", ramp({2})}, {"dup.weight", ramp({2})}}, "F32");
  write_safetensors(dir / "b.safetensors", {{"dup.weight", ramp({2})}}, "F16");
  const std::string msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "'dup.weight'"));
  CHECK(contains(msg, "a.safetensors"));
  CHECK(contains(msg, "b.safetensors"));
}

TEST_CASE("checkpoint: config.json errors and defaults") {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", ramp({2})}}, "F32");
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "config.json"));  // absent

  const std::string base = R"("hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 64)";
  std::ofstream(dir / "config.json") << "{" << base << "}";  // no vocab_size
  std::string msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "config.json"));
  CHECK(contains(msg, "'vocab_size'"));

  std::ofstream(dir / "config.json") << "{" << base << R"(, "vocab_size": "32"})";  // wrong type
  msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "config.json"));
  CHECK(contains(msg, "'vocab_size'"));

  std::ofstream(dir / "config.json") << "{" << base << R"(, "vocab_size": 32, "tie_word_embeddings": 1})";
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "'tie_word_embeddings'"));

  std::ofstream(dir / "config.json") << "{" << base << ", \"vocab_size\": 32";  // unterminated JSON
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "config.json"));

  // Optional keys absent: KV heads default to the attention heads (MHA), the rest to HF's defaults.
  std::ofstream(dir / "config.json") << "{" << base << R"(, "vocab_size": 32, "num_key_value_heads": null})";
  const Checkpoint ck(dir.str());
  CHECK(ck.config().num_key_value_heads == 4);
  CHECK(ck.config().rms_norm_eps == 1e-5);
  CHECK(ck.config().rope_theta == 10000.0);
  CHECK_FALSE(ck.config().tie_word_embeddings);
}

TEST_CASE("safetensors: writer rejects bad input") {
  TempDir dir;
  CHECK(contains(error_of([&] { write_safetensors(dir / "x.safetensors", {{"a", ramp({2})}}, "I8"); }), "I8"));
  const std::string msg = error_of([&] { write_safetensors(dir / "x.safetensors", {{"a", {{2, 2}, {1.0f}}}}, "F32"); });
  CHECK(contains(msg, "'a'"));
  CHECK(contains(error_of([&] {
                   write_safetensors(dir / "x.safetensors", {{"a", ramp({1})}, {"a", ramp({1})}}, "F32");
                 }),
                 "'a'"));
}

// Found by adversarial testing (issue #11): inputs the reference implementation or the model
// cannot take must be refused when the checkpoint is read, not accepted or hung on.
TEST_CASE("safetensors: tensors must tile the data buffer (no overlap, gap or trailing bytes)") {
  TempDir dir;
  write_hf_config(dir.str(), tiny_config());
  const std::string file = dir / "model.safetensors";
  write_raw(
      file,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  std::string msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "'b'"));
  CHECK(contains(msg, "overlap"));
  write_raw(
      file,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "overlap"));  // the same bytes twice
  write_raw(file, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "gap"));
  write_raw(file, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9);
  msg = error_of([&] { Checkpoint ck(dir.str()); });
  CHECK(contains(msg, "1 bytes after the last tensor"));
  CHECK(contains(msg, file));
  write_raw(
      file,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      8);
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "key 'a' appears twice"));
  // Out of order in the header, in order in the buffer; and an empty tensor: fine.
  write_raw(
      file,
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      12);
  CHECK(Checkpoint(dir.str()).names().size() == 3);
}

TEST_CASE("checkpoint: config.json shape the model cannot run") {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", ramp({2})}}, "F32");
  const auto with = [&](const std::string& extra, int hidden, int heads) {
    std::ofstream(dir / "config.json") << fmt::format(
        R"({{"hidden_size": {}, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": {},
            "vocab_size": 32, "max_position_embeddings": 64{}}})",
        hidden, heads, extra);
    return error_of([&] { Checkpoint ck(dir.str()); });
  };
  CHECK(contains(with("", 10, 4), "num_attention_heads (4) must divide hidden_size (10)"));
  CHECK(contains(with(R"(, "num_key_value_heads": 3)", 12, 4),
                 "num_key_value_heads (3) must divide num_attention_heads (4)"));
  CHECK(contains(with("", 12, 4), "must be even"));                  // head dim 3
  CHECK(contains(with(R"(, "head_dim": 4)", 16, 2), "'head_dim'"));  // 16 / 2 = 8
  CHECK(contains(with(R"(, "vocab_size": 64)", 8, 2), "key 'vocab_size' appears twice"));
  CHECK(contains(with(R"(, "rope_theta": 1e999)", 8, 2), "config.json"));  // out of double's range
}

TEST_CASE("checkpoint: config.json or a shard that is not a regular file is refused before it is opened") {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", ramp({2})}}, "F32");
  fs::create_symlink("/dev/zero", dir / "config.json");  // would be read without end
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "config.json: not a regular file"));
  fs::remove(dir / "config.json");
  REQUIRE(::mkfifo((dir / "config.json").c_str(), 0600) == 0);  // would block the open
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "config.json: not a regular file"));
  fs::remove(dir / "config.json");
  write_hf_config(dir.str(), tiny_config());
  fs::create_symlink("/dev/zero", dir / "zero.safetensors");
  CHECK(contains(error_of([&] { Checkpoint ck(dir.str()); }), "zero.safetensors: not a regular file"));
}
