// Turns a resolved workload into the run's request table: synthetic arrivals and lengths
// from the seed, or a replayed trace. Deterministic: the same workload gives the same table.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/request.h"
#include "sim/workload/config.h"

namespace tandem {

struct RequestSet {
  std::vector<Request> requests;  // sorted by arrival; requests[i].id == i
  std::vector<int64_t> hash_ids;  // Mooncake prefix-block hashes, referenced by Request::hash_ids_*
  int32_t hash_block_size = 0;    // tokens per hash id (Mooncake: 512)
  // Prompt token ids the trace gives (vidur's prompt_token_ids column: what `tandem serve`'s
  // clients sent): request i's are [prompt_token_begin[i], + prompt_len) of prompt_token_pool.
  // Both empty: the ids come from the seed (PromptTokens).
  std::vector<Token> prompt_token_pool;
  std::vector<size_t> prompt_token_begin;  // by request id
  bool has_given_prompts() const { return !prompt_token_begin.empty(); }
  std::span<const Token> given_prompt(const Request& r) const {
    return {prompt_token_pool.data() + prompt_token_begin[static_cast<size_t>(r.id)],
            static_cast<size_t>(r.prompt_len)};
  }
};

RequestSet generate_requests(const Workload& w);

// Prompt token ids, generated from the seed so that the same workload gives the same
// prompts in simulation and on hardware: a shared-prefix group's members share their
// leading ids, and equal Mooncake hash ids map to identical blocks of ids.
class PromptTokens {
 public:
  PromptTokens(uint64_t seed, int32_t vocab, const RequestSet& set)
      : seed_(seed), vocab_(vocab), vocab_inverse_(vocab > 0 ? ~uint64_t{0} / uint64_t(vocab) : 0), set_(set) {}
  Token at(const Request& r, int32_t pos) const;
  void fill(const Request& r, std::vector<Token>& out) const;
  // Tokens [start, start + count) of r's prompt into out: the same ids as at(), made a run at a
  // time (one source per run, its part of the hash hoisted, no division), because prefix caching
  // hashes every prompt token of a replay on arrival.
  void fill(const Request& r, int32_t start, int32_t count, Token* out) const;

  // What decides the ids of [start, start + count): one (key, first offset, length) triple per
  // run of one source, where the run's ids are mix(key ^ mix(offset)) % vocab for offsets
  // first .. first + length - 1. Equal descriptions give equal ids (for one vocab), so prefix
  // caching hashes these, a few words per block, instead of every token id (a replay of the
  // Azure conv hour has 22M prompt ids; its blocks have 1.4M descriptions).
  struct Run {
    uint64_t key;
    int32_t first, length;
    bool own = false;  // the request's own stream: no other request has these ids
  };
  void describe(const Request& r, int32_t start, int32_t count, std::vector<Run>& out) const;

 private:
  // h % vocab_ for any 64-bit h, exactly: q from a 128-bit multiply by floor(2^64 / vocab)
  // undershoots the quotient by at most 2, which the loop corrects.
  Token reduce(uint64_t h) const {
    __extension__ typedef unsigned __int128 u128;  // GCC and Clang; -Wpedantic would refuse it bare
    const auto q = static_cast<uint64_t>((static_cast<u128>(h) * vocab_inverse_) >> 64);
    const auto v = static_cast<uint64_t>(vocab_);
    uint64_t r = h - q * v;
    r -= v & (0 - uint64_t(r >= v));  // branch-free: the corrections are data-dependent coin flips
    r -= v & (0 - uint64_t(r >= v));
    return static_cast<Token>(r);
  }

  uint64_t seed_;
  int32_t vocab_;
  uint64_t vocab_inverse_;
  const RequestSet& set_;
};

}  // namespace tandem
