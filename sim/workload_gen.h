// Turns a resolved workload into the run's request table: synthetic arrivals and lengths
// from the seed, or a replayed trace. Deterministic: the same workload gives the same table.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/config.h"
#include "sim/request.h"

namespace tandem {

struct RequestSet {
  std::vector<Request> requests;  // sorted by arrival; requests[i].id == i
  std::vector<int64_t> hash_ids;  // Mooncake prefix-block hashes, referenced by Request::hash_ids_*
  int32_t hash_block_size = 0;    // tokens per hash id (Mooncake: 512)
};

RequestSet generate_requests(const Workload& w);

// Prompt token ids, generated from the seed so that the same workload gives the same
// prompts in simulation and on hardware: a shared-prefix group's members share their
// leading ids, and equal Mooncake hash ids map to identical blocks of ids.
class PromptTokens {
 public:
  PromptTokens(uint64_t seed, int32_t vocab, const RequestSet& set) : seed_(seed), vocab_(vocab), set_(set) {}
  Token at(const Request& r, int32_t pos) const;
  void fill(const Request& r, std::vector<Token>& out) const;

 private:
  uint64_t seed_;
  int32_t vocab_;
  const RequestSet& set_;
};

}  // namespace tandem
