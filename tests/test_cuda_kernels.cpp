// The CUDA backend's kernels and its GEMM wrapper against float64 host references
// (‖out − ref‖ / ‖ref‖), plus the bit-exact promises: batch invariance of the GEMM's
// deterministic mode and of attention, chunk invariance of attention. Every input is fresh
// random data (never zeros); every output is poisoned first (0xFF bytes: NaN in fp32 and
// bf16, -1 in int32) so an element the kernel did not write shows up.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/specs.h"
#include "core/rng.h"
#include "tests/small_models.h"

namespace {

namespace tc = tandem::cuda;
using tandem::Rng;
using tc::bf16;
using tc::DeviceBuffer;

const cudaStream_t kStream = nullptr;  // the legacy default stream: ordered with cudaMemset/cudaMemcpy
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- host helpers ----

float to_f(bf16 v) { return __bfloat162float(v); }
bf16 to_bf(float v) { return __float2bfloat16(v); }
uint16_t bits_of(bf16 v) { return __nv_bfloat16_raw(v).x; }
bf16 bf16_nan() {
  __nv_bfloat16_raw r;
  r.x = 0xFFFF;  // what cudaMemset(0xFF) leaves
  return bf16(r);
}
double as_double(float v) { return double(v); }
double as_double(bf16 v) { return double(to_f(v)); }

std::vector<float> random_floats(Rng& rng, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.uniform(lo, hi));
  return v;
}

std::vector<bf16> random_bf16(Rng& rng, size_t n, double lo, double hi) {
  std::vector<bf16> v(n);
  for (bf16& x : v) x = to_bf(float(rng.uniform(lo, hi)));
  return v;
}

// 0 .. n-1 in random order (Fisher-Yates).
std::vector<int32_t> shuffled(Rng& rng, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (size_t i = v.size() - 1; i > 0; --i) std::swap(v[i], v[size_t(rng.uniform_int(0, int64_t(i)))]);
  return v;
}

template <class T>
size_t count_nonfinite(const std::vector<T>& v) {
  size_t n = 0;
  for (const T& x : v) n += std::isfinite(as_double(x)) ? 0 : 1;
  return n;
}

// ‖out − ref‖ / ‖ref‖; NaN anywhere makes it NaN, which fails every <= bound.
template <class T>
double rel_err(const std::vector<T>& out, const std::vector<double>& ref) {
  REQUIRE(out.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = as_double(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// ---- device helpers ----

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d) {
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> h(d.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
void poison(DeviceBuffer<T>& d) {
  TANDEM_CUDA_CHECK(cudaMemset(d.get(), 0xFF, d.size() * sizeof(T)));
}

}  // namespace

TEST_CASE("cuda kernels: embed_gather copies the embedding rows exactly") {
  Rng rng(101);
  const int64_t V = 1000, h = 200, T = 37;
  const std::vector<bf16> embed = random_bf16(rng, size_t(V * h), -1.0, 1.0);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (int32_t& t : tokens) t = int32_t(rng.uniform_int(0, V - 1));
  tokens[0] = 0;
  tokens[1] = int32_t(V - 1);
  tokens[2] = tokens[5];  // a repeated id
  const DeviceBuffer<bf16> d_embed = upload(embed);
  const DeviceBuffer<int32_t> d_tokens = upload(tokens);
  DeviceBuffer<float> d_x(size_t(T * h));
  poison(d_x);
  tc::embed_gather(d_tokens.get(), d_embed.get(), T, h, d_x.get(), kStream);
  const std::vector<float> x = download(d_x);

  std::vector<float> ref(size_t(T * h));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < h; ++i) ref[size_t(t * h + i)] = to_f(embed[size_t(int64_t(tokens[size_t(t)]) * h + i)]);
  CHECK(count_nonfinite(x) == 0);
  CHECK(same_bits(x.data(), ref.data(), ref.size()));
}

TEST_CASE("cuda kernels: add_rmsnorm with and without a residual") {
  Rng rng(202);
  const int64_t T = 6;
  const float eps = 1e-5f;
  for (const int64_t h : {int64_t(200), int64_t(4096), int64_t(1001), int64_t(8192), int64_t(9000)}) {
    for (const bool with_residual : {true, false}) {
      CAPTURE(h);
      CAPTURE(with_residual);
      // Rows of very different scales: the norm is per row.
      std::vector<float> x0 = random_floats(rng, size_t(T * h), -1.0, 1.0);
      for (int64_t t = 0; t < T; ++t) {
        const float row_scale = float(rng.uniform(0.1, 10.0));
        for (int64_t i = 0; i < h; ++i) x0[size_t(t * h + i)] *= row_scale;
      }
      const std::vector<float> res = random_floats(rng, size_t(T * h), -1.0, 1.0);
      const std::vector<float> w = random_floats(rng, size_t(h), 0.5, 1.5);
      DeviceBuffer<float> d_x = upload(x0);
      const DeviceBuffer<float> d_res = upload(res), d_w = upload(w);
      DeviceBuffer<bf16> d_out(size_t(T * h));
      poison(d_out);
      tc::add_rmsnorm(d_x.get(), with_residual ? d_res.get() : nullptr, d_w.get(), T, h, eps, d_out.get(), kStream);
      const std::vector<float> x = download(d_x);
      const std::vector<bf16> out = download(d_out);

      std::vector<float> x_ref = x0;  // x + residual in fp32: bit for bit
      if (with_residual)
        for (size_t i = 0; i < x_ref.size(); ++i) x_ref[i] = x0[i] + res[i];
      CHECK(same_bits(x.data(), x_ref.data(), x_ref.size()));

      std::vector<double> ref(size_t(T * h));
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < h; ++i) ss += double(x_ref[size_t(t * h + i)]) * double(x_ref[size_t(t * h + i)]);
        const double inv = 1.0 / std::sqrt(ss / double(h) + double(eps));
        for (int64_t i = 0; i < h; ++i)
          ref[size_t(t * h + i)] = double(x_ref[size_t(t * h + i)]) * inv * double(w[size_t(i)]);
      }
      CHECK(count_nonfinite(out) == 0);
      const double rel = rel_err(out, ref);
      CHECK_MESSAGE(rel <= 1e-2, "rel ", rel);

      // V2 (loads first): V1's bits, x and out.
      DeviceBuffer<float> d_x2 = upload(x0);
      DeviceBuffer<bf16> d_out2(size_t(T * h));
      poison(d_out2);
      tc::add_rmsnorm(d_x2.get(), with_residual ? d_res.get() : nullptr, d_w.get(), T, h, eps, d_out2.get(), kStream,
                      tc::RowKernels::V2);
      const std::vector<float> x2 = download(d_x2);
      const std::vector<bf16> out2 = download(d_out2);
      CHECK(same_bits(x2.data(), x.data(), x.size()));
      CHECK(same_bits(out2.data(), out.data(), out.size()));
    }
  }
}

TEST_CASE("cuda kernels: rope_store_kv rotates q and k and scatters k and v into the paged cache") {
  struct Case {
    int32_t heads, kv_heads, hd;
  };
  Rng rng(303);
  for (const Case c : {Case{8, 2, 128}, Case{12, 4, 64}, Case{32, 8, 128}, Case{64, 8, 128}}) {
    CAPTURE(c.hd);
    tandem::ModelSpec m =
        tandem::testing::small_model({.heads = c.heads, .kv_heads = c.kv_heads, .hidden = c.heads * c.hd});
    m.rope_theta = 500000.0;
    m.max_model_len = 2048;
    REQUIRE(m.head_dim() == c.hd);
    std::vector<float> cos_t, sin_t;
    tandem::cpu::rope_tables(m, cos_t, sin_t, m.max_model_len);

    const int64_t T = 40, hd = c.hd, half = hd / 2, stride = int64_t(c.heads + 2 * c.kv_heads) * hd;
    const int64_t kvn = int64_t(c.kv_heads) * hd;  // one slot's K (or V)
    const int32_t num_slots = 64 * 16;
    const std::vector<float> qkv0 = random_floats(rng, size_t(T * stride), -1.0, 1.0);
    std::vector<int32_t> positions(static_cast<size_t>(T)), slots(static_cast<size_t>(T));
    for (int32_t& p : positions) p = int32_t(rng.uniform_int(0, m.max_model_len - 1));
    positions[0] = 0;
    positions[1] = m.max_model_len - 1;
    const std::vector<int32_t> perm = shuffled(rng, num_slots);                            // distinct, scattered slots
    for (int64_t t = 0; t < T; ++t) slots[size_t(t)] = t % 5 == 3 ? -1 : perm[size_t(t)];  // every 5th row: padding

    DeviceBuffer<float> d_qkv = upload(qkv0);
    const DeviceBuffer<int32_t> d_pos = upload(positions), d_slots = upload(slots);
    const DeviceBuffer<float> d_cos = upload(cos_t), d_sin = upload(sin_t);
    DeviceBuffer<bf16> d_k(size_t(num_slots) * size_t(kvn)), d_v(size_t(num_slots) * size_t(kvn));
    poison(d_k);
    poison(d_v);
    tc::rope_store_kv(d_qkv.get(), d_pos.get(), d_slots.get(), d_cos.get(), d_sin.get(), T, c.heads, c.kv_heads, c.hd,
                      d_k.get(), d_v.get(), kStream);
    const std::vector<float> qkv = download(d_qkv);
    const std::vector<bf16> kc = download(d_k), vc = download(d_v);

    // q and k heads rotated (rotate-half), every row, padding rows included.
    std::vector<float> got;
    std::vector<double> ref;
    size_t v_changed = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = positions[size_t(t)];
      for (int64_t head = 0; head < c.heads + c.kv_heads; ++head) {
        const int64_t base = t * stride + head * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double a = qkv0[size_t(base + i)], b = qkv0[size_t(base + i + half)];
          const double co = cos_t[size_t(pos * half + i)], si = sin_t[size_t(pos * half + i)];
          got.push_back(qkv[size_t(base + i)]);
          ref.push_back(a * co - b * si);
          got.push_back(qkv[size_t(base + i + half)]);
          ref.push_back(b * co + a * si);
        }
      }
      const int64_t v0 = t * stride + int64_t(c.heads + c.kv_heads) * hd;  // v is not touched in qkv
      v_changed += same_bits(&qkv[size_t(v0)], &qkv0[size_t(v0)], size_t(kvn)) ? 0 : 1;
    }
    const double rel_rot = rel_err(got, ref);
    CHECK_MESSAGE(rel_rot <= 1e-5, "rotation rel ", rel_rot);
    CHECK(v_changed == 0);

    // The cache: targeted slots hold bf16(rotated k) and bf16(v); every other slot is untouched.
    std::vector<int64_t> row_of_slot(size_t(num_slots), -1);
    for (int64_t t = 0; t < T; ++t)
      if (slots[size_t(t)] >= 0) row_of_slot[size_t(slots[size_t(t)])] = t;
    std::vector<bf16> k_got;
    std::vector<double> k_ref;
    size_t k_not_from_qkv = 0, v_wrong = 0, untouched_written = 0, targeted = 0;
    for (int32_t slot = 0; slot < num_slots; ++slot) {
      const int64_t t = row_of_slot[size_t(slot)];
      for (int64_t i = 0; i < kvn; ++i) {
        const size_t ci = size_t(int64_t(slot) * kvn + i);
        if (t < 0) {
          untouched_written += (bits_of(kc[ci]) != 0xFFFF || bits_of(vc[ci]) != 0xFFFF) ? 1 : 0;
          continue;
        }
        const int64_t k_at = t * stride + int64_t(c.heads) * hd + i, v_at = k_at + kvn;
        k_got.push_back(kc[ci]);
        // The reference rotation of this k element (k heads follow the q heads in `ref`).
        const int64_t head = c.heads + i / hd, d = i % hd;
        const size_t r = size_t((t * (c.heads + c.kv_heads) + head) * hd + (d < half ? 2 * d : 2 * (d - half) + 1));
        k_ref.push_back(ref[r]);
        k_not_from_qkv += bits_of(kc[ci]) != bits_of(to_bf(qkv[size_t(k_at)])) ? 1 : 0;
        v_wrong += bits_of(vc[ci]) != bits_of(to_bf(qkv0[size_t(v_at)])) ? 1 : 0;
      }
      targeted += t < 0 ? 0 : 1;
    }
    CHECK(targeted == size_t(T - T / 5));
    CHECK(untouched_written == 0);
    CHECK(count_nonfinite(k_got) == 0);
    const double rel_k = rel_err(k_got, k_ref);
    CHECK_MESSAGE(rel_k <= 1e-2, "cached k rel ", rel_k);
    CHECK(k_not_from_qkv == 0);

    // V2 (loads first): V1's bits in qkv and in both caches, padding rows included.
    DeviceBuffer<float> d_qkv2 = upload(qkv0);
    DeviceBuffer<bf16> d_k2(d_k.size()), d_v2(d_v.size());
    poison(d_k2);
    poison(d_v2);
    tc::rope_store_kv(d_qkv2.get(), d_pos.get(), d_slots.get(), d_cos.get(), d_sin.get(), T, c.heads, c.kv_heads, c.hd,
                      d_k2.get(), d_v2.get(), kStream, tc::RowKernels::V2);
    const std::vector<float> qkv2 = download(d_qkv2);
    const std::vector<bf16> kc2 = download(d_k2), vc2 = download(d_v2);
    CHECK(same_bits(qkv2.data(), qkv.data(), qkv.size()));
    CHECK(same_bits(kc2.data(), kc.data(), kc.size()));
    CHECK(same_bits(vc2.data(), vc.data(), vc.size()));
    CHECK(v_wrong == 0);
  }
}

namespace {

constexpr int32_t kBlockSize = 16;

struct AttnCfg {
  int32_t heads, kv_heads, hd;
  int64_t q_width() const { return int64_t(heads) * hd; }
  int64_t qkv_stride() const { return int64_t(heads + 2 * kv_heads) * hd; }
};

// One layer's paged K/V cache on the host, [block * bs + slot][kv_heads][hd]; slots no
// sequence owns hold NaN, so a read of a wrong slot poisons the output.
struct KvHost {
  AttnCfg c;
  std::vector<bf16> k, v;
  std::vector<int32_t> free_blocks;  // shuffled
  KvHost(const AttnCfg& cfg, int32_t num_blocks, Rng& rng)
      : c(cfg),
        k(size_t(num_blocks) * kBlockSize * size_t(cfg.kv_heads) * size_t(cfg.hd), bf16_nan()),
        v(k.size(), bf16_nan()),
        free_blocks(shuffled(rng, num_blocks)) {}
  size_t at(int64_t slot, int64_t kv_head) const { return size_t((slot * c.kv_heads + kv_head) * c.hd); }
  // Takes scattered blocks for `context` tokens and fills their K/V; returns the block table.
  std::vector<int32_t> allocate(int32_t context, Rng& rng) {
    std::vector<int32_t> table;
    for (int32_t b = 0; b < (context + kBlockSize - 1) / kBlockSize; ++b) {
      REQUIRE(!free_blocks.empty());
      table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    for (int32_t p = 0; p < context; ++p) {
      const int64_t slot = int64_t(table[size_t(p / kBlockSize)]) * kBlockSize + p % kBlockSize;
      for (int64_t i = 0; i < int64_t(c.kv_heads) * c.hd; ++i) {
        k[at(slot, 0) + size_t(i)] = to_bf(float(rng.uniform(-1.0, 1.0)));
        v[at(slot, 0) + size_t(i)] = to_bf(float(rng.uniform(-1.0, 1.0)));
      }
    }
    return table;
  }
};

// n query tokens at positions n_before .. n_before + n - 1 of a sequence whose K/V are cached.
struct AttnSeq {
  std::vector<int32_t> table;
  int32_t n_before = 0, n = 0;
  std::vector<float> q;  // [n][heads * hd]
};

AttnSeq slice(const AttnSeq& s, int32_t from, int32_t count, const AttnCfg& c) {
  const size_t w = size_t(c.q_width());
  return AttnSeq{s.table, s.n_before + from, count,
                 std::vector<float>(s.q.begin() + std::ptrdiff_t(size_t(from) * w),
                                    s.q.begin() + std::ptrdiff_t(size_t(from + count) * w))};
}

// fp64 causal softmax attention with GQA: q head h reads KV head h / group; the query at
// absolute position p sees keys 0..p.
std::vector<double> attention_ref(const KvHost& kv, const AttnSeq& s) {
  const AttnCfg& c = kv.c;
  const int32_t group = c.heads / c.kv_heads;
  const int64_t w = c.q_width();
  const double scale = 1.0 / std::sqrt(double(c.hd));
  std::vector<double> out(size_t(int64_t(s.n) * w), 0.0), p;
  for (int32_t i = 0; i < s.n; ++i) {
    const int32_t pos = s.n_before + i;
    for (int32_t h = 0; h < c.heads; ++h) {
      const int32_t g = h / group;
      const float* q = &s.q[size_t(int64_t(i) * w + int64_t(h) * c.hd)];
      p.assign(size_t(pos) + 1, 0.0);
      double mx = -INFINITY;
      for (int32_t j = 0; j <= pos; ++j) {
        const int64_t slot = int64_t(s.table[size_t(j / kBlockSize)]) * kBlockSize + j % kBlockSize;
        const bf16* k = &kv.k[kv.at(slot, g)];
        double dot = 0;
        for (int32_t d = 0; d < c.hd; ++d) dot += double(q[d]) * double(to_f(k[d]));
        p[size_t(j)] = dot * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      double* o = &out[size_t(int64_t(i) * w + int64_t(h) * c.hd)];
      for (int32_t j = 0; j <= pos; ++j) {
        const int64_t slot = int64_t(s.table[size_t(j / kBlockSize)]) * kBlockSize + j % kBlockSize;
        const bf16* v = &kv.v[kv.at(slot, g)];
        const double pj = p[size_t(j)] / sum;
        for (int32_t d = 0; d < c.hd; ++d) o[d] += pj * double(to_f(v[d]));
      }
    }
  }
  return out;
}

// The attention variants: paged_attention (simt), paged_attention_mma, and
// paged_attention_split made to spread its splits (a workspace that fits) or to walk them in
// each block (none).
enum class Attn { simt, mma, split_spread, split_inblock, mma_split_spread, mma_split_inblock };
const char* name(Attn a) {
  switch (a) {
    case Attn::simt: return "simt";
    case Attn::mma: return "mma";
    case Attn::split_spread: return "split (spread)";
    case Attn::split_inblock: return "split (in-block)";
    case Attn::mma_split_spread: return "mma_split (spread)";
    case Attn::mma_split_inblock: return "mma_split (in-block)";
  }
  return "?";
}

// One attention launch of variant `kind` over `seqs`, built as the model builds a step (tiles
// of the kernel's tile tokens, a trailing padding tile). The k/v part of the qkv rows is NaN:
// only q may be read. Returns each sequence's output rows ([n][heads * hd]).
std::vector<std::vector<bf16>> attend(Attn kind, const KvHost& kv, const DeviceBuffer<bf16>& d_k,
                                      const DeviceBuffer<bf16>& d_v, const std::vector<const AttnSeq*>& seqs) {
  const bool mma = kind == Attn::mma || kind == Attn::mma_split_spread || kind == Attn::mma_split_inblock;
  const AttnCfg& c = kv.c;
  const int64_t w = c.q_width(), stride = c.qkv_stride();
  int64_t T = 0;
  size_t width = 1;
  for (const AttnSeq* s : seqs) {
    T += s->n;
    width = std::max(width, s->table.size());
  }
  std::vector<float> qkv(size_t(T * stride), kNaN);
  std::vector<int32_t> tables(seqs.size() * width, 0);
  std::vector<tc::AttentionTile> tiles;
  const int32_t group = c.heads / c.kv_heads;
  const int32_t tile_tokens = mma ? tc::attention_mma_tile_tokens(group) : tc::attention_tile_tokens(group);
  int64_t t0 = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttnSeq& q = *seqs[s];
    std::copy(q.table.begin(), q.table.end(), tables.begin() + std::ptrdiff_t(s * width));
    for (int64_t i = 0; i < q.n; ++i) std::copy_n(&q.q[size_t(i * w)], size_t(w), &qkv[size_t((t0 + i) * stride)]);
    for (int32_t i0 = 0; i0 < q.n; i0 += tile_tokens)
      tiles.push_back(
          tc::AttentionTile{int32_t(s), int32_t(t0 + i0), std::min(tile_tokens, q.n - i0), q.n_before + i0});
    t0 += q.n;
  }
  tiles.push_back(tc::AttentionTile{int32_t(tiles.size()), 0, 0, 0});  // padding: must do nothing

  const DeviceBuffer<float> d_qkv = upload(qkv);
  const DeviceBuffer<int32_t> d_tables = upload(tables);
  const DeviceBuffer<tc::AttentionTile> d_tiles = upload(tiles);
  DeviceBuffer<bf16> d_out(size_t(T * w));
  poison(d_out);
  tc::AttentionArgs args{.qkv = d_qkv.get(),
                         .qkv_stride = stride,
                         .k_cache = d_k.get(),
                         .v_cache = d_v.get(),
                         .block_tables = d_tables.get(),
                         .table_width = int32_t(width),
                         .block_size = kBlockSize,
                         .tiles = d_tiles.get(),
                         .n_tiles = int32_t(tiles.size()),
                         .heads = c.heads,
                         .kv_heads = c.kv_heads,
                         .head_dim = c.hd,
                         .out = d_out.get(),
                         .tokens = T,
                         .max_positions = int32_t(width) * kBlockSize};
  if (kind == Attn::mma) {
    tc::paged_attention_mma(args, kStream);
  } else if (kind == Attn::simt) {
    tc::paged_attention(args, kStream);
  } else {
    // The workspace of the spread way, poisoned: a partial the combine reads unwritten shows.
    const bool spread = kind == Attn::split_spread || kind == Attn::mma_split_spread;
    const int64_t ws_floats = tc::attention_split_workspace_floats(T * c.heads, args.max_positions, c.hd);
    DeviceBuffer<float> ws(size_t(spread ? ws_floats : 1));
    poison(ws);
    args.split_workspace = spread ? ws.get() : nullptr;
    args.split_workspace_floats = spread ? ws_floats : 0;
    CHECK(tc::attention_split_spreads(args) == spread);
    (mma ? tc::paged_attention_mma_split : tc::paged_attention_split)(args, kStream);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(kStream));
  }
  const std::vector<bf16> out = download(d_out);
  CHECK_MESSAGE(count_nonfinite(out) == 0, "attention output not all written (or NaN)");

  std::vector<std::vector<bf16>> per_seq;
  t0 = 0;
  for (const AttnSeq* s : seqs) {
    per_seq.emplace_back(out.begin() + std::ptrdiff_t(t0 * w), out.begin() + std::ptrdiff_t((t0 + s->n) * w));
    t0 += s->n;
  }
  return per_seq;
}

}  // namespace

TEST_CASE("cuda kernels: paged attention (simt, mma, split-KV both ways) vs float64, batch and chunk invariance") {
  Rng rng(404);
  for (const Attn kind : {Attn::simt, Attn::mma, Attn::split_spread, Attn::split_inblock, Attn::mma_split_spread,
                          Attn::mma_split_inblock})
    for (const AttnCfg c : {AttnCfg{8, 2, 128}, AttnCfg{12, 4, 64}, AttnCfg{8, 8, 32}, AttnCfg{16, 1, 32}}) {
      CAPTURE(name(kind));
      CAPTURE(c.hd);
      CAPTURE(c.heads);
      CAPTURE(c.kv_heads);
      REQUIRE(tc::attention_supports_head_dim(c.hd));
      KvHost kv(c, 96, rng);
      const auto make_seq = [&](int32_t n_before, int32_t n) {
        AttnSeq s;
        s.table = kv.allocate(n_before + n, rng);
        s.n_before = n_before;
        s.n = n;
        s.q = random_floats(rng, size_t(int64_t(n) * c.q_width()), -2.0, 2.0);
        return s;
      };
      const int32_t decode_context = int32_t(rng.uniform_int(1, 300));
      const AttnSeq decode = make_seq(decode_context - 1, 1);
      const AttnSeq decode_first = make_seq(0, 1);  // context 1
      const AttnSeq decode_65 = make_seq(64, 1);    // first key of the second key tile
      const AttnSeq chunk = make_seq(37, 50);       // a prefill chunk over a cached prefix
      const AttnSeq prefill = make_seq(0, 130);     // a whole prompt
      const AttnSeq prompt = make_seq(0, 100);      // for the chunking checks
      const DeviceBuffer<bf16> d_k = upload(kv.k), d_v = upload(kv.v);
      MESSAGE(name(kind), " hd ", c.hd, " heads ", c.heads, " kv ", c.kv_heads, ": decode context ", decode_context);

      // All together in one launch, against the reference.
      const std::vector<const AttnSeq*> together{&decode, &chunk, &decode_first, &prefill, &decode_65};
      const std::vector<std::vector<bf16>> out = attend(kind, kv, d_k, d_v, together);
      const std::string names[] = {"decode", "chunk", "decode_first", "prefill", "decode_65"};
      for (size_t s = 0; s < together.size(); ++s) {
        const double rel = rel_err(out[s], attention_ref(kv, *together[s]));
        CHECK_MESSAGE(rel <= 1e-2, names[s], " rel ", rel);
      }

      // Batch invariance: each sequence alone gives the same bits as in the mixed launch.
      for (size_t s = 0; s < together.size(); ++s) {
        const std::vector<std::vector<bf16>> alone = attend(kind, kv, d_k, d_v, {together[s]});
        CHECK_MESSAGE(same_bits(alone[0].data(), out[s].data(), out[s].size()), names[s], " alone != together");
      }

      // Chunk invariance: the prompt at once == in two chunks == as single-token steps.
      const std::vector<bf16> once = attend(kind, kv, d_k, d_v, {&prompt})[0];
      const double rel_once = rel_err(once, attention_ref(kv, prompt));
      CHECK_MESSAGE(rel_once <= 1e-2, "prompt rel ", rel_once);
      const size_t w = size_t(c.q_width());
      const AttnSeq first = slice(prompt, 0, 37, c), second = slice(prompt, 37, 63, c);
      const std::vector<bf16> out_first = attend(kind, kv, d_k, d_v, {&first})[0];
      const std::vector<bf16> out_second = attend(kind, kv, d_k, d_v, {&second})[0];
      CHECK(same_bits(out_first.data(), once.data(), 37 * w));
      CHECK(same_bits(out_second.data(), once.data() + 37 * w, 63 * w));
      // The second chunk next to a decode, in the other order.
      const std::vector<std::vector<bf16>> mixed = attend(kind, kv, d_k, d_v, {&decode, &second});
      CHECK(same_bits(mixed[1].data(), once.data() + 37 * w, 63 * w));
      CHECK(same_bits(mixed[0].data(), out[0].data(), w));
      for (const int32_t pos : {0, 1, 15, 16, 63, 64, 65, 99}) {
        CAPTURE(pos);
        const AttnSeq step = slice(prompt, pos, 1, c);
        const std::vector<bf16> one = attend(kind, kv, d_k, d_v, {&step})[0];
        CHECK(same_bits(one.data(), once.data() + size_t(pos) * w, w));
      }
    }
}

// Each split-KV kernel's two ways (spread over the GPU with a combine kernel, or walked in each
// block) are one function: the same bits for every row, over contexts of 1 to 11 splits.
TEST_CASE("cuda kernels: split-KV attention (CUDA cores and tensor cores) spread == in-block, bit for bit") {
  Rng rng(405);
  for (const bool tensor_cores : {false, true})
    for (const AttnCfg c : {AttnCfg{32, 8, 128}, AttnCfg{12, 4, 64}, AttnCfg{16, 1, 32}}) {
      const Attn spread_kind = tensor_cores ? Attn::mma_split_spread : Attn::split_spread;
      const Attn inblock_kind = tensor_cores ? Attn::mma_split_inblock : Attn::split_inblock;
      CAPTURE(tensor_cores);
      CAPTURE(c.hd);
      CAPTURE(c.heads);
      KvHost kv(c, 160, rng);
      std::vector<AttnSeq> seqs;
      for (const auto& [n_before, n] : {std::pair{699, 1}, std::pair{63, 1}, std::pair{64, 1}, std::pair{0, 1},
                                        std::pair{127, 1}, std::pair{300, 45}, std::pair{0, 200}}) {
        AttnSeq s;
        s.table = kv.allocate(n_before + n, rng);
        s.n_before = n_before;
        s.n = n;
        s.q = random_floats(rng, size_t(int64_t(n) * c.q_width()), -2.0, 2.0);
        seqs.push_back(std::move(s));
      }
      std::vector<const AttnSeq*> all;
      for (const AttnSeq& s : seqs) all.push_back(&s);
      const DeviceBuffer<bf16> d_k = upload(kv.k), d_v = upload(kv.v);
      const auto spread = attend(spread_kind, kv, d_k, d_v, all);
      const auto inblock = attend(inblock_kind, kv, d_k, d_v, all);
      for (size_t i = 0; i < seqs.size(); ++i) {
        CAPTURE(seqs[i].n_before);
        CHECK(same_bits(spread[i].data(), inblock[i].data(), spread[i].size()));
        const double rel = rel_err(spread[i], attention_ref(kv, seqs[i]));
        CHECK_MESSAGE(rel <= 1e-2, "rel ", rel);
      }
      // A decode batch alone (the spread way's use) against the same rows in the mixed launch.
      const auto decodes = attend(spread_kind, kv, d_k, d_v, {all[0], all[1], all[2], all[3], all[4]});
      for (size_t i = 0; i < decodes.size(); ++i)
        CHECK(same_bits(decodes[i].data(), inblock[i].data(), decodes[i].size()));
    }
}

TEST_CASE("cuda kernels: swiglu") {
  Rng rng(505);
  const int64_t T = 7, ffn = 1001;
  const std::vector<float> gu = random_floats(rng, size_t(T * 2 * ffn), -6.0, 6.0);
  const DeviceBuffer<float> d_gu = upload(gu);
  DeviceBuffer<bf16> d_act(size_t(T * ffn));
  poison(d_act);
  tc::swiglu(d_gu.get(), T, ffn, d_act.get(), kStream);
  const std::vector<bf16> act = download(d_act);
  std::vector<double> ref(size_t(T * ffn));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < ffn; ++i) {
      const double g = gu[size_t(t * 2 * ffn + i)], u = gu[size_t(t * 2 * ffn + ffn + i)];
      ref[size_t(t * ffn + i)] = g / (1.0 + std::exp(-g)) * u;
    }
  CHECK(count_nonfinite(act) == 0);
  const double rel = rel_err(act, ref);
  CHECK_MESSAGE(rel <= 1e-2, "rel ", rel);
}

TEST_CASE("cuda kernels: gather_rows copies rows exactly") {
  Rng rng(606);
  const int64_t R = 50, h = 300, n = 23;
  const std::vector<bf16> in = random_bf16(rng, size_t(R * h), -3.0, 3.0);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int32_t& r : rows) r = int32_t(rng.uniform_int(0, R - 1));
  rows[0] = int32_t(R - 1);
  rows[1] = 0;
  rows[2] = rows[7];  // a repeat
  const DeviceBuffer<bf16> d_in = upload(in);
  const DeviceBuffer<int32_t> d_rows = upload(rows);
  DeviceBuffer<bf16> d_out(size_t(n * h));
  poison(d_out);
  tc::gather_rows(d_in.get(), d_rows.get(), n, h, d_out.get(), kStream);
  const std::vector<bf16> out = download(d_out);
  size_t wrong_rows = 0;
  for (int64_t i = 0; i < n; ++i)
    wrong_rows += same_bits(&out[size_t(i * h)], &in[size_t(int64_t(rows[size_t(i)]) * h)], size_t(h)) ? 0 : 1;
  CHECK(wrong_rows == 0);
}

namespace {
// The first maximum; NaNs never win; 0 when nothing compares (not reached by the test rows).
int32_t first_argmax(const float* row, int64_t V) {
  int64_t best = -1;
  float bv = 0;
  for (int64_t j = 0; j < V; ++j) {
    if (std::isnan(row[j])) continue;
    if (best < 0 || row[j] > bv) {
      best = j;
      bv = row[j];
    }
  }
  return best < 0 ? 0 : int32_t(best);
}
}  // namespace

TEST_CASE("cuda kernels: argmax_rows (first maximum, NaN never wins)") {
  Rng rng(707);
  for (const int64_t V : {int64_t(128256), int64_t(997)}) {
    CAPTURE(V);
    const int64_t n = 9;
    std::vector<float> logits = random_floats(rng, size_t(n * V), -10.0, 10.0);
    const auto row = [&](int64_t r) { return &logits[size_t(r * V)]; };
    const auto any = [&](int64_t lo, int64_t hi) { return rng.uniform_int(lo, hi); };
    // Row 0: plain. Row 1: a tie of the maximum at two indices far apart.
    {
      const int64_t j1 = any(0, V / 2 - 1), j2 = any(V / 2, V - 1);
      row(1)[j1] = row(1)[j2] = 20.0f;
    }
    // Row 2: a tie at neighbours, at the same thread's stride (1024 apart, when V allows) and at V - 1.
    {
      const int64_t j = any(0, V / 4);
      row(2)[j] = row(2)[j + 1] = row(2)[V - 1] = 25.0f;
      if (j + 1024 < V) row(2)[j + 1024] = 25.0f;
    }
    // Row 3: NaNs everywhere (index 0 included), bigger than nothing.
    {
      for (int64_t k = 0; k < V / 10; ++k) row(3)[any(0, V - 1)] = kNaN;
      row(3)[0] = kNaN;
      row(3)[V - 1] = kNaN;
    }
    // Row 4: the maximum at V - 1. Row 5: the maximum at 0, followed by a NaN.
    row(4)[V - 1] = 30.0f;
    row(5)[0] = 30.0f;
    row(5)[1] = kNaN;
    // Row 6: every value -inf: the first one is the first maximum.
    std::fill_n(row(6), V, -INFINITY);
    // Row 7: NaNs and a tie among the finite values, with a NaN just before each.
    {
      const int64_t j1 = any(2, V / 2 - 1), j2 = any(V / 2 + 1, V - 1);
      row(7)[j1] = row(7)[j2] = 15.0f;
      row(7)[j1 - 1] = row(7)[j2 - 1] = kNaN;
      for (int64_t k = 0; k < V / 20; ++k) {
        const int64_t j = any(0, V - 1);
        if (j != j1 && j != j2) row(7)[j] = kNaN;
      }
    }
    // Row 8: +inf wins over everything, and a later +inf does not.
    {
      const int64_t j = any(0, V / 2);
      row(8)[j] = INFINITY;
      row(8)[V - 1] = INFINITY;
    }
    const DeviceBuffer<float> d_logits = upload(logits);
    DeviceBuffer<int32_t> d_out(static_cast<size_t>(n));
    poison(d_out);
    tc::argmax_rows(d_logits.get(), n, V, d_out.get(), kStream);
    const std::vector<int32_t> out = download(d_out);
    for (int64_t r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(out[size_t(r)] == first_argmax(row(r), V));
    }
    CHECK(first_argmax(row(6), V) == 0);
  }
}

namespace {

struct GemmShape {
  int64_t N, K;
};

std::vector<double> to_double(const std::vector<bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = double(to_f(v[i]));
  return d;
}

// Y = X W^T in float64 on the same bf16 values.
std::vector<double> gemm_ref(const std::vector<double>& X, int64_t T, int64_t K, const std::vector<double>& W,
                             int64_t N) {
  std::vector<double> Y(size_t(T * N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const double* x = &X[size_t(t * K)];
      const double* w = &W[size_t(n * K)];
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += x[k] * w[k];
      Y[size_t(t * N + n)] = acc;
    }
  return Y;
}

// Y_T (poisoned first) for the first T rows of X.
std::vector<float> run_gemm(tc::Gemm& gemm, const DeviceBuffer<bf16>& X, int64_t T, int64_t K,
                            const DeviceBuffer<bf16>& W, int64_t N) {
  DeviceBuffer<float> Y(size_t(T * N));
  poison(Y);
  gemm.run(X.get(), T, K, W.get(), N, Y.get(), kStream);
  return download(Y);
}

const GemmShape kGemmShapes[] = {{1536, 512}, {997, 200}};

}  // namespace

TEST_CASE("cuda gemm: Y = X W^T against float64 (deterministic mode)") {
  Rng rng(808);
  tc::Gemm gemm(true, 256);
  for (const GemmShape sh : kGemmShapes) {
    CAPTURE(sh.N);
    CAPTURE(sh.K);
    MESSAGE("N ", sh.N, " K ", sh.K, ": ", gemm.describe(sh.N, sh.K));
    const std::vector<bf16> W = random_bf16(rng, size_t(sh.N * sh.K), -1.0, 1.0);
    const std::vector<double> Wd = to_double(W);
    const DeviceBuffer<bf16> d_W = upload(W);
    for (const int64_t T : {int64_t(1), int64_t(7), int64_t(64), int64_t(300)}) {
      CAPTURE(T);
      const std::vector<bf16> X = random_bf16(rng, size_t(T * sh.K), -1.0, 1.0);
      const DeviceBuffer<bf16> d_X = upload(X);
      const std::vector<float> Y = run_gemm(gemm, d_X, T, sh.K, d_W, sh.N);
      CHECK(count_nonfinite(Y) == 0);
      const double rel = rel_err(Y, gemm_ref(to_double(X), T, sh.K, Wd, sh.N));
      CHECK_MESSAGE(rel <= 1e-4, "rel ", rel);
    }
  }
}

TEST_CASE("cuda gemm: deterministic mode is batch-invariant (fast mode: reported only)") {
  Rng rng(809);
  tc::Gemm det(true, 256), fast(false, 256);
  const int64_t kRows = 1024;
  const int64_t Ts[] = {1, 2, 3, 7, 16, 33, 64, 100, 255, 256, 257, 512, 1000, 1024};
  for (const GemmShape sh : kGemmShapes) {
    CAPTURE(sh.N);
    CAPTURE(sh.K);
    MESSAGE("N ", sh.N, " K ", sh.K, ": ", det.describe(sh.N, sh.K));
    const DeviceBuffer<bf16> d_W = upload(random_bf16(rng, size_t(sh.N * sh.K), -1.0, 1.0));
    const DeviceBuffer<bf16> d_X = upload(random_bf16(rng, size_t(kRows * sh.K), -1.0, 1.0));
    const std::vector<float> full = run_gemm(det, d_X, kRows, sh.K, d_W, sh.N);
    REQUIRE(count_nonfinite(full) == 0);
    for (const int64_t T : Ts) {
      CAPTURE(T);
      const std::vector<float> Y = run_gemm(det, d_X, T, sh.K, d_W, sh.N);
      CHECK(count_nonfinite(Y) == 0);
      CHECK_MESSAGE(same_bits(Y.data(), full.data(), Y.size()), "rows of Y_", T, " differ from Y_1024");
    }

    // Fast mode makes no promise of invariance: say what it does. It must still be right.
    const std::vector<float> fast_full = run_gemm(fast, d_X, kRows, sh.K, d_W, sh.N);
    const double rel = rel_err(fast_full, std::vector<double>(full.begin(), full.end()));
    CHECK_MESSAGE(rel <= 1e-4, "fast vs deterministic rel ", rel);
    std::string differ;
    for (const int64_t T : Ts) {
      const std::vector<float> Y = run_gemm(fast, d_X, T, sh.K, d_W, sh.N);
      CHECK(count_nonfinite(Y) == 0);
      if (!same_bits(Y.data(), fast_full.data(), Y.size())) differ.append(1, ' ').append(std::to_string(T));
    }
    MESSAGE("fast mode, N ", sh.N, " K ", sh.K,
            ": rows differ from T=1024 at T =", differ.empty() ? " (none)" : differ);
  }
}

TEST_CASE("cuda kernels: fill_uniform range, statistics and tensor-parallel shards") {
  const int64_t rows = 512, cols = 768;
  const uint64_t seed = 12345, id = 3;
  const float scale = 0.02f;
  const auto fill = [&](int64_t r, int64_t c, int64_t row0, int64_t col0, uint64_t s, uint64_t tensor) {
    DeviceBuffer<bf16> d(size_t(r * c));
    poison(d);
    tc::fill_uniform(d.get(), r, c, cols, row0, col0, s, tensor, scale, kStream);
    return download(d);
  };
  const std::vector<bf16> full = fill(rows, cols, 0, 0, seed, id);
  REQUIRE(count_nonfinite(full) == 0);

  // [-scale, scale) before the rounding to bf16, so within bf16(±scale) after it.
  const float lo = to_f(to_bf(-scale)), hi = to_f(to_bf(scale));
  size_t outside = 0, at_or_above_scale = 0;
  double sum = 0, sum_sq = 0, mn = INFINITY, mx = -INFINITY;
  for (const bf16 b : full) {
    const float v = to_f(b);
    outside += (v < lo || v > hi) ? 1 : 0;
    at_or_above_scale += v >= scale ? 1 : 0;
    sum += v;
    sum_sq += double(v) * double(v);
    mn = std::min(mn, double(v));
    mx = std::max(mx, double(v));
  }
  const double n = double(full.size()), mean = sum / n, var = sum_sq / n - mean * mean;
  const double expected_var = double(scale) * double(scale) / 3.0;
  MESSAGE("fill_uniform: min ", mn, " max ", mx, " mean ", mean, " var ", var, " (uniform: ", expected_var, ")");
  CHECK(outside == 0);
  WARN_MESSAGE(at_or_above_scale == 0, at_or_above_scale,
               " values round to >= scale (bf16 rounding of values near scale)");
  CHECK(mx - mn > 1.5 * double(scale));  // not all equal: spread over the range
  CHECK(std::abs(mean) < 0.01 * double(scale));
  CHECK(std::abs(var / expected_var - 1.0) < 0.05);

  // A shard is the matching slice of the full tensor, bit for bit.
  struct Shard {
    int64_t r, c, row0, col0;
  };
  for (const Shard s : {Shard{200, 300, 100, 400}, Shard{rows, cols / 2, 0, cols / 2},
                        Shard{rows / 4, cols, 3 * rows / 4, 0}, Shard{1, 1, rows - 1, cols - 1}}) {
    CAPTURE(s.r);
    CAPTURE(s.c);
    CAPTURE(s.row0);
    CAPTURE(s.col0);
    const std::vector<bf16> part = fill(s.r, s.c, s.row0, s.col0, seed, id);
    size_t wrong_rows = 0;
    for (int64_t i = 0; i < s.r; ++i)
      wrong_rows += same_bits(&part[size_t(i * s.c)], &full[size_t((s.row0 + i) * cols + s.col0)], size_t(s.c)) ? 0 : 1;
    CHECK(wrong_rows == 0);
  }

  // Another tensor id or seed: other values.
  CHECK_FALSE(same_bits(fill(rows, cols, 0, 0, seed, id + 1).data(), full.data(), full.size()));
  CHECK_FALSE(same_bits(fill(rows, cols, 0, 0, seed + 1, id).data(), full.data(), full.size()));
}

TEST_CASE("cuda kernels against their CPU twins (backend/cpu): rms_norm, gemm_nt, SwiGLU") {
  Rng rng(515);
  const int64_t T = 9, h = 1000, N = 333;
  // RMSNorm: the CPU model's rms_norm on the same fp32 rows and weights.
  const std::vector<float> x = random_floats(rng, size_t(T * h), -2.0, 2.0),
                           w = random_floats(rng, size_t(h), 0.5, 1.5);
  DeviceBuffer<float> d_x = upload(x);
  const DeviceBuffer<float> d_w = upload(w);
  DeviceBuffer<bf16> d_out(size_t(T * h));
  poison(d_out);
  tc::add_rmsnorm(d_x.get(), nullptr, d_w.get(), T, h, 1e-5f, d_out.get(), kStream);
  std::vector<double> cpu_norm(size_t(T * h));
  {
    std::vector<float> row(static_cast<size_t>(h));
    for (int64_t t = 0; t < T; ++t) {
      tandem::cpu::rms_norm(&x[size_t(t * h)], w.data(), h, 1e-5f, row.data());
      std::copy(row.begin(), row.end(), cpu_norm.begin() + t * h);
    }
  }
  const double norm_err = rel_err(download(d_out), cpu_norm);
  CHECK_MESSAGE(norm_err <= 1e-2, "rms_norm vs CPU rel ", norm_err);
  // GEMM: cpu::gemm_nt in fp32 on the same bf16 values.
  const std::vector<bf16> xb = random_bf16(rng, size_t(T * h), -1.0, 1.0),
                          wb = random_bf16(rng, size_t(N * h), -0.1, 0.1);
  std::vector<float> xf(xb.size()), wf(wb.size()), yc(size_t(T * N));
  std::transform(xb.begin(), xb.end(), xf.begin(), to_f);
  std::transform(wb.begin(), wb.end(), wf.begin(), to_f);
  tandem::cpu::gemm_nt(xf.data(), T, h, wf.data(), N, yc.data());
  const DeviceBuffer<bf16> d_xb = upload(xb), d_wb = upload(wb);
  DeviceBuffer<float> d_y(size_t(T * N));
  poison(d_y);
  tc::Gemm gemm(true, 256);
  gemm.run(d_xb.get(), T, h, d_wb.get(), N, d_y.get(), kStream);
  const double gemm_err = rel_err(download(d_y), std::vector<double>(yc.begin(), yc.end()));
  CHECK_MESSAGE(gemm_err <= 1e-4, "gemm vs CPU gemm_nt rel ", gemm_err);  // both fp32 sums, other orders
  // SwiGLU: the CPU model's formula, g / (1 + exp(-g)) * u.
  const int64_t ffn = 341;
  const std::vector<float> gu = random_floats(rng, size_t(T * 2 * ffn), -4.0, 4.0);
  const DeviceBuffer<float> d_gu = upload(gu);
  DeviceBuffer<bf16> d_act(size_t(T * ffn));
  poison(d_act);
  tc::swiglu(d_gu.get(), T, ffn, d_act.get(), kStream);
  std::vector<double> cpu_act(size_t(T * ffn));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> a(static_cast<size_t>(ffn));
    for (int64_t i = 0; i < ffn; ++i) a[size_t(i)] = -gu[size_t(t * 2 * ffn + i)];
    tandem::cpu::exp_inplace(a.data(), ffn);
    for (int64_t i = 0; i < ffn; ++i)
      cpu_act[size_t(t * ffn + i)] =
          gu[size_t(t * 2 * ffn + i)] / (1.0f + a[size_t(i)]) * gu[size_t(t * 2 * ffn + ffn + i)];
  }
  const double act_err = rel_err(download(d_act), cpu_act);
  CHECK_MESSAGE(act_err <= 1e-2, "swiglu vs CPU rel ", act_err);
}

TEST_CASE("cuda gemm: the own tensor-core GEMM (deterministic fallback) is right and batch-invariant") {
  Rng rng(811);
  tc::Gemm own(true, 256, 8192, true);
  const int64_t kRows = 300;
  for (const GemmShape sh : kGemmShapes) {
    CAPTURE(sh.N);
    CAPTURE(sh.K);
    MESSAGE("N ", sh.N, " K ", sh.K, ": ", own.describe(sh.N, sh.K));
    const std::vector<bf16> W = random_bf16(rng, size_t(sh.N * sh.K), -1.0, 1.0);
    const std::vector<bf16> X = random_bf16(rng, size_t(kRows * sh.K), -1.0, 1.0);
    const DeviceBuffer<bf16> d_W = upload(W), d_X = upload(X);
    const std::vector<float> full = run_gemm(own, d_X, kRows, sh.K, d_W, sh.N);
    const std::vector<double> ref = gemm_ref(to_double(X), kRows, sh.K, to_double(W), sh.N);
    const double rel = rel_err(full, ref);
    CHECK_MESSAGE(rel <= 1e-4, "own GEMM vs float64 rel ", rel);
    for (const int64_t T : {int64_t(1), int64_t(7), int64_t(64), int64_t(65), int64_t(129), int64_t(299)}) {
      CAPTURE(T);
      const std::vector<float> Y = run_gemm(own, d_X, T, sh.K, d_W, sh.N);
      CHECK_MESSAGE(same_bits(Y.data(), full.data(), Y.size()), "rows of Y_", T, " differ from Y_300");
    }
  }
}

// The own GEMM's skinny kernel (steps of up to 64 rows, engine.cuda_gemm: own) against its tiled
// kernel: the same bits at every row count it takes, fp32 and bf16 outputs, K with and without
// the zero step (K % 32 == 16), several K chunks; a misaligned X falls back to the tiled kernel.
TEST_CASE("cuda gemm: the own GEMM's skinny kernel gives the tiled kernel's bits") {
  Rng rng(812);
  for (const GemmShape sh : {GemmShape{1024, 1040}, GemmShape{2048, 4096}, GemmShape{64, 16}, GemmShape{96, 48}}) {
    CAPTURE(sh.N);
    CAPTURE(sh.K);
    const int64_t rows = 65;
    const std::vector<bf16> W = random_bf16(rng, size_t(sh.N * sh.K), -1.0, 1.0);
    const std::vector<bf16> X = random_bf16(rng, size_t((rows + 1) * sh.K), -1.0, 1.0);
    const DeviceBuffer<bf16> d_W = upload(W), d_X = upload(X);
    for (const int64_t T : {int64_t(1), int64_t(5), int64_t(16), int64_t(17), int64_t(32), int64_t(33), int64_t(64)}) {
      CAPTURE(T);
      REQUIRE(tc::gemm_invariant_is_skinny(d_X.get(), T, sh.K, d_W.get(), sh.N));
      DeviceBuffer<float> tiled(size_t(T * sh.N)), skinny(size_t(T * sh.N));
      DeviceBuffer<bf16> tiled_b(size_t(T * sh.N)), skinny_b(size_t(T * sh.N));
      for (auto* b : {&tiled, &skinny}) poison(*b);
      for (auto* b : {&tiled_b, &skinny_b}) poison(*b);
      tc::gemm_invariant(d_X.get(), T, sh.K, d_W.get(), sh.N, tiled.get(), kStream, false);
      tc::gemm_invariant(d_X.get(), T, sh.K, d_W.get(), sh.N, skinny.get(), kStream, true);
      tc::gemm_invariant(d_X.get(), T, sh.K, d_W.get(), sh.N, tiled_b.get(), kStream, false);
      tc::gemm_invariant(d_X.get(), T, sh.K, d_W.get(), sh.N, skinny_b.get(), kStream, true);
      const std::vector<float> yt = download(tiled), ys = download(skinny);
      const std::vector<bf16> bt = download(tiled_b), bs = download(skinny_b);
      CHECK(count_nonfinite(ys) == 0);
      CHECK(same_bits(ys.data(), yt.data(), yt.size()));
      CHECK(same_bits(bs.data(), bt.data(), bt.size()));
      if (T == 5) {
        const std::vector<double> ref = gemm_ref(to_double(X), T, sh.K, to_double(W), sh.N);
        const double rel = rel_err(ys, ref);
        CHECK_MESSAGE(rel <= 1e-4, "skinny vs float64 rel ", rel);
      }
    }
    // X one element in (2 bytes): not 32-byte aligned, so the tiled kernel runs.
    CHECK_FALSE(tc::gemm_invariant_is_skinny(d_X.get() + 1, 3, sh.K, d_W.get(), sh.N));
  }
  CHECK_FALSE(tc::gemm_invariant_is_skinny(nullptr, 65, 64, nullptr, 64));  // more than 64 rows
  CHECK_FALSE(tc::gemm_invariant_is_skinny(nullptr, 8, 40, nullptr, 64));   // K not a multiple of 16
}
