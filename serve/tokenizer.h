// tandem serve's tokenizer: byte level, documented and fixed, so that a client that counts
// tokens itself (with the Hugging Face files write_tokenizer_files makes) agrees with the
// server's usage figures. The backends run dummy-weight models: what matters is how many tokens
// a prompt is and when each output token is emitted, not what they say.
//   text -> ids   each UTF-8 byte b of the text is the token b (0..255); no merges, no specials
//   ids  -> text  an output token becomes one printable ASCII byte: b itself when 32 <= b < 127,
//                 else 33 + id mod 94 ('!' .. '~'), so one output token is one byte of text and
//                 the text re-tokenises to exactly as many tokens (the ids may differ: a model with
//                 a larger vocabulary samples ids no byte stands for)
//   token ids     given by a client (a list of ints) pass through untouched
// In simulated time (--backend sim) no model samples: the k-th output token of a request is
// emulated_token(k), the letters 'a' .. 'z' in turn.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/request.h"

namespace tandem::serve {

inline constexpr int32_t kByteVocab = 256;

std::vector<Token> encode_text(std::string_view text);
inline char output_byte(Token t) { return t >= 32 && t < 127 ? char(t) : char(33 + (t < 0 ? -(t % 94) : t % 94)); }
inline Token emulated_token(int64_t k) { return Token('a' + k % 26); }

// The fixed chat template (README, "tandem serve"): each message as
//   "<|ROLE|>\n" CONTENT "\n"
// in order, then "<|assistant|>\n"; the result is tokenised as any text.
struct ChatMessage {
  std::string role, content;
};
std::string apply_chat_template(std::span<const ChatMessage> messages);

// The Hugging Face tokenizer of the rules above (tokenizer.json: a BPE model over the 256
// byte-level symbols, no merges; tokenizer_config.json), written into `dir` (created).
void write_tokenizer_files(const std::filesystem::path& dir);

}  // namespace tandem::serve
