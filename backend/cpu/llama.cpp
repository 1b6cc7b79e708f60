#include "backend/cpu/llama.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "backend/cpu/checkpoint.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/host.h"
#include "core/rng.h"

namespace tandem::cpu {

namespace {
std::vector<float> random_tensor(size_t n, uint64_t seed, uint64_t tensor_id, float scale) {
  Rng rng(hash_combine(seed, tensor_id));
  std::vector<float> v(n);
  for (auto& x : v) x = float((rng.uniform() * 2.0 - 1.0) * scale);
  return v;
}
void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }
}  // namespace

void check_fits_in_memory(const ModelSpec& m, double kv_bytes) {
  const double ram = physical_memory_bytes();
  const double weights = m.params() * 4.0;  // the CPU backend computes and stores fp32
  if (weights + kv_bytes > 0.8 * ram)
    throw InputError(
        fmt::format("model '{}' needs {:.1f} GB of fp32 weights and {:.1f} GB of KV cache on the CPU backend; "
                    "this machine has {:.1f} GB (use a smaller model, e.g. tiny or llama-100m, or fewer KV blocks)",
                    m.name, weights / 1e9, kv_bytes / 1e9, ram / 1e9));
}

LlamaWeights dummy_weights(const ModelSpec& m, uint64_t seed) {
  // Uniform with standard deviation 1/sqrt(fan-in) for projections (each layer changes the
  // residual stream by O(1), so greedy outputs vary with the context instead of repeating
  // one token, which makes the golden tests sensitive), 1 for the embedding; norms at 1.
  const float sqrt3 = std::sqrt(3.0f);
  const auto fan = [&](size_t in) { return sqrt3 / std::sqrt(float(in)); };
  const size_t h = size_t(m.hidden), hd = size_t(m.head_dim()), q = size_t(m.heads) * hd, kv = size_t(m.kv_heads) * hd;
  const size_t f = size_t(m.ffn), V = size_t(m.vocab);
  LlamaWeights w;
  uint64_t id = 0;
  w.embed = random_tensor(V * h, seed, id++, sqrt3);
  for (int32_t l = 0; l < m.layers; ++l) {
    LlamaLayer L;
    L.attn_norm.assign(h, 1.0f);
    L.mlp_norm.assign(h, 1.0f);
    L.wqkv = random_tensor((q + 2 * kv) * h, seed, id++, fan(h));
    L.wo = random_tensor(h * q, seed, id++, fan(q));
    L.w_gate_up = random_tensor(2 * f * h, seed, id++, fan(h));
    L.w_down = random_tensor(h * f, seed, id++, fan(f));
    w.layers.push_back(std::move(L));
  }
  w.final_norm.assign(h, 1.0f);
  w.lm_head = m.tie_embeddings ? w.embed : random_tensor(V * h, seed, id++, fan(h));
  return w;
}

std::string weights_fingerprint(const LlamaWeights& w) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const auto tensor = [&](const std::vector<float>& t) {
    const uint64_t n = t.size();
    XXH3_64bits_update(st, &n, sizeof n);
    const size_t stride = std::max<size_t>(1, t.size() / 4096);
    for (size_t i = 0; i < t.size(); i += stride) XXH3_64bits_update(st, &t[i], sizeof(float));
  };
  tensor(w.embed);
  for (const LlamaLayer& L : w.layers)
    for (const auto* t : {&L.attn_norm, &L.wqkv, &L.wo, &L.mlp_norm, &L.w_gate_up, &L.w_down}) tensor(*t);
  tensor(w.final_norm);
  tensor(w.lm_head);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fmt::format("fp32 values #{:016x}", h);
}

LlamaWeights load_checkpoint(const std::string& folder, ModelSpec& m) {
  Checkpoint ck(folder);
  apply_hf_config(ck.config(), m);
  if (!m.tie_embeddings && !ck.has("lm_head.weight"))
    throw InputError(
        fmt::format("{}: tensor 'lm_head.weight' not found and config.json says tie_word_embeddings is false", folder));
  if (m.hidden % m.heads != 0 || m.heads % m.kv_heads != 0)
    throw InputError(fmt::format("{}/config.json: hidden_size {} / heads {} / kv heads {} do not divide", folder,
                                 m.hidden, m.heads, m.kv_heads));
  const int64_t h = m.hidden, hd = m.head_dim(), q = int64_t(m.heads) * hd, kv = int64_t(m.kv_heads) * hd, f = m.ffn,
                V = m.vocab;
  LlamaWeights w;
  w.embed = ck.read("model.embed_tokens.weight", {V, h}).data;
  for (int32_t l = 0; l < m.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LlamaLayer L;
    L.attn_norm = ck.read(p + "input_layernorm.weight", {h}).data;
    L.mlp_norm = ck.read(p + "post_attention_layernorm.weight", {h}).data;
    L.wqkv = ck.read(p + "self_attn.q_proj.weight", {q, h}).data;
    append(L.wqkv, ck.read(p + "self_attn.k_proj.weight", {kv, h}).data);
    append(L.wqkv, ck.read(p + "self_attn.v_proj.weight", {kv, h}).data);
    L.wo = ck.read(p + "self_attn.o_proj.weight", {h, q}).data;
    L.w_gate_up = ck.read(p + "mlp.gate_proj.weight", {f, h}).data;
    append(L.w_gate_up, ck.read(p + "mlp.up_proj.weight", {f, h}).data);
    L.w_down = ck.read(p + "mlp.down_proj.weight", {h, f}).data;
    w.layers.push_back(std::move(L));
  }
  w.final_norm = ck.read("model.norm.weight", {h}).data;
  w.lm_head = m.tie_embeddings ? w.embed : ck.read("lm_head.weight", {V, h}).data;
  return w;
}

PagedKvStore::PagedKvStore(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      token_stride_(size_t(kv_heads) * size_t(head_dim)),
      k_(size_t(layers) * size_t(num_blocks) * size_t(block_size) * token_stride_),
      v_(k_.size()) {}

int64_t rope_positions(const ModelSpec& m, int32_t num_blocks, int32_t block_size) {
  return std::min<int64_t>(m.max_model_len, int64_t(num_blocks) * block_size);
}

void rope_tables(const ModelSpec& m, std::vector<float>& cos_table, std::vector<float>& sin_table, int64_t positions) {
  // As Hugging Face builds them: inv_freq and angles in float32.
  const int32_t half = m.head_dim() / 2;
  positions = std::clamp<int64_t>(positions, 0, m.max_model_len);
  cos_table.resize(size_t(positions) * size_t(half));
  sin_table.resize(cos_table.size());
  for (int32_t i = 0; i < half; ++i) {
    const float inv_freq = 1.0f / std::pow(float(m.rope_theta), float(2 * i) / float(m.head_dim()));
    for (int64_t p = 0; p < positions; ++p) {
      const float angle = float(p) * inv_freq;
      cos_table[size_t(p) * size_t(half) + size_t(i)] = std::cos(angle);
      sin_table[size_t(p) * size_t(half) + size_t(i)] = std::sin(angle);
    }
  }
}

namespace {
std::vector<float> rows_of(const std::vector<float>& w, int64_t cols, int64_t r0, int64_t n) {
  return {w.begin() + r0 * cols, w.begin() + (r0 + n) * cols};
}
std::vector<float> cols_of(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  std::vector<float> out(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&w[size_t(r * cols + c0)], n, &out[size_t(r * n)]);
  return out;
}
}  // namespace

LlamaModel::LlamaModel(const ModelSpec& m, LlamaWeights w, int32_t num_blocks, int32_t block_size, int32_t tp)
    : m_(m), weights_id_(weights_fingerprint(w)), w_(std::move(w)), comm_(tp) {
  if (const std::string problem = m.tp_split_problem(tp); !problem.empty())
    throw std::invalid_argument(fmt::format("tensor parallelism: {}", problem));
  const int64_t h = m.hidden, hd = m.head_dim(), H = m.heads, KV = m.kv_heads, F = m.ffn;
  const int64_t Hs = H / tp, KVs = KV / tp, Fs = F / tp;
  // A rank's share of the row-split reductions' segments: the subtree it computes. A TP degree
  // that does not divide them (not TP-invariant) sums its own slice at once.
  const int32_t segments = m.tp_invariant(tp) ? m.reduction_segments() / tp : 1;
  for (int32_t r = 0; r < tp; ++r) {
    Shard sh{.heads = int32_t(Hs),
             .kv_heads = int32_t(KVs),
             .ffn = int32_t(Fs),
             .segments = segments,
             .kv = PagedKvStore(m.layers, int32_t(KVs), int32_t(hd), num_blocks, block_size)};
    for (LlamaLayer& L : w_.layers) {
      LlamaLayer S;
      if (tp == 1) {  // the whole model is the one shard: move, don't copy
        S.wqkv = std::move(L.wqkv);
        S.wo = std::move(L.wo);
        S.w_gate_up = std::move(L.w_gate_up);
        S.w_down = std::move(L.w_down);
      } else {
        S.wqkv = rows_of(L.wqkv, h, r * Hs * hd, Hs * hd);  // this rank's q heads, then k and v heads
        const auto k = rows_of(L.wqkv, h, H * hd + r * KVs * hd, KVs * hd);
        const auto v = rows_of(L.wqkv, h, (H + KV) * hd + r * KVs * hd, KVs * hd);
        S.wqkv.insert(S.wqkv.end(), k.begin(), k.end());
        S.wqkv.insert(S.wqkv.end(), v.begin(), v.end());
        S.wo = cols_of(L.wo, h, H * hd, r * Hs * hd, Hs * hd);
        S.w_gate_up = rows_of(L.w_gate_up, h, r * Fs, Fs);
        const auto up = rows_of(L.w_gate_up, h, F + r * Fs, Fs);
        S.w_gate_up.insert(S.w_gate_up.end(), up.begin(), up.end());
        S.w_down = cols_of(L.w_down, h, F, r * Fs, Fs);
      }
      sh.layers.push_back(std::move(S));
    }
    shards_.push_back(std::move(sh));
  }
  for (LlamaLayer& L : w_.layers) L.wqkv = L.wo = L.w_gate_up = L.w_down = {};  // now in the shards
  rope_tables(m, rope_cos_, rope_sin_, rope_positions(m, num_blocks, block_size));
}

void LlamaModel::gemm(const float* x, int64_t t, int64_t k, const std::vector<float>& w, int64_t n, float* y,
                      int32_t segments) const {
  if (gemm_path_ == GemmPath::Invariant)
    gemm_nt_segmented(x, t, k, w.data(), n, y, segments);
  else
    gemm_nt_eigen(x, t, k, w.data(), n, y);
}

// One rank after another would waste the cores: with tp > 1 every rank gets a thread, and
// the kernels inside run on it alone (nested OpenMP regions are serial). With tp == 1 the
// kernels use every thread.
template <class F>
void LlamaModel::each_rank(F&& f) {
  if (shards_.size() == 1) {
    f(shards_[0]);
    return;
  }
#pragma omp parallel for schedule(static, 1) num_threads(int(shards_.size()))
  for (size_t r = 0; r < shards_.size(); ++r) f(shards_[r]);
}

// x += all-reduce(partials): the communicator sums the ranks' subtrees as the top of the tree.
void LlamaModel::add_reduced_partials(int64_t n) {
  if (shards_.size() > 1) {
    std::vector<float*> bufs;
    for (Shard& sh : shards_) bufs.push_back(sh.partial.data());
    comm_.all_reduce_sum(bufs, size_t(n));
  }
  const float* p = shards_[0].partial.data();
  for (int64_t i = 0; i < n; ++i) x_[size_t(i)] += p[i];
}

void LlamaModel::attention(Shard& sh, int32_t layer, const StepPlan& plan, const float* qkv, float* out) {
  PagedKvStore& kv_ = sh.kv;
  const int32_t H = sh.heads, KV = sh.kv_heads, hd = m_.head_dim(), bs = kv_.block_size(), group = H / KV;
  const int64_t qkv_stride = int64_t(H + 2 * KV) * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  // Work items: (sequence, KV head). Each is two products over that sequence's context,
  // S = Q K^T and O = P V, with gemm_nt's fixed per-element order; masked keys contribute
  // exact zeros. So a score, a softmax and an output element depend only on the query's own
  // absolute position and the keys 0..pos, whatever else is in the step or how it was chunked.
  std::vector<int64_t> first_token(plan.seqs.size());
  for (size_t s = 0, t = 0; s < plan.seqs.size(); t += size_t(plan.seqs[s].num_tokens), ++s)
    first_token[s] = int64_t(t);
  const int64_t items = int64_t(plan.seqs.size()) * KV;
  // Inside a tensor-parallel rank the region is nested and runs on that rank's thread alone.
  const int nt = threads();
  if (int(sh.scratch.size()) < nt) sh.scratch.resize(size_t(nt));
#pragma omp parallel num_threads(nt) if (items > 1)
  {
#ifdef _OPENMP
    AttnScratch& sc = sh.scratch[size_t(omp_get_thread_num())];
#else
    AttnScratch& sc = sh.scratch[0];
#endif
    auto &Q = sc.Q, &K = sc.K, &Vt = sc.Vt, &S = sc.S, &O = sc.O;
    auto &krow = sc.krow, &vrow = sc.vrow;
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < items; ++item) {
      const size_t si = size_t(item / KV);
      const int32_t g = int32_t(item % KV);
      const ScheduledSeq& seq = plan.seqs[si];
      const int32_t n = seq.num_tokens, c0 = seq.num_computed_before, ctx = c0 + n;
      const int64_t rows = int64_t(n) * group;
      if (n == 1) {  // decode: read K and V in place; same arithmetic as the products below
        krow.resize(size_t(ctx));
        vrow.resize(size_t(ctx));
        for (int32_t j = 0; j < ctx; ++j) {
          const int32_t block = seq.block_table[size_t(j / bs)], slot = j % bs;
          krow[size_t(j)] = kv_.k(layer, block, slot) + int64_t(g) * hd;
          vrow[size_t(j)] = kv_.v(layer, block, slot) + int64_t(g) * hd;
        }
        S.resize(size_t(ctx));
        for (int32_t hh = 0; hh < group; ++hh) {
          const int64_t head = int64_t(g) * group + hh;
          const float* q = qkv + first_token[si] * qkv_stride + head * hd;
          float mx = -INFINITY;
          for (int32_t j = 0; j < ctx; ++j) mx = std::max(mx, S[size_t(j)] = dot(q, krow[size_t(j)], hd) * scale);
          for (int32_t j = 0; j < ctx; ++j) S[size_t(j)] -= mx;
          exp_inplace(S.data(), ctx);
          const float inv = 1.0f / lane_sum(S.data(), ctx);
          for (int32_t j = 0; j < ctx; ++j) S[size_t(j)] *= inv;
          weighted_rows_sum(S.data(), ctx, vrow.data(), hd, out + first_token[si] * int64_t(H) * hd + head * hd);
        }
        continue;
      }
      Q.resize(size_t(rows * hd));
      K.resize(size_t(int64_t(ctx) * hd));
      Vt.resize(size_t(int64_t(hd) * ctx));
      S.resize(size_t(rows * ctx));
      O.resize(size_t(rows * hd));
      for (int32_t i = 0; i < n; ++i)
        for (int32_t hh = 0; hh < group; ++hh)
          std::copy_n(qkv + (first_token[si] + i) * qkv_stride + int64_t(g * group + hh) * hd, hd,
                      &Q[size_t((int64_t(i) * group + hh) * hd)]);
      for (int32_t j = 0; j < ctx; ++j) {
        const int32_t block = seq.block_table[size_t(j / bs)], slot = j % bs;
        std::copy_n(kv_.k(layer, block, slot) + int64_t(g) * hd, hd, &K[size_t(int64_t(j) * hd)]);
        const float* v = kv_.v(layer, block, slot) + int64_t(g) * hd;
        for (int32_t d = 0; d < hd; ++d) Vt[size_t(int64_t(d) * ctx + j)] = v[d];
      }
      // Query blocks of 64 tokens see keys 0..c0+end of block only: the masked upper triangle
      // is mostly skipped, and what remains of it contributes exact zeros.
      for (int32_t i0 = 0; i0 < n; i0 += 64) {
        const int32_t i1 = std::min(n, i0 + 64), keys = c0 + i1;
        const int64_t r0 = int64_t(i0) * group, nr = int64_t(i1 - i0) * group;
        float* Sb = &S[size_t(r0 * ctx)];
        gemm_nt_serial(&Q[size_t(r0 * hd)], hd, nr, hd, K.data(), hd, keys, Sb, ctx);
        for (int64_t r = 0; r < nr; ++r) {
          float* row = Sb + r * ctx;
          const int32_t visible = c0 + i0 + int32_t(r / group) + 1;  // causal: keys 0..pos
          float mx = -INFINITY;
          for (int32_t j = 0; j < visible; ++j) mx = std::max(mx, row[j] *= scale);
          for (int32_t j = 0; j < visible; ++j) row[j] -= mx;
          exp_inplace(row, visible);
          const float inv = 1.0f / lane_sum(row, visible);
          for (int32_t j = 0; j < visible; ++j) row[j] *= inv;
          std::fill(row + visible, row + keys, 0.0f);
        }
        gemm_nt_serial(Sb, ctx, nr, keys, Vt.data(), ctx, hd, &O[size_t(r0 * hd)], hd);
      }
      for (int32_t i = 0; i < n; ++i)
        for (int32_t hh = 0; hh < group; ++hh)
          std::copy_n(&O[size_t((int64_t(i) * group + hh) * hd)], hd,
                      out + (first_token[si] + i) * int64_t(H) * hd + int64_t(g * group + hh) * hd);
    }
  }
}

void LlamaModel::attention_block(Shard& sh, int32_t l, const StepPlan& plan, int64_t T) {
  const int64_t h = m_.hidden, H = sh.heads, KV = sh.kv_heads, hd = m_.head_dim(), half = hd / 2;
  const int64_t qkv_n = (H + 2 * KV) * hd;
  const LlamaLayer& L = sh.layers[size_t(l)];
  const int32_t bs = sh.kv.block_size();
  sh.qkv.resize(size_t(T * qkv_n));
  sh.attn.resize(size_t(T * H * hd));
  sh.partial.resize(size_t(T * h));
  gemm(xn_.data(), T, h, L.wqkv, qkv_n, sh.qkv.data());
  // RoPE (rotate-half convention, as Hugging Face Llama) on q and k; then store k, v.
  for (int64_t t = 0; t < T; ++t) {
    const int32_t pos = pos_of_[size_t(t)];
    const float* c = &rope_cos_[size_t(pos) * size_t(half)];
    const float* s = &rope_sin_[size_t(pos) * size_t(half)];
    float* row = &sh.qkv[size_t(t * qkv_n)];
    for (int64_t head = 0; head < H + KV; ++head) {
      float* v = row + head * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
    const auto& table = plan.seqs[size_t(seq_of_[size_t(t)])].block_table;
    const int32_t block = table[size_t(pos / bs)], slot = pos % bs;
    std::copy_n(row + H * hd, KV * hd, sh.kv.k(l, block, slot));
    std::copy_n(row + (H + KV) * hd, KV * hd, sh.kv.v(l, block, slot));
  }
  attention(sh, l, plan, sh.qkv.data(), sh.attn.data());
  gemm(sh.attn.data(), T, H * hd, L.wo, h, sh.partial.data(), sh.segments);
}

void LlamaModel::mlp_block(Shard& sh, int32_t l, int64_t T) {
  const int64_t h = m_.hidden, f = sh.ffn;
  const LlamaLayer& L = sh.layers[size_t(l)];
  sh.gu.resize(size_t(T * 2 * f));
  sh.act.resize(size_t(T * f));
  sh.partial.resize(size_t(T * h));
  gemm(xn_.data(), T, h, L.w_gate_up, 2 * f, sh.gu.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* g = &sh.gu[size_t(t * 2 * f)];
    const float* u = g + f;
    float* a = &sh.act[size_t(t * f)];
    for (int64_t i = 0; i < f; ++i) a[i] = -g[i];
    exp_inplace(a, f);  // SiLU(g) = g / (1 + exp(-g))
    for (int64_t i = 0; i < f; ++i) a[i] = g[i] / (1.0f + a[i]) * u[i];
  }
  gemm(sh.act.data(), T, f, L.w_down, h, sh.partial.data(), sh.segments);
}

void LlamaModel::forward(const StepPlan& plan, std::span<const Token> tokens, std::vector<Token>& sampled,
                         std::vector<float>* logits) {
  const int64_t T = plan.num_tokens, h = m_.hidden, V = m_.vocab;
  if (int64_t(tokens.size()) != T) throw std::logic_error("LlamaModel::forward: token count differs from the plan");
  x_.resize(size_t(T * h));
  xn_.resize(x_.size());
  pos_of_.resize(size_t(T));
  seq_of_.resize(size_t(T));
  {
    int64_t t = 0;
    for (size_t s = 0; s < plan.seqs.size(); ++s)
      for (int32_t i = 0; i < plan.seqs[s].num_tokens; ++i, ++t) {
        pos_of_[size_t(t)] = plan.seqs[s].num_computed_before + i;
        seq_of_[size_t(t)] = int32_t(s);
        if (pos_of_[size_t(t)] >= m_.max_model_len) throw std::logic_error("LlamaModel: position past max_model_len");
        if (size_t(pos_of_[size_t(t)]) * size_t(m_.head_dim() / 2) >= rope_cos_.size())
          throw std::logic_error("LlamaModel: position past the KV cache's capacity");
      }
  }
  for (int64_t t = 0; t < T; ++t) {
    const Token id = tokens[size_t(t)];
    if (id < 0 || id >= V) throw std::runtime_error(fmt::format("token id {} outside the vocabulary ({})", id, V));
    std::copy_n(&w_.embed[size_t(id * h)], h, &x_[size_t(t * h)]);
  }
  const float eps = float(m_.rms_norm_eps);
  for (int32_t l = 0; l < m_.layers; ++l) {
    const LlamaLayer& L = w_.layers[size_t(l)];
    for (int64_t t = 0; t < T; ++t) rms_norm(&x_[size_t(t * h)], L.attn_norm.data(), h, eps, &xn_[size_t(t * h)]);
    each_rank([&](Shard& sh) { attention_block(sh, l, plan, T); });
    add_reduced_partials(T * h);
    for (int64_t t = 0; t < T; ++t) rms_norm(&x_[size_t(t * h)], L.mlp_norm.data(), h, eps, &xn_[size_t(t * h)]);
    each_rank([&](Shard& sh) { mlp_block(sh, l, T); });
    add_reduced_partials(T * h);
  }
  // LM head (replicated) on the last token of each sampling sequence only.
  last_.clear();
  int64_t t_end = 0, num_samples = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    t_end += s.num_tokens;
    if (!s.samples) continue;
    last_.resize(size_t((num_samples + 1) * h));
    rms_norm(&x_[size_t((t_end - 1) * h)], w_.final_norm.data(), h, eps, &last_[size_t(num_samples * h)]);
    ++num_samples;
  }
  if (num_samples == 0) return;
  logits_.resize(size_t(num_samples * V));
  gemm(last_.data(), num_samples, h, w_.lm_head, V, logits_.data());
  for (int64_t r = 0; r < num_samples; ++r) {
    const float* row = &logits_[size_t(r * V)];
    sampled.push_back(Token(std::max_element(row, row + V) - row));  // first maximum on ties
  }
  if (logits) logits->assign(logits_.begin(), logits_.end());
}

KvLayout LlamaModel::kv_layout() const {
  return llama_kv_layout(m_, weights_id_, "fp32", shards_[0].kv.block_size(), tp());
}

int64_t LlamaModel::kv_block_bytes() const {
  int64_t floats = 0;
  for (const Shard& sh : shards_) floats += 2 * int64_t(m_.layers) * int64_t(sh.kv.block_floats());
  return floats * int64_t(sizeof(float));
}

// One walk for both directions, so that read and write can never disagree on the layout.
template <class Copy>
static void for_each_kv_run(std::span<const int32_t> blocks, int32_t layers, auto& shards, Copy&& copy) {
  size_t at = 0;  // bytes
  for (int32_t b : blocks)
    for (auto& sh : shards)
      for (int32_t l = 0; l < layers; ++l) {
        const size_t n = sh.kv.block_floats() * sizeof(float);
        copy(sh.kv.k(l, b, 0), at, n);
        copy(sh.kv.v(l, b, 0), at + n, n);
        at += 2 * n;
      }
}

void LlamaModel::read_kv_blocks(std::span<const int32_t> blocks, std::span<std::byte> out) {
  if (int64_t(out.size()) != int64_t(blocks.size()) * kv_block_bytes())
    throw std::invalid_argument("read_kv_blocks: buffer size is not blocks * block bytes");
  for (int32_t b : blocks)
    if (b < 0 || b >= kv_num_blocks())
      throw std::invalid_argument(fmt::format("read_kv_blocks: block {} out of range", b));
  for_each_kv_run(blocks, m_.layers, shards_,
                  [&](float* kv, size_t at, size_t n) { std::memcpy(out.data() + at, kv, n); });
}

void LlamaModel::write_kv_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in) {
  if (int64_t(in.size()) != int64_t(blocks.size()) * kv_block_bytes())
    throw std::invalid_argument("write_kv_blocks: buffer size is not blocks * block bytes");
  for (int32_t b : blocks)
    if (b < 0 || b >= kv_num_blocks())
      throw std::invalid_argument(fmt::format("write_kv_blocks: block {} out of range", b));
  for_each_kv_run(blocks, m_.layers, shards_,
                  [&](float* kv, size_t at, size_t n) { std::memcpy(kv, in.data() + at, n); });
}

}  // namespace tandem::cpu
