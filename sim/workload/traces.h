// Readers for public request traces (see ../shared/traces/README.md):
//   azure     TIMESTAMP,ContextTokens,GeneratedTokens  (Azure LLM inference 2023)
//   vidur     arrived_at,num_prefill_tokens,num_decode_tokens (seconds from start), and optionally
//             prompt_token_ids (the prompt's ids, space-separated: `tandem serve --record-prompts`)
//   mooncake  JSON lines {timestamp (ms), input_length, output_length, hash_ids}
#pragma once
#include <cstdint>
#include <vector>

#include "sim/workload/config.h"

namespace tandem {

struct TraceRow {
  double t_s;  // offset from the trace's first request, before scaling
  int64_t prompt_len, output_len;
  uint32_t hash_begin = 0, hash_count = 0;  // into the hash pool (Mooncake)
  // The prompt's token ids (vidur's prompt_token_ids column), [begin, begin + prompt_len) of
  // the token pool; has_tokens false: none given (ids come from the seed).
  size_t tokens_begin = 0;
  bool has_tokens = false;
  int64_t line = 0;  // in the file, for errors found later (a token id past the model's vocab)
};

// Reads the whole trace; errors name file:line and the field. Rows keep file order; times
// are offsets from the earliest row.
std::vector<TraceRow> read_trace(const TraceSpec& t, std::vector<int64_t>& hash_pool);
// The same, keeping the prompt token ids a vidur trace gives into `token_pool`.
std::vector<TraceRow> read_trace(const TraceSpec& t, std::vector<int64_t>& hash_pool, std::vector<Token>& token_pool);

// "YYYY-MM-DD HH:MM:SS[.fraction]" to seconds since 1970 (no time zone: offsets are what matter).
bool parse_timestamp(const std::string& s, double& seconds);

}  // namespace tandem
