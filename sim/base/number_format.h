// Fast writers of the numbers in steps.csv, requests.csv and trace.json: the same bytes as
// fmt's {} and {:.Nf}, faster (fmt formats a double with fixed precision in 70-500 ns, an
// integer in about 10), into a buffer with room for a row (kRowRoom).
#pragma once
#include <fmt/compile.h>
#include <fmt/format.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem::numfmt {

// Room for one row or event: at most 330 characters per number (a double's {:.9f} is at
// most 309 digits before the point), at most 9 numbers of that kind per row.
constexpr size_t kRowRoom = 4096;

// Each writer returns the new end of the buffer.
template <size_t N>
inline char* put(char* p, const char (&text)[N]) {
  std::memcpy(p, text, N - 1);
  return p + N - 1;
}
inline char* put_int(char* p, int64_t v) { return fmt::format_to(p, FMT_COMPILE("{}"), v); }

// {:.Nf} of `d`, where d is the integer t scaled by 10^-N (nanoseconds as seconds with N = 9,
// as ms with 6, as µs with 3; d = t * 1e-N or t / 1eN). Below 1e15 the double is within a
// quarter unit of the last printed digit of t * 10^-N (relative error <= 2^-52), so
// formatting it rounds to exactly t's digits: print those. Larger or negative t: fmt.
template <int N>
char* put_scaled(char* p, int64_t t, double d) {
  static_assert(N == 3 || N == 6 || N == 9);
  constexpr int64_t scale = N == 3 ? 1'000 : N == 6 ? 1'000'000 : 1'000'000'000;
  if (t < 0 || t >= 1'000'000'000'000'000) return fmt::format_to(p, FMT_COMPILE("{:.{}f}"), d, N);
  p = put_int(p, t / scale);
  *p++ = '.';
  const fmt::format_int frac(t % scale + scale);  // 1 then the N digits, leading zeros kept
  std::memcpy(p, frac.data() + 1, N);
  return p + N;
}

// {:.0f} of a double: an integer-valued one (attention pairs, context tokens) is its integer.
inline char* put_fixed0(char* p, double v) {
  if (v >= 0 && !std::signbit(v) && v < 9007199254740992.0 && v == std::trunc(v)) return put_int(p, int64_t(v));
  return fmt::format_to(p, FMT_COMPILE("{:.0f}"), v);
}

// {:.6f} of a double, remembered: a step's KV use and cost terms mostly repeat values seen
// before (the same batch shape costs the same), so most rows copy text instead.
template <int kLog2Slots>
class Fixed6Cache {
 public:
  char* put(char* p, double v) {
    const uint64_t bits = std::bit_cast<uint64_t>(v);
    Slot& s = slots_[(bits * 0x9E3779B97F4A7C15ull) >> (64 - kLog2Slots)];
    if (s.len == 0 || s.bits != bits) {
      const auto r = fmt::format_to_n(s.text, sizeof s.text, FMT_COMPILE("{:.6f}"), v);
      if (r.size > sizeof s.text) {  // too long to keep (huge or non-finite values)
        s.len = 0;
        return fmt::format_to(p, FMT_COMPILE("{:.6f}"), v);
      }
      s.bits = bits;
      s.len = uint8_t(r.size);
    }
    std::memcpy(p, s.text, sizeof s.text);  // whole slot: a fixed-size copy; the room allows it
    return p + s.len;
  }

 private:
  struct Slot {
    uint64_t bits = 0;
    uint8_t len = 0;  // 0: empty
    char text[23];    // 32-byte slots
  };
  std::array<Slot, size_t(1) << kLog2Slots> slots_{};
};

}  // namespace tandem::numfmt
