// The CUDA backend's own kernels (the GEMMs go through cuBLASLt, see gemm.h). Each has a
// CPU twin in backend/cpu that the cuda test suite compares it against. All launch on the
// given stream and check the launch; none synchronises, so a step can be captured in a
// CUDA Graph.
//
// Batch invariance: every kernel computes an output row from that row's inputs alone, with
// a reduction order fixed by the row's length (and, for attention, by the query's absolute
// position), never by how many rows the launch has. So a token's result does not depend on
// what else is in its step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/row_kernels.h"
#include "backend/cuda/step_meta.h"  // AttentionTile

namespace tandem::cuda {

using bf16 = __nv_bfloat16;

// x[t][:] = float(embed[tokens[t]][:]).
void embed_gather(const int32_t* tokens, const bf16* embed, int64_t T, int64_t h, float* x, cudaStream_t s);

// Per row: if residual != nullptr, x += residual (x is updated in place); then
// out = bf16(x / sqrt(mean(x^2) + eps) * w). Sum of squares in a fixed order per row.
void add_rmsnorm(float* x, const float* residual, const float* w, int64_t T, int64_t h, float eps, bf16* out,
                 cudaStream_t s, RowKernels version = RowKernels::V1);

// RoPE (rotate-half, as Hugging Face Llama) in place on the q and k heads of each token's qkv
// row ([heads q | kv_heads k | kv_heads v] x head_dim, fp32), with cos/sin tables
// [max_len][head_dim/2]; then k and v go to the paged cache (bf16, [block*bs + slot][kv_heads]
// [head_dim] of this layer) at slots[t]. A negative slot (padding) writes nothing.
void rope_store_kv(float* qkv, const int32_t* positions, const int32_t* slots, const float* cos, const float* sin,
                   int64_t T, int32_t heads, int32_t kv_heads, int32_t head_dim, bf16* k_cache, bf16* v_cache,
                   cudaStream_t s, RowKernels version = RowKernels::V1);

// Query tokens per tile for a GQA group size (16 query rows per thread block).
int32_t attention_tile_tokens(int32_t group);
// Whether the attention kernel supports this head size (32, 64 and 128).
bool attention_supports_head_dim(int32_t head_dim);

// What both attention kernels take: the step's query rows, the paged cache (which already
// holds this step's keys and values) and the work tiles. q: the qkv rows (fp32, stride
// qkv_stride); block_tables: [sequences][table_width] block ids; out: bf16 [T][heads * head_dim].
struct AttentionArgs {
  const float* qkv = nullptr;
  int64_t qkv_stride = 0;
  const bf16* k_cache = nullptr;  // this layer's
  const bf16* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t table_width = 0;
  int32_t block_size = 0;
  const AttentionTile* tiles = nullptr;
  int32_t n_tiles = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  bf16* out = nullptr;
  // Split-KV only (paged_attention_split): the step's token rows (padding included), the
  // positions a sequence can reach (table_width * block_size), and the partials' workspace.
  int64_t tokens = 0;
  int32_t max_positions = 0;
  float* split_workspace = nullptr;
  int64_t split_workspace_floats = 0;
};

// Causal attention of the step's query tokens over the paged cache. Every cache slot up to a
// tile's last query position must hold finite values (masked keys are multiplied by zero,
// and 0 * NaN is NaN): the model stores the step's keys before attention. Keys are visited in
// tiles of 64 from position 0 with an online softmax; a query's arithmetic depends only on
// its own position and the cached keys, so prefill, chunked prefill and decode agree bit for bit.
void paged_attention(const AttentionArgs& a, cudaStream_t s);

// The same attention on the tensor cores (attention_mma.cu): bf16 Q and P, fp32 scores and
// accumulation, 64 query rows per block. Also batch- and chunk-invariant, but a different
// function from paged_attention (Q and P rounded to bf16): one run uses one of them.
int32_t attention_mma_tile_tokens(int32_t group);
void paged_attention_mma(const AttentionArgs& a, cudaStream_t s);

// Split-KV attention on the CUDA cores (attention_split.cu): keys in fixed splits of
// attention_split_keys() tokens by absolute position, a partial softmax per split, folded in
// split order. Batch- and chunk-invariant; a function of its own (one run uses one variant).
// Same tiles as paged_attention (attention_tile_tokens). A launch whose tokens * heads rows
// times the splits fit split_workspace (attention_split_workspace_floats) spreads its splits
// over the GPU and combines them in a second kernel; one that does not fit walks the splits in
// each block. Both give the same bits (the cuda suite checks it).
int32_t attention_split_keys();
int32_t attention_split_max_splits(int32_t max_positions);
int64_t attention_split_workspace_floats(int64_t query_rows, int32_t max_positions, int32_t head_dim);
bool attention_split_spreads(const AttentionArgs& a);  // which of the two ways a launch takes
void paged_attention_split(const AttentionArgs& a, cudaStream_t s);
// The same split-KV function's structure on the tensor cores (attention_mma_split.cu): per split,
// S = Q K^T and P V by WMMA with bf16 Q and P, as paged_attention_mma; the mma kernel's tiles
// (attention_mma_tile_tokens) and split's workspace and choice of way. A function of its own.
void paged_attention_mma_split(const AttentionArgs& a, cudaStream_t s);

// Y[T][N] = X[T][K] W[N][K]^T on the tensor cores (gemm_own.cu), bf16 operands, fp32
// accumulation in ascending K: batch-invariant by construction. Deterministic mode's fallback
// when cuBLASLt offers no row-invariant algorithm, and every GEMM with engine.cuda_gemm: own
// (see gemm.h). Steps of up to 64 rows take a skinny kernel of the same function (skinny =
// false: the tiled kernel always, for tests); gemm_invariant_is_skinny says which one runs.
void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, float* Y, cudaStream_t s,
                    bool skinny = true);
void gemm_invariant(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N, bf16* Y, cudaStream_t s,
                    bool skinny = true);
bool gemm_invariant_is_skinny(const bf16* X, int64_t T, int64_t K, const bf16* W, int64_t N);

// act[t][i] = bf16(silu(gu[t][i]) * gu[t][ffn + i]).
void swiglu(const float* gu, int64_t T, int64_t ffn, bf16* act, cudaStream_t s);

// out[i][:] = in[rows[i]][:]
void gather_rows(const bf16* in, const int32_t* rows, int64_t n, int64_t h, bf16* out, cudaStream_t s);

// out[r] = index of the first maximum of logits[r][0..V). NaNs are never the maximum.
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s);

// Dummy weights generated on the device from (seed, tensor id, index in the full tensor):
// uniform in [-scale, scale] (the bf16 rounding can reach bf16(scale)). Any model size starts in seconds. `w` receives
// the rows x cols slice at (row0, col0) of a tensor with full_cols columns, so a tensor-parallel rank's shard holds
// exactly the values of the unsharded tensor.
void fill_uniform(bf16* w, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0, int64_t col0, uint64_t seed,
                  uint64_t tensor_id, float scale, cudaStream_t s);

}  // namespace tandem::cuda
