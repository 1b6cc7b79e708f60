// UTF-8 validation: JSON strings must be UTF-8 (nlohmann::json's dump throws on anything else).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem {

// Where `text` stops being UTF-8 (the offset of the first byte that is not part of a valid
// sequence), or npos. Text that goes into a JSON output is checked where it is read.
inline size_t first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b >> 6) != 0x2) return i;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace tandem
