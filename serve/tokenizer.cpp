#include "serve/tokenizer.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::serve {

std::vector<Token> encode_text(std::string_view text) {
  std::vector<Token> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = Token(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string apply_chat_template(std::span<const ChatMessage> messages) {
  std::string s;
  for (const ChatMessage& m : messages) s += fmt::format("<|{}|>\n{}\n", m.role, m.content);
  return s + "<|assistant|>\n";
}

namespace {
// GPT-2's byte-level alphabet (bytes_to_unicode): the printable bytes stand for themselves, the
// others for code points from 256 on, so that every byte is one visible symbol.
std::string byte_symbol(int b, int& next_spare) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  const int cp = printable ? b : 256 + next_spare++;
  std::string utf8;
  if (cp < 0x80) {
    utf8 += char(cp);
  } else {
    utf8 += char(0xC0 | (cp >> 6));
    utf8 += char(0x80 | (cp & 0x3F));
  }
  return utf8;
}
}  // namespace

void write_tokenizer_files(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("--write-tokenizer --out {}: {}", dir.string(), ec.message()));
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  int spare = 0;
  for (int b = 0; b < kByteVocab; ++b) vocab[byte_symbol(b, spare)] = b;
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const nlohmann::ordered_json tokenizer = {{"version", "1.0"},
                                            {"truncation", nullptr},
                                            {"padding", nullptr},
                                            {"added_tokens", nlohmann::ordered_json::array()},
                                            {"normalizer", nullptr},
                                            {"pre_tokenizer", byte_level},
                                            {"post_processor", nullptr},
                                            {"decoder", byte_level},
                                            {"model",
                                             {{"type", "BPE"},
                                              {"dropout", nullptr},
                                              {"unk_token", nullptr},
                                              {"continuing_subword_prefix", nullptr},
                                              {"end_of_word_suffix", nullptr},
                                              {"fuse_unk", false},
                                              {"byte_fallback", false},
                                              {"vocab", vocab},
                                              {"merges", nlohmann::ordered_json::array()}}}};
  const nlohmann::ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                         {"model_max_length", 1 << 20},
                                         {"clean_up_tokenization_spaces", false},
                                         {"add_bos_token", false},
                                         {"add_eos_token", false}};
  for (const auto& [name, j] : {std::pair{"tokenizer.json", &tokenizer}, std::pair{"tokenizer_config.json", &config}}) {
    std::ofstream f(dir / name);
    f << j->dump(1) << "\n";
    if (!f) throw InputError(fmt::format("--write-tokenizer: cannot write {}", (dir / name).string()));
  }
}

}  // namespace tandem::serve
