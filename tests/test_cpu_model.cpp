// The numerics contract of the CPU reference model: a token's logits are bit-identical
// whatever else is in its batch, however its prompt is chunked, and whether its prefix was
// computed or taken from another request's blocks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "core/rng.h"
#include "tests/model_harness.h"
#include "tests/small_models.h"

using namespace tandem;
using namespace tandem::cpu;

namespace {

using testing::bit_equal;
using testing::random_tokens;
using testing::Seq;
using testing::small_model;

// A CPU model with dummy weights (seed 11) and a harness over it.
struct ModelHolder {
  LlamaModel model;
};
class Harness : public ModelHolder, public testing::StepHarness<LlamaModel> {
 public:
  explicit Harness(const ModelSpec& m, int32_t blocks = 512, int32_t bs = 16, int32_t tp = 1)
      : ModelHolder{LlamaModel(m, dummy_weights(m, 11), blocks, bs, tp)}, StepHarness(model, bs) {}
};

// ||a - b|| / ||b||
double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("gemm_nt: each element is identical whatever the number of rows and the tile it falls in") {
  Rng rng(3);
  for (int64_t K : {1, 7, 8, 13, 64, 203}) {
    for (int64_t N : {1, 3, 4, 5, 9}) {
      const int64_t T = 9;
      std::vector<float> X(size_t(T * K)), W(size_t(N * K)), Y(size_t(T * N));
      for (auto& x : X) x = float(rng.uniform(-1, 1));
      for (auto& w : W) w = float(rng.uniform(-1, 1));
      gemm_nt(X.data(), T, K, W.data(), N, Y.data());
      for (int64_t rows = 1; rows <= T; ++rows) {
        for (int64_t r0 = 0; r0 + rows <= T; r0 += 2) {
          std::vector<float> Ys(size_t(rows * N));
          gemm_nt(X.data() + r0 * K, rows, K, W.data(), N, Ys.data());
          for (int64_t t = 0; t < rows; ++t)
            for (int64_t n = 0; n < N; ++n) REQUIRE(Ys[size_t(t * N + n)] == Y[size_t((r0 + t) * N + n)]);
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0;
          for (int64_t k = 0; k < K; ++k) ref += double(X[size_t(t * K + k)]) * W[size_t(n * K + k)];
          CHECK(Y[size_t(t * N + n)] == doctest::Approx(ref).epsilon(1e-5));
        }
    }
  }
}

TEST_CASE("contract (a): logits alone == logits in batches with random other requests") {
  const ModelSpec m = small_model();
  Rng rng(5);
  Harness alone(m);
  Seq a{random_tokens(rng, 37, m.vocab), {}, 0};
  const auto ref_prefill = alone.step({{&a, 37}})[0];
  a.tokens.push_back(5);
  const auto ref_decode = alone.step({{&a, 1}})[0];
  for (int trial = 0; trial < 6; ++trial) {
    Harness h(m);
    Seq b{a.tokens, {}, 0};
    b.tokens.pop_back();
    // Others: some prefilled earlier (now decoding with context), some prefilling alongside.
    std::vector<Seq> others(size_t(rng.uniform_int(1, 6)));
    for (auto& o : others) {
      o.tokens = random_tokens(rng, int(rng.uniform_int(1, 120)), m.vocab);
      if (rng.uniform() < 0.5) h.step({{&o, int32_t(o.tokens.size())}});
      o.tokens.push_back(Token(rng.uniform_int(0, m.vocab - 1)));
    }
    std::vector<std::pair<Seq*, int32_t>> work;
    const size_t where = size_t(rng.uniform_int(0, int64_t(others.size())));
    for (size_t i = 0; i <= others.size(); ++i) {
      if (i == where) work.push_back({&b, 37});
      if (i < others.size()) work.push_back({&others[i], int32_t(others[i].tokens.size()) - others[i].computed});
    }
    auto out = h.step(work);
    CHECK(bit_equal(out[where], ref_prefill));
    b.tokens.push_back(5);
    std::vector<std::pair<Seq*, int32_t>> work2{{&b, 1}};
    for (auto& o : others) {
      o.tokens.push_back(1);
      work2.push_back({&o, int32_t(o.tokens.size()) - o.computed});
    }
    CHECK(bit_equal(h.step(work2)[0], ref_decode));
  }
}

TEST_CASE("contract (b): prompt at once == prompt in chunks of 1, 7, 16, 100") {
  const ModelSpec m = small_model();
  Rng rng(6);
  const std::vector<Token> prompt = random_tokens(rng, 230, m.vocab);
  Harness h0(m);
  Seq ref{prompt, {}, 0};
  const auto ref_logits = h0.step({{&ref, 230}})[0];
  for (int32_t chunk : {1, 7, 16, 100}) {
    Harness h(m);
    Seq s{prompt, {}, 0};
    std::vector<float> last;
    while (s.computed < 230) last = h.step({{&s, std::min<int32_t>(chunk, 230 - s.computed)}})[0];
    CHECK_MESSAGE(bit_equal(last, ref_logits), "chunk ", chunk);
  }
}

TEST_CASE("contract (c): a prefix computed == the same prefix taken from another request's blocks") {
  const ModelSpec m = small_model();
  Rng rng(7);
  const std::vector<Token> shared = random_tokens(rng, 48, m.vocab);  // three full blocks of 16
  std::vector<Token> ta = shared, tb = shared;
  for (Token t : random_tokens(rng, 20, m.vocab)) ta.push_back(t);
  for (Token t : random_tokens(rng, 29, m.vocab)) tb.push_back(t);
  Harness fresh(m);
  Seq b_fresh{tb, {}, 0};
  const auto ref = fresh.step({{&b_fresh, int32_t(tb.size())}})[0];

  Harness h(m);
  Seq a{ta, {}, 0};
  h.step({{&a, int32_t(ta.size())}});
  Seq b{tb, {a.table[0], a.table[1], a.table[2]}, 48};  // hit: A's first three blocks
  const auto got = h.step({{&b, int32_t(tb.size()) - 48}})[0];
  CHECK(bit_equal(got, ref));
}

TEST_CASE("the unconstrained Eigen path computes the same function (not bit for bit)") {
  const ModelSpec m = small_model();
  Rng rng(8);
  const std::vector<Token> p = random_tokens(rng, 64, m.vocab);
  Harness a(m), b(m);
  b.model.set_gemm_path(GemmPath::Eigen);
  Seq sa{p, {}, 0}, sb{p, {}, 0};
  const auto la = a.step({{&sa, 64}})[0], lb = b.step({{&sb, 64}})[0];
  CHECK(rel_norm(lb, la) < 1e-5);
}

namespace {
ModelSpec tp_model() {  // divisible by 4 ranks: 8 heads, 4 KV heads, ffn 344
  return small_model({.heads = 8, .kv_heads = 4, .ffn = 344});
}
}  // namespace

TEST_CASE("tensor parallelism is invariant: logits at TP 2 and 4 are TP 1's bit for bit") {
  const ModelSpec m = tp_model();
  REQUIRE(m.reduction_segments() == 4);
  Rng rng(12);
  const std::vector<Token> p = random_tokens(rng, 90, m.vocab);
  Harness one(m);
  Seq s1{p, {}, 0};
  const auto ref = one.step({{&s1, 90}})[0];
  for (int32_t tp : {2, 4}) {
    Harness h(m, 512, 16, tp);
    Seq s{p, {}, 0};
    const auto got = h.step({{&s, 90}})[0];
    CHECK_MESSAGE(bit_equal(got, ref), "tp ", tp, " rel ", rel_norm(got, ref));
  }
}

TEST_CASE("a TP degree that does not divide the reduction segments is a valid split, not invariant") {
  // 12 heads, 6 KV heads, ffn 342 = 2 x 171: gcd 6, so 2 segments: TP 2 is TP 1's bits, TP 3 is not.
  const ModelSpec m = small_model({.heads = 12, .kv_heads = 6, .hidden = 192, .ffn = 342});
  REQUIRE(m.reduction_segments() == 2);
  CHECK(m.tp_invariant(2));
  CHECK_FALSE(m.tp_invariant(3));
  Rng rng(14);
  const std::vector<Token> p = random_tokens(rng, 40, m.vocab);
  Harness one(m);
  Seq s1{p, {}, 0};
  const auto ref = one.step({{&s1, 40}})[0];
  Harness two(m, 512, 16, 2), three(m, 512, 16, 3);
  Seq s2{p, {}, 0}, s3{p, {}, 0};
  CHECK(bit_equal(two.step({{&s2, 40}})[0], ref));
  const auto got = three.step({{&s3, 40}})[0];
  CHECK(rel_norm(got, ref) < 1e-5);
  CHECK_FALSE(bit_equal(got, ref));  // its ranks' slices are not subtrees of the reduction
}

TEST_CASE("gemm_nt_segmented: each element is the tree of its segments' fixed-order dots, whatever the rows") {
  Rng rng(15);
  const int64_t T = 5, K = 8 * 43, N = 7;  // segments of 86 (a tail of 6 lanes each), a ragged N
  std::vector<float> X(size_t(T * K)), W(size_t(N * K));
  for (float& x : X) x = float(rng.uniform() - 0.5);
  for (float& w : W) w = float(rng.uniform() - 0.5);
  for (int32_t segs : {1, 2, 4, 8}) {
    if (K % segs) continue;
    std::vector<float> Y(size_t(T * N)), one(static_cast<size_t>(N));
    gemm_nt_segmented(X.data(), T, K, W.data(), N, Y.data(), segs);
    for (int64_t t = 0; t < T; ++t) {
      gemm_nt_segmented(&X[size_t(t * K)], 1, K, W.data(), N, one.data(), segs);  // the row alone
      for (int64_t n = 0; n < N; ++n) {
        float parts[8];
        for (int32_t s = 0; s < segs; ++s) parts[s] = dot(&X[size_t(t * K + s * K / segs)], &W[size_t(n * K + s * K / segs)], K / segs);
        const float want = tree_sum(parts, segs);
        CHECK_MESSAGE(std::memcmp(&Y[size_t(t * N + n)], &want, 4) == 0, "segments ", segs, " t ", t, " n ", n);
        CHECK(std::memcmp(&one[size_t(n)], &want, 4) == 0);
      }
    }
  }
  float v[5] = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f};  // ((1e8 + 1) + (-1e8 + 1)) + 3: the pairs first
  CHECK(tree_sum(v, 5) == (float(1e8f + 1.0f) + float(-1e8f + 1.0f)) + 3.0f);
}

TEST_CASE("tensor parallelism keeps the contract: chunked == at once, alone == batched, at TP 2") {
  const ModelSpec m = tp_model();
  Rng rng(13);
  const std::vector<Token> p = random_tokens(rng, 70, m.vocab);
  Harness ref_h(m, 512, 16, 2);
  Seq ref{p, {}, 0};
  const auto ref_logits = ref_h.step({{&ref, 70}})[0];
  Harness h(m, 512, 16, 2);
  Seq a{p, {}, 0}, other{random_tokens(rng, 33, m.vocab), {}, 0};
  h.step({{&a, 7}, {&other, 33}});
  std::vector<float> last;
  while (a.computed < 70) {
    other.tokens.push_back(3);
    last = h.step({{&other, 1}, {&a, std::min<int32_t>(16, 70 - a.computed)}})[1];
  }
  CHECK(bit_equal(last, ref_logits));
}

TEST_CASE("tensor parallelism must divide heads, KV heads and ffn") {
  ModelSpec m = tp_model();
  CHECK_THROWS_AS(LlamaModel(m, dummy_weights(m, 1), 8, 16, 3), std::invalid_argument);
  m.ffn = 342;
  CHECK_THROWS_AS(LlamaModel(m, dummy_weights(m, 1), 8, 16, 4), std::invalid_argument);
}
