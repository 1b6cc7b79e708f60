// Steps of hand-made plans on a real model (CPU or CUDA: anything with
// forward(plan, tokens, sampled, logits) and spec()), for the numerics-contract tests:
// each (sequence, n) advances a sequence by n tokens, every sequence samples, and the
// logits row of each comes back. Blocks are handed out fresh, never reused.
#pragma once
#include <cstring>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "policies/plan.h"

namespace tandem::testing {

struct Seq {
  std::vector<Token> tokens;   // the whole sequence so far
  std::vector<int32_t> table;  // its block table
  int32_t computed = 0;
};

template <class Model>
class StepHarness {
 public:
  explicit StepHarness(Model& model, int32_t bs = 16) : model_(model), bs_(bs) {}
  void grow(Seq& s, int32_t upto) {
    while (int32_t(s.table.size()) * bs_ < upto) s.table.push_back(next_block_++);
  }
  std::vector<std::vector<float>> step(std::vector<std::pair<Seq*, int32_t>> work) {
    StepPlan plan;
    for (auto& [s, n] : work) {
      grow(*s, s->computed + n);
      plan.add({0, n, s->computed, true, s->table}, s->computed + n);  // every step is a prompt chunk here
      for (int32_t i = 0; i < n; ++i)
        plan.tokens.push_back(s->tokens.at(size_t(s->computed + i)));  // checked: a test bug throws
    }
    std::vector<Token> sampled;
    std::vector<float> logits;
    model_.forward(plan, plan.tokens, sampled, &logits);
    const size_t V = size_t(model_.spec().vocab);
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < work.size(); ++i) {
      work[i].first->computed += work[i].second;
      out.emplace_back(logits.begin() + long(i * V), logits.begin() + long((i + 1) * V));
    }
    return out;
  }

 private:
  Model& model_;
  int32_t bs_;
  int32_t next_block_ = 0;
};

inline std::vector<Token> random_tokens(Rng& rng, int n, int vocab) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (auto& x : t) x = Token(rng.uniform_int(0, vocab - 1));
  return t;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace tandem::testing
