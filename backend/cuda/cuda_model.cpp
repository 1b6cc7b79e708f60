#include "backend/cuda/cuda_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_blocks.h"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda/step_meta.h"
#include "core/error.h"

namespace tandem::cuda {

namespace {

int32_t next_pow2(int32_t n) {
  int32_t b = 1;
  while (b < n) b *= 2;
  return b;
}

// Pinned host memory: the step's metadata and results cross with async copies.
template <class T>
class HostBuffer {
 public:
  HostBuffer() = default;
  ~HostBuffer() {
    if (p_) (void)cudaFreeHost(p_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void resize(size_t n) {
    if (n <= n_) return;
    if (p_) TANDEM_CUDA_CHECK(cudaFreeHost(p_));
    p_ = nullptr;
    TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct Layer {
  DeviceBuffer<float> attn_norm, mlp_norm;
  DeviceBuffer<bf16> wqkv, wo, w_gate_up, w_down;
};

// One GPU: its shard of the weights (heads and ffn slice), of the KV cache (its KV heads),
// its activations and its stream.
struct Rank {
  int device = 0;
  cudaStream_t stream = nullptr;
  int32_t heads = 0, kv_heads = 0, ffn = 0;
  std::unique_ptr<Gemm> gemm;
  DeviceBuffer<bf16> embed, lm_head;
  DeviceBuffer<float> final_norm, rope_cos, rope_sin;
  std::vector<Layer> layers;
  DeviceBuffer<bf16> k_cache, v_cache;  // [layer][block * bs + slot][kv_heads][head_dim]
  DeviceBuffer<float> x, qkv, gu, partial, logits;
  DeviceBuffer<bf16> xn, attn, act, last;
  DeviceBuffer<int32_t> meta, sampled;
  DeviceBuffer<float> split_partials;  // split-KV attention's workspace (cuda_attention: split, mma_split)
};

struct Graph {
  cudaGraphExec_t exec = nullptr;
};

}  // namespace

struct CudaModel::Impl {
  ModelSpec m;
  CudaModelOptions opt;
  uint64_t seed = 0;
  int32_t num_blocks = 0, block_size = 0, table_width = 0, tile_tokens = 1;
  int64_t cap_tokens = 0, cap_seqs = 0;
  StepMetaLayout meta;
  std::vector<Rank> ranks;
  std::unique_ptr<NcclCommunicator> comm;
  HostBuffer<int32_t> host_meta, host_sampled;
  HostBuffer<float> host_logits;
  std::map<int32_t, Graph> graphs;  // decode batch-size bucket -> captured step
  // By rank, made by the first block read or write: a stream of their own, so that a transfer
  // does not wait behind a step another thread runs (the KV it moves was written by steps that
  // have returned, and the blocks it writes are read by no step until it has).
  struct KvIo {
    std::unique_ptr<KvStaging> staging;
    std::unique_ptr<DeviceStream> stream;
  };
  std::vector<KvIo> kv_io;
  CudaModelStats stats;
  int64_t n_tiles = 0, num_samples = 0;
  int64_t split_workspace_floats = 0;  // per rank; 0 unless attention is Split or MmaSplit

  ~Impl() {
    for (auto& [bucket, g] : graphs) (void)cudaGraphExecDestroy(g.exec);
    kv_io.clear();
    comm.reset();
    for (Rank& r : ranks) {
      (void)cudaSetDevice(r.device);
      if (r.stream) (void)cudaStreamDestroy(r.stream);
    }
  }

  void use(const Rank& r) const {
    if (ranks.size() > 1) TANDEM_CUDA_CHECK(cudaSetDevice(r.device));
  }

  KvPoolView kv_pool(const Rank& r) const {
    return {.device = r.device,
            .k = reinterpret_cast<std::byte*>(r.k_cache.get()),
            .v = reinterpret_cast<std::byte*>(r.v_cache.get()),
            .layers = m.layers,
            .num_blocks = num_blocks,
            .layer_block_bytes = int64_t(block_size) * r.kv_heads * m.head_dim() * int64_t(sizeof(bf16))};
  }
  // Block reads and writes, chunk by chunk on each rank's device: `chunk` gets the rank's pool,
  // its staging and stream, the chunk's first index and length, and where the rank's share
  // starts inside a block (bytes); it enqueues the copies, and each rank ends with a wait.
  template <class Chunk>
  void for_each_kv_chunk(size_t num_blocks_moved, Chunk&& chunk);

  void load_weights(const cpu::LlamaWeights* host);
  void load_slice(Rank& r, bf16* dst, const std::vector<float>* host, uint64_t id, float scale, int64_t rows,
                  int64_t cols, int64_t full_cols, int64_t row0, int64_t col0) const;
  void allocate_activations(int64_t tokens, int64_t seqs);
  void fill_meta(const StepPlan& plan, std::span<const Token> tokens, int32_t pad_to);
  void upload_meta(int64_t T, int64_t S);
  void launch_step(int64_t T);
  void all_reduce_partials(int64_t n);
  void run_graph(int32_t bucket);
};

void CudaModel::Impl::load_slice(Rank& r, bf16* dst, const std::vector<float>* host, uint64_t id, float scale,
                                 int64_t rows, int64_t cols, int64_t full_cols, int64_t row0, int64_t col0) const {
  if (!host) {
    fill_uniform(dst, rows, cols, full_cols, row0, col0, seed, id, scale, r.stream);
    return;
  }
  std::vector<bf16> slice(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      slice[size_t(i * cols + j)] = __float2bfloat16((*host)[size_t((row0 + i) * full_cols + col0 + j)]);
  TANDEM_CUDA_CHECK(cudaMemcpy(dst, slice.data(), slice.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

void CudaModel::Impl::load_weights(const cpu::LlamaWeights* w) {
  const int64_t h = m.hidden, hd = m.head_dim(), H = m.heads, KV = m.kv_heads, F = m.ffn, V = m.vocab;
  const int64_t tp = int64_t(ranks.size());
  // Dummy weights: the CPU backend's scales (uniform, standard deviation 1/sqrt(fan-in); 1 for
  // the embedding), so activations stay O(1) and greedy outputs depend on the context.
  const float sqrt3 = std::sqrt(3.0f);
  const auto fan = [&](int64_t in) { return sqrt3 / std::sqrt(float(in)); };
  const std::vector<float> ones(size_t(h), 1.0f);
  const auto upload_norm = [&](DeviceBuffer<float>& dst, const std::vector<float>* src) {
    dst.resize(size_t(h));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(dst.get(), (src ? *src : ones).data(), size_t(h) * sizeof(float), cudaMemcpyHostToDevice));
  };
  std::vector<float> cos_table, sin_table;
  cpu::rope_tables(m, cos_table, sin_table, cpu::rope_positions(m, num_blocks, block_size));
  for (int64_t ri = 0; ri < tp; ++ri) {
    Rank& r = ranks[size_t(ri)];
    use(r);
    const int64_t Hs = r.heads, KVs = r.kv_heads, Fs = r.ffn;
    r.embed.resize(size_t(V * h));
    load_slice(r, r.embed.get(), w ? &w->embed : nullptr, 0, sqrt3, V, h, h, 0, 0);
    r.layers.resize(size_t(m.layers));
    for (int64_t l = 0; l < m.layers; ++l) {
      Layer& L = r.layers[size_t(l)];
      const cpu::LlamaLayer* src = w ? &w->layers[size_t(l)] : nullptr;
      const uint64_t id = 1 + 4 * uint64_t(l);
      upload_norm(L.attn_norm, src ? &src->attn_norm : nullptr);
      upload_norm(L.mlp_norm, src ? &src->mlp_norm : nullptr);
      // Megatron split, as the CPU model: q/k/v and gate/up by rows (heads, ffn slice), o and down by columns.
      L.wqkv.resize(size_t((Hs + 2 * KVs) * hd * h));
      const std::vector<float>* wqkv = src ? &src->wqkv : nullptr;
      load_slice(r, L.wqkv.get(), wqkv, id, fan(h), Hs * hd, h, h, ri * Hs * hd, 0);
      load_slice(r, L.wqkv.get() + Hs * hd * h, wqkv, id, fan(h), KVs * hd, h, h, H * hd + ri * KVs * hd, 0);
      load_slice(r, L.wqkv.get() + (Hs + KVs) * hd * h, wqkv, id, fan(h), KVs * hd, h, h, (H + KV) * hd + ri * KVs * hd,
                 0);
      L.wo.resize(size_t(h * Hs * hd));
      load_slice(r, L.wo.get(), src ? &src->wo : nullptr, id + 1, fan(H * hd), h, Hs * hd, H * hd, 0, ri * Hs * hd);
      L.w_gate_up.resize(size_t(2 * Fs * h));
      const std::vector<float>* gu = src ? &src->w_gate_up : nullptr;
      load_slice(r, L.w_gate_up.get(), gu, id + 2, fan(h), Fs, h, h, ri * Fs, 0);
      load_slice(r, L.w_gate_up.get() + Fs * h, gu, id + 2, fan(h), Fs, h, h, F + ri * Fs, 0);
      L.w_down.resize(size_t(h * Fs));
      load_slice(r, L.w_down.get(), src ? &src->w_down : nullptr, id + 3, fan(F), h, Fs, F, 0, ri * Fs);
    }
    if (ri == 0) {  // the LM head runs on rank 0 only
      upload_norm(r.final_norm, w ? &w->final_norm : nullptr);
      r.lm_head.resize(size_t(V * h));
      if (w)
        load_slice(r, r.lm_head.get(), &w->lm_head, 0, 0, V, h, h, 0, 0);
      else if (m.tie_embeddings)
        TANDEM_CUDA_CHECK(cudaMemcpyAsync(r.lm_head.get(), r.embed.get(), size_t(V * h) * sizeof(bf16),
                                          cudaMemcpyDeviceToDevice, r.stream));  // after embed's fill, same stream
      else
        load_slice(r, r.lm_head.get(), nullptr, 1 + 4 * uint64_t(m.layers), fan(h), V, h, h, 0, 0);
    }
    r.rope_cos.resize(cos_table.size());
    r.rope_sin.resize(sin_table.size());
    TANDEM_CUDA_CHECK(cudaMemcpy(r.rope_cos.get(), cos_table.data(), cos_table.size() * 4, cudaMemcpyHostToDevice));
    TANDEM_CUDA_CHECK(cudaMemcpy(r.rope_sin.get(), sin_table.data(), sin_table.size() * 4, cudaMemcpyHostToDevice));
    // The plain copies ran on the legacy stream, the fills on r.stream (non-blocking, not
    // ordered after it): wait for both before any step reads a weight.
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void CudaModel::Impl::allocate_activations(int64_t tokens, int64_t seqs) {
  for (auto& [bucket, g] : graphs) (void)cudaGraphExecDestroy(g.exec);  // they hold the old pointers
  graphs.clear();
  cap_tokens = tokens;
  cap_seqs = seqs;
  meta = StepMetaLayout(tokens, seqs, table_width);
  const int64_t h = m.hidden, hd = m.head_dim();
  for (Rank& r : ranks) {
    use(r);
    r.x.resize(size_t(tokens * h));
    r.xn.resize(size_t(tokens * h));
    r.partial.resize(size_t(tokens * h));
    r.qkv.resize(size_t(tokens * (r.heads + 2 * r.kv_heads) * hd));
    r.attn.resize(size_t(tokens * r.heads * hd));
    // Graph replays leave padding rows' attention unwritten; zeros keep them finite.
    TANDEM_CUDA_CHECK(cudaMemset(r.attn.get(), 0, r.attn.size() * sizeof(bf16)));
    r.gu.resize(size_t(tokens * 2 * r.ffn));
    r.act.resize(size_t(tokens * r.ffn));
    r.meta.resize(meta.total);
    if (&r == &ranks[0]) {
      r.last.resize(size_t(seqs * h));
      r.logits.resize(size_t(seqs * m.vocab));
      r.sampled.resize(size_t(seqs));
    }
  }
  host_meta.resize(meta.total);
  host_sampled.resize(size_t(seqs));
}

void CudaModel::Impl::fill_meta(const StepPlan& plan, std::span<const Token> tokens, int32_t pad_to) {
  const StepMetaShape shape{block_size, table_width, tile_tokens, num_blocks, m.vocab, m.max_model_len};
  const StepMetaCounts c = build_step_meta(plan, tokens, shape, meta, pad_to, host_meta.get());
  n_tiles = c.n_tiles;
  num_samples = c.num_samples;
}

void CudaModel::Impl::upload_meta(int64_t T, int64_t S) {
  const auto part = [&](Rank& r, size_t off, size_t n) {
    if (n)
      TANDEM_CUDA_CHECK(
          cudaMemcpyAsync(r.meta.get() + off, host_meta.get() + off, n * 4, cudaMemcpyHostToDevice, r.stream));
  };
  for (Rank& r : ranks) {
    use(r);
    part(r, meta.tokens, size_t(T));
    part(r, meta.positions, size_t(T));
    part(r, meta.slots, size_t(T));
    part(r, meta.tiles, size_t(4 * n_tiles));
    part(r, meta.tables, size_t(S * table_width));
    part(r, meta.samples, size_t(num_samples));
  }
}

void CudaModel::Impl::all_reduce_partials(int64_t n) {
  if (!comm) return;  // one rank: its partial is the sum
  std::vector<float*> bufs;
  std::vector<cudaStream_t> streams;
  for (Rank& r : ranks) {
    bufs.push_back(r.partial.get());
    streams.push_back(r.stream);
  }
  comm->all_reduce_sum_async(bufs, size_t(n), streams);
}

// Enqueues a whole step (no synchronisation: it can be captured in a graph).
void CudaModel::Impl::launch_step(int64_t T) {
  const int64_t h = m.hidden, hd = m.head_dim();
  const float eps = float(m.rms_norm_eps);
  for (Rank& r : ranks) {
    use(r);
    embed_gather(r.meta.get() + meta.tokens, r.embed.get(), T, h, r.x.get(), r.stream);
  }
  for (int32_t l = 0; l < m.layers; ++l) {
    for (Rank& r : ranks) {
      use(r);
      const Layer& L = r.layers[size_t(l)];
      const int64_t qkv_n = (r.heads + 2 * r.kv_heads) * hd;
      const size_t layer_off = size_t(l) * size_t(num_blocks) * size_t(block_size) * size_t(r.kv_heads) * size_t(hd);
      // The previous layer's MLP output joins the residual stream inside the norm.
      add_rmsnorm(r.x.get(), l == 0 ? nullptr : r.partial.get(), L.attn_norm.get(), T, h, eps, r.xn.get(), r.stream,
                  opt.row_kernels);
      r.gemm->run(r.xn.get(), T, h, L.wqkv.get(), qkv_n, r.qkv.get(), r.stream);
      rope_store_kv(r.qkv.get(), r.meta.get() + meta.positions, r.meta.get() + meta.slots, r.rope_cos.get(),
                    r.rope_sin.get(), T, r.heads, r.kv_heads, int32_t(hd), r.k_cache.get() + layer_off,
                    r.v_cache.get() + layer_off, r.stream, opt.row_kernels);
      const AttentionArgs args{.qkv = r.qkv.get(),
                               .qkv_stride = qkv_n,
                               .k_cache = r.k_cache.get() + layer_off,
                               .v_cache = r.v_cache.get() + layer_off,
                               .block_tables = r.meta.get() + meta.tables,
                               .table_width = table_width,
                               .block_size = block_size,
                               .tiles = reinterpret_cast<const AttentionTile*>(r.meta.get() + meta.tiles),
                               .n_tiles = int32_t(n_tiles),
                               .heads = r.heads,
                               .kv_heads = r.kv_heads,
                               .head_dim = int32_t(hd),
                               .out = r.attn.get(),
                               .tokens = T,
                               .max_positions = table_width * block_size,
                               .split_workspace = r.split_partials.get(),
                               .split_workspace_floats = split_workspace_floats};
      switch (opt.attention) {
        case AttentionKernel::Simt: paged_attention(args, r.stream); break;
        case AttentionKernel::Mma: paged_attention_mma(args, r.stream); break;
        case AttentionKernel::Split:
        case AttentionKernel::MmaSplit:
          if (l == 0 && &r == &ranks[0])
            ++(attention_split_spreads(args) ? stats.split_spread_steps : stats.split_inblock_steps);
          (opt.attention == AttentionKernel::Split ? paged_attention_split : paged_attention_mma_split)(args, r.stream);
          break;
      }
      r.gemm->run(r.attn.get(), T, r.heads * hd, L.wo.get(), h, r.partial.get(), r.stream);
    }
    all_reduce_partials(T * h);
    for (Rank& r : ranks) {
      use(r);
      const Layer& L = r.layers[size_t(l)];
      add_rmsnorm(r.x.get(), r.partial.get(), L.mlp_norm.get(), T, h, eps, r.xn.get(), r.stream, opt.row_kernels);
      r.gemm->run(r.xn.get(), T, h, L.w_gate_up.get(), 2 * r.ffn, r.gu.get(), r.stream);
      swiglu(r.gu.get(), T, r.ffn, r.act.get(), r.stream);
      r.gemm->run(r.act.get(), T, r.ffn, L.w_down.get(), h, r.partial.get(), r.stream);
    }
    all_reduce_partials(T * h);
  }
  Rank& r = ranks[0];
  use(r);
  add_rmsnorm(r.x.get(), r.partial.get(), r.final_norm.get(), T, h, eps, r.xn.get(), r.stream, opt.row_kernels);
  gather_rows(r.xn.get(), r.meta.get() + meta.samples, num_samples, h, r.last.get(), r.stream);
  r.gemm->run(r.last.get(), num_samples, h, r.lm_head.get(), m.vocab, r.logits.get(), r.stream);
  argmax_rows(r.logits.get(), num_samples, m.vocab, r.sampled.get(), r.stream);
}

void CudaModel::Impl::run_graph(int32_t bucket) {
  Rank& r = ranks[0];
  auto found = graphs.find(bucket);
  if (found != graphs.end()) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(found->second.exec, r.stream));
    ++stats.graph_replays;
    return;
  }
  // First step of this size: run it eagerly (it loads every kernel and pins the GEMM
  // algorithms), then capture the same launches for the next ones. Capture runs nothing.
  launch_step(bucket);
  ++stats.eager_steps;
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal));
  try {
    launch_step(bucket);
  } catch (...) {
    (void)cudaStreamEndCapture(r.stream, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    throw;
  }
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(r.stream, &graph));
  Graph g;
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  TANDEM_CUDA_CHECK(inst);
  graphs[bucket] = g;
  ++stats.graph_captures;
}

CudaModel::CudaModel(const ModelSpec& m, const cpu::LlamaWeights* host_weights, uint64_t seed, int32_t num_blocks,
                     int32_t block_size, const CudaModelOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.m = m;
  s.opt = opt;
  s.seed = seed;
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  // A sequence's blocks: as many as max_model_len needs, and never more than the whole cache.
  s.table_width = int32_t((cpu::rope_positions(m, num_blocks, block_size) + block_size - 1) / block_size);
  const int32_t tp = opt.tp;
  if (const std::string problem = m.tp_split_problem(tp); !problem.empty())
    throw InputError(fmt::format("engine.tp: {}", problem));
  if (!attention_supports_head_dim(m.head_dim()))
    throw InputError(fmt::format(
        "model '{}': head_dim {} is not supported by the CUDA attention kernel (32, 64 or 128)", m.name, m.head_dim()));
  const bool mma_tiles = opt.attention == AttentionKernel::Mma || opt.attention == AttentionKernel::MmaSplit;
  const int32_t group = m.heads / m.kv_heads, max_group = mma_tiles ? 64 : 16;
  if (group > max_group)
    throw InputError(fmt::format("model '{}': {} query heads per KV head; the CUDA attention kernel takes at most {}",
                                 m.name, group, max_group));
  const int devices = device_count();
  if (devices < tp)
    throw std::runtime_error(tp == 1 ? std::string("--backend cuda: no usable CUDA device")
                                     : fmt::format("engine.tp {} needs {} GPUs; {} found", tp, tp, devices));
  if (opt.first_device < 0 || devices < opt.first_device + tp)
    throw std::runtime_error(
        fmt::format("an instance on GPUs {}..{} (tp {}): this machine has {} GPU(s); disaggregation.prefill.device and "
                    "decode.device choose an instance's first GPU",
                    opt.first_device, opt.first_device + tp - 1, tp, devices));
  s.tile_tokens = mma_tiles ? attention_mma_tile_tokens(group) : attention_tile_tokens(group);
  s.ranks.resize(size_t(tp));
  const double kv_bytes = m.kv_bytes_per_token(2, tp) * double(num_blocks) * block_size;  // bf16, one rank
  const double weight_bytes = m.weight_bytes_per_rank(tp, 2);  // bf16, one rank (the rule the KV sizing uses)
  // Activations for the largest step (fp32 x, partial, qkv, gate/up; bf16 xn, attention, act)
  // and the LM head's rows; the 32 MB GEMM workspace aside.
  const int32_t max_seqs = next_pow2(std::max(1, opt.max_step_seqs));
  const double tokens = double(std::max(opt.max_step_tokens, max_seqs));
  // Split-KV attention spreads steps of up to 64 tokens (decode buckets) when their partials fit
  // 256 MB: [tokens * heads][max splits][head_dim + 2] fp32, so long contexts spread fewer tokens.
  if (opt.attention == AttentionKernel::Split || opt.attention == AttentionKernel::MmaSplit) {
    const int64_t max_positions = int64_t(s.table_width) * block_size;
    const int64_t per_token = attention_split_workspace_floats(m.heads / tp, int32_t(max_positions), m.head_dim());
    const int64_t spread_tokens = std::min<int64_t>({64, max_seqs, (int64_t{256} << 20) / 4 / per_token});
    s.split_workspace_floats = spread_tokens * per_token;
  }
  const double act_bytes =
      4.0 * double(s.split_workspace_floats) +
      tokens * (4.0 * 2 * m.hidden + 2.0 * m.hidden + 4.0 * (m.heads + 2 * m.kv_heads) / tp * m.head_dim() +
                2.0 * m.heads / tp * m.head_dim() + (4.0 * 2 + 2.0) * m.ffn / tp) +
      double(max_seqs) * (2.0 * m.hidden + 4.0 * m.vocab);
  for (int i = 0; i < tp; ++i) {
    Rank& r = s.ranks[size_t(i)];
    r.device = opt.first_device + i;
    r.heads = m.heads / tp;
    r.kv_heads = m.kv_heads / tp;
    r.ffn = m.ffn / tp;
    TANDEM_CUDA_CHECK(cudaSetDevice(r.device));
    size_t free_b = 0, total_b = 0;
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (kv_bytes + weight_bytes + act_bytes > 0.95 * double(free_b))
      throw InputError(
          fmt::format("model '{}' needs {:.1f} GB of bf16 weights, {:.1f} GB of KV cache and {:.1f} GB of "
                      "activations (engine.max_num_batched_tokens {}) per GPU; GPU {} has {:.1f} GB free "
                      "(set engine.num_kv_blocks or engine.kv_memory_gb, lower the token budget, or raise engine.tp)",
                      m.name, weight_bytes / 1e9, kv_bytes / 1e9, act_bytes / 1e9, opt.max_step_tokens, r.device,
                      double(free_b) / 1e9));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    r.gemm = std::make_unique<Gemm>(opt.deterministic, opt.gemm_pin_tokens, int64_t(tokens), opt.gemm_own_kernel);
    const size_t kv_elems =
        size_t(m.layers) * size_t(num_blocks) * size_t(block_size) * size_t(r.kv_heads) * size_t(m.head_dim());
    r.k_cache.resize(kv_elems);
    r.v_cache.resize(kv_elems);
    if (s.split_workspace_floats > 0) r.split_partials.resize(size_t(s.split_workspace_floats));
  }
  if (tp > 1 || opt.nccl_at_tp1) s.comm = std::make_unique<NcclCommunicator>(tp, opt.first_device);
  s.load_weights(host_weights);
  s.allocate_activations(int64_t(tokens), max_seqs);
  TANDEM_CUDA_CHECK(cudaSetDevice(opt.first_device));  // TP 1 steps run on the current device
}

CudaModel::~CudaModel() = default;

void CudaModel::randomize_kv_cache(uint64_t seed) {
  for (Rank& r : impl_->ranks) {
    TANDEM_CUDA_CHECK(cudaSetDevice(r.device));
    const int64_t n = int64_t(r.k_cache.size());
    fill_uniform(r.k_cache.get(), 1, n, n, 0, 0, seed, 1000 + uint64_t(r.device) * 2, 1.0f, r.stream);
    fill_uniform(r.v_cache.get(), 1, n, n, 0, 0, seed, 1001 + uint64_t(r.device) * 2, 1.0f, r.stream);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  }
}

const ModelSpec& CudaModel::spec() const { return impl_->m; }
CudaModelStats CudaModel::stats() const { return impl_->stats; }

void CudaModel::forward(const StepPlan& plan, std::span<const Token> tokens, std::vector<Token>& sampled,
                        std::vector<float>* logits) {
  Impl& s = *impl_;
  const int64_t T = plan.num_tokens, S = int64_t(plan.seqs.size());
  if (int64_t(tokens.size()) != T) throw std::logic_error("CudaModel::forward: token count differs from the plan");
  if (T == 0) return;
  // Another instance in this process (stage 4), a KV transfer, or a thread of its own that never
  // chose a GPU may have left another one current.
  TANDEM_CUDA_CHECK(cudaSetDevice(s.ranks[0].device));
  const bool decode_only = std::all_of(plan.seqs.begin(), plan.seqs.end(),
                                       [](const ScheduledSeq& q) { return q.num_tokens == 1 && q.samples; });
  const bool graph = s.opt.cuda_graph && !s.comm && decode_only && !logits;
  const int32_t bucket = graph ? next_pow2(int32_t(S)) : 0;
  if (T > s.cap_tokens || S > s.cap_seqs || bucket > s.cap_seqs) {
    const int64_t seqs = std::max<int64_t>(next_pow2(int32_t(std::max(S, s.cap_seqs))), bucket);
    s.allocate_activations(std::max({T, s.cap_tokens, seqs}), seqs);  // a graph bucket needs as many token rows
  }
  s.fill_meta(plan, tokens, bucket);
  const int64_t T_run = graph ? bucket : T;
  s.upload_meta(T_run, graph ? bucket : S);
  if (graph) {
    s.run_graph(bucket);
  } else {
    s.launch_step(T);
    ++s.stats.eager_steps;
  }
  Rank& r = s.ranks[0];
  if (s.ranks.size() > 1) TANDEM_CUDA_CHECK(cudaSetDevice(r.device));
  const int64_t n_real = graph ? S : s.num_samples;
  if (n_real)
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(s.host_sampled.get(), r.sampled.get(), size_t(n_real) * 4, cudaMemcpyDeviceToHost, r.stream));
  if (logits) {
    s.host_logits.resize(size_t(n_real * s.m.vocab));
    if (n_real)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(s.host_logits.get(), r.logits.get(), size_t(n_real * s.m.vocab) * 4,
                                        cudaMemcpyDeviceToHost, r.stream));
  }
  for (Rank& rk : s.ranks) {
    s.use(rk);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(rk.stream));
  }
  sampled.insert(sampled.end(), s.host_sampled.get(), s.host_sampled.get() + n_real);
  if (logits) logits->assign(s.host_logits.get(), s.host_logits.get() + n_real * s.m.vocab);
}

int64_t CudaModel::kv_block_bytes() const {
  int64_t bytes = 0;
  for (const Rank& r : impl_->ranks) bytes += impl_->kv_pool(r).block_bytes();
  return bytes;
}

int32_t CudaModel::kv_num_blocks() const { return impl_->num_blocks; }

std::vector<KvPoolView> CudaModel::kv_pools() const {
  std::vector<KvPoolView> out;
  for (const Rank& r : impl_->ranks) out.push_back(impl_->kv_pool(r));
  return out;
}

template <class Chunk>
void CudaModel::Impl::for_each_kv_chunk(size_t n_moved, Chunk&& chunk) {
  if (kv_io.empty())
    for (const Rank& r : ranks)
      kv_io.push_back(
          {std::make_unique<KvStaging>(r.device, kv_pool(r).block_bytes(), num_blocks, opt.kv_staging_bytes),
           std::make_unique<DeviceStream>(r.device)});
  int64_t rank_offset = 0;
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    const KvPoolView pool = kv_pool(ranks[ri]);
    KvStaging& st = *kv_io[ri].staging;
    const cudaStream_t stream = kv_io[ri].stream->get();
    TANDEM_CUDA_CHECK(cudaSetDevice(pool.device));
    for (size_t i0 = 0; i0 < n_moved; i0 += size_t(st.chunk_blocks()))
      chunk(pool, st, stream, i0, std::min(size_t(st.chunk_blocks()), n_moved - i0), rank_offset);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    rank_offset += pool.block_bytes();
  }
}

// The host buffer holds each block's ranks side by side: one rank's share of n blocks is n rows
// with the whole block as the pitch, one 2D copy per chunk.
void CudaModel::read_kv_blocks(std::span<const int32_t> blocks, std::span<std::byte> out) {
  Impl& s = *impl_;
  const size_t bb = size_t(kv_block_bytes());
  if (out.size() != blocks.size() * bb)
    throw std::invalid_argument("read_kv_blocks: buffer size is not blocks * block bytes");
  check_block_ids(blocks, s.num_blocks, "read_kv_blocks");
  s.for_each_kv_chunk(blocks.size(), [&](const KvPoolView& pool, KvStaging& st, cudaStream_t stream, size_t i0,
                                         size_t n, int64_t rank_offset) {
    const size_t rbb = size_t(pool.block_bytes());
    pack_kv_blocks(pool, st.upload(blocks.subspan(i0, n), stream), int32_t(n), st.bytes(), stream);
    TANDEM_CUDA_CHECK(cudaMemcpy2DAsync(out.data() + i0 * bb + size_t(rank_offset), bb, st.bytes(), rbb, rbb, n,
                                        cudaMemcpyDeviceToHost, stream));
  });
}

void CudaModel::write_kv_blocks(std::span<const int32_t> blocks, std::span<const std::byte> in) {
  Impl& s = *impl_;
  const size_t bb = size_t(kv_block_bytes());
  if (in.size() != blocks.size() * bb)
    throw std::invalid_argument("write_kv_blocks: buffer size is not blocks * block bytes");
  check_block_ids(blocks, s.num_blocks, "write_kv_blocks");
  s.for_each_kv_chunk(blocks.size(), [&](const KvPoolView& pool, KvStaging& st, cudaStream_t stream, size_t i0,
                                         size_t n, int64_t rank_offset) {
    const size_t rbb = size_t(pool.block_bytes());
    TANDEM_CUDA_CHECK(cudaMemcpy2DAsync(st.bytes(), rbb, in.data() + i0 * bb + size_t(rank_offset), bb, rbb, n,
                                        cudaMemcpyHostToDevice, stream));
    unpack_kv_blocks(pool, st.upload(blocks.subspan(i0, n), stream), int32_t(n), st.bytes(), stream);
  });
}

std::string CudaModel::describe() const {
  const Impl& s = *impl_;
  std::string out;
  for (const Rank& r : s.ranks) out += fmt::format("rank {}: {}\n", r.device, device_description(r.device));
  const int64_t h = s.m.hidden, hd = s.m.head_dim();
  const Rank& r = s.ranks[0];
  const auto line = [&](const char* name, int64_t N, int64_t K) {
    out += fmt::format("  gemm {:<8} {:>6} x {:<6} {}\n", name, N, K, r.gemm->describe(N, K));
  };
  switch (s.opt.attention) {
    case AttentionKernel::Simt: out += "attention: simt (CUDA cores)\n"; break;
    case AttentionKernel::Mma: out += "attention: mma (tensor cores)\n"; break;
    case AttentionKernel::Split:
    case AttentionKernel::MmaSplit:
      out += fmt::format(
          "attention: {} (split-KV on {} cores, {} keys per split; steps of up to {} tokens spread)\n",
          s.opt.attention == AttentionKernel::Split ? "split" : "mma_split",
          s.opt.attention == AttentionKernel::Split ? "CUDA" : "tensor", attention_split_keys(),
          s.split_workspace_floats / std::max<int64_t>(1, attention_split_workspace_floats(
                                                              r.heads, s.table_width * s.block_size, int32_t(hd))));
      break;
  }
  out += fmt::format("row kernels (RMSNorm, RoPE): {}\n", s.opt.row_kernels == RowKernels::V2 ? "v2" : "v1");
  out += fmt::format("gemm mode: {}\n", s.opt.deterministic
                                            ? fmt::format("deterministic (pinned at {} tokens)", s.opt.gemm_pin_tokens)
                                            : std::string("fast (heuristic per step size)"));
  line("qkv", (r.heads + 2 * r.kv_heads) * hd, h);
  line("o", h, r.heads * hd);
  line("gate_up", 2 * r.ffn, h);
  line("down", h, r.ffn);
  line("lm_head", s.m.vocab, h);
  return out;
}

}  // namespace tandem::cuda
