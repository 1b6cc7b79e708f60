#include "backend/transfer/wire.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace tandem::transfer {

namespace {

// The smallest encodings, so that a count can be checked against the bytes left before
// anything is reserved for it.
constexpr size_t kMinSeqBytes = 4 + 4 + 4 + 1 + 1 + 8;  // id, tokens, context, samples, prefill, table count

}  // namespace

std::string_view msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Hello: return "Hello";
    case MsgType::HelloOk: return "HelloOk";
    case MsgType::Challenge: return "Challenge";
    case MsgType::Proof: return "Proof";
    case MsgType::Step: return "Step";
    case MsgType::StepReply: return "StepReply";
    case MsgType::KvPush: return "KvPush";
    case MsgType::KvAck: return "KvAck";
    case MsgType::Bye: return "Bye";
    case MsgType::Error: return "Error";
    case MsgType::Ping: return "Ping";
  }
  return "unknown";
}

// ---- WireWriter ----

void WireWriter::u8(uint8_t v) { buf_.push_back(v); }
void WireWriter::u16(uint16_t v) {
  for (int i = 0; i < 2; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
}
void WireWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
}
void WireWriter::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
}
void WireWriter::i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
void WireWriter::i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
void WireWriter::boolean(bool v) { u8(v ? 1 : 0); }
void WireWriter::str(std::string_view s) {
  u64(s.size());
  buf_.insert(buf_.end(), s.begin(), s.end());
}
void WireWriter::i32s(std::span<const int32_t> v) {
  u64(v.size());
  buf_.reserve(buf_.size() + 4 * v.size());
  for (int32_t x : v) i32(x);
}
void WireWriter::u64s(std::span<const uint64_t> v) {
  u64(v.size());
  buf_.reserve(buf_.size() + 8 * v.size());
  for (uint64_t x : v) u64(x);
}
void WireWriter::blob(std::span<const uint8_t> v) {
  u64(v.size());
  bytes(v);
}
void WireWriter::bytes(std::span<const uint8_t> v) { buf_.insert(buf_.end(), v.begin(), v.end()); }

// ---- WireReader ----

void WireReader::fail(std::string_view field, std::string_view what) const {
  throw WireError(fmt::format("{}.{}: {}", message_, field, what));
}

template <class T>
T WireReader::fixed(std::string_view field) {
  if (remaining() < sizeof(T)) fail(field, fmt::format("needs {} bytes, {} left", sizeof(T), remaining()));
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{bytes_[pos_ + i]} << (8 * i);
  pos_ += sizeof(T);
  return static_cast<T>(v);
}

uint8_t WireReader::u8(std::string_view field) { return fixed<uint8_t>(field); }
uint16_t WireReader::u16(std::string_view field) { return fixed<uint16_t>(field); }
uint32_t WireReader::u32(std::string_view field) { return fixed<uint32_t>(field); }
uint64_t WireReader::u64(std::string_view field) { return fixed<uint64_t>(field); }
int32_t WireReader::i32(std::string_view field) { return static_cast<int32_t>(fixed<uint32_t>(field)); }
int64_t WireReader::i64(std::string_view field) { return static_cast<int64_t>(fixed<uint64_t>(field)); }

bool WireReader::boolean(std::string_view field) {
  const uint8_t b = u8(field);
  if (b > 1) fail(field, fmt::format("bool byte {} is neither 0 nor 1", int(b)));
  return b == 1;
}

size_t WireReader::count(std::string_view field, uint64_t max, size_t min_elem_bytes) {
  const uint64_t n = u64(field);
  // The maximum first (it bounds the product below), then the bytes actually there: a lying
  // count never reaches an allocation.
  if (n > max) fail(field, fmt::format("length {} exceeds the {} allowed", n, max));
  if (min_elem_bytes > 0 && n > remaining() / min_elem_bytes)
    fail(field, fmt::format("length {} needs {} bytes, {} left", n, n * min_elem_bytes, remaining()));
  return static_cast<size_t>(n);
}

std::string WireReader::str(std::string_view field, uint64_t max_len) {
  const size_t n = count(field, max_len, 1);
  std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
  pos_ += n;
  return s;
}

std::vector<int32_t> WireReader::i32s(std::string_view field, uint64_t max_count) {
  const size_t n = count(field, max_count, 4);
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i32(field);
  return v;
}

std::vector<uint64_t> WireReader::u64s(std::string_view field, uint64_t max_count) {
  const size_t n = count(field, max_count, 8);
  std::vector<uint64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = u64(field);
  return v;
}

std::vector<uint8_t> WireReader::blob(std::string_view field, uint64_t max_len) {
  const size_t n = count(field, max_len, 1);
  std::vector<uint8_t> v(bytes_.begin() + static_cast<ptrdiff_t>(pos_),
                         bytes_.begin() + static_cast<ptrdiff_t>(pos_ + n));
  pos_ += n;
  return v;
}

std::span<const uint8_t> WireReader::bytes(std::string_view field, size_t n) {
  if (remaining() < n) fail(field, fmt::format("needs {} bytes, {} left", n, remaining()));
  const auto s = bytes_.subspan(pos_, n);
  pos_ += n;
  return s;
}

void WireReader::finish() const {
  if (remaining() != 0) throw WireError(fmt::format("{}: {} trailing bytes", message_, remaining()));
}

// ---- frames ----

uint64_t payload_checksum(std::span<const uint8_t> payload) { return XXH3_64bits(payload.data(), payload.size()); }

std::array<uint8_t, kHeaderBytes> encode_header(MsgType type, std::span<const uint8_t> payload) {
  WireWriter w;
  w.u32(kFrameMagic);
  w.u16(static_cast<uint16_t>(type));
  w.u16(0);
  w.u64(payload.size());
  w.u64(payload_checksum(payload));
  std::array<uint8_t, kHeaderBytes> h{};
  std::memcpy(h.data(), w.buffer().data(), kHeaderBytes);
  return h;
}

std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> payload) {
  const auto h = encode_header(type, payload);
  // Sized once and copied into (reserve + insert trips gcc 12's -Wstringop-overflow).
  std::vector<uint8_t> f(kHeaderBytes + payload.size());
  std::copy(h.begin(), h.end(), f.begin());
  std::copy(payload.begin(), payload.end(), f.begin() + kHeaderBytes);
  return f;
}

FrameHeader parse_header(std::span<const uint8_t, kHeaderBytes> bytes, uint64_t max_payload) {
  WireReader r(bytes, "frame");
  const uint32_t magic = r.u32("magic");
  if (magic != kFrameMagic) r.fail("magic", fmt::format("{:#010x} is not TDK1", magic));
  FrameHeader h;
  const uint16_t type = r.u16("type");
  if (type < kMinMsgType || type > kMaxMsgType) r.fail("type", fmt::format("{} is not a message type", type));
  h.type = static_cast<MsgType>(type);
  const uint16_t flags = r.u16("flags");
  if (flags != 0) r.fail("flags", fmt::format("{} must be 0", flags));
  h.payload_len = r.u64("payload_len");
  if (h.payload_len > max_payload)
    r.fail("payload_len", fmt::format("{} exceeds the {} allowed", h.payload_len, max_payload));
  h.checksum = r.u64("checksum");
  return h;
}

void check_payload(const FrameHeader& h, std::span<const uint8_t> payload) {
  if (payload.size() != h.payload_len)
    throw WireError(fmt::format("frame.payload: {} bytes, the header says {}", payload.size(), h.payload_len));
  const uint64_t sum = payload_checksum(payload);
  if (sum != h.checksum)
    throw WireError(fmt::format("frame.checksum: mismatch on a {} payload of {} bytes (corrupt in transit?)",
                                msg_type_name(h.type), h.payload_len));
}

Frame decode_frame(std::span<const uint8_t> bytes, uint64_t max_payload) {
  if (bytes.size() < kHeaderBytes)
    throw WireError(fmt::format("frame.header: needs {} bytes, {} left", kHeaderBytes, bytes.size()));
  const FrameHeader h = parse_header(bytes.first<kHeaderBytes>(), max_payload);
  const auto rest = bytes.subspan(kHeaderBytes);
  if (rest.size() < h.payload_len)
    throw WireError(
        fmt::format("frame.payload: length {} needs {} bytes, {} left", h.payload_len, h.payload_len, rest.size()));
  if (rest.size() > h.payload_len)
    throw WireError(fmt::format("frame: {} trailing bytes", rest.size() - h.payload_len));
  check_payload(h, rest);
  return Frame{h.type, std::vector<uint8_t>(rest.begin(), rest.end())};
}

// ---- messages ----

// Each message's fields are written down once, in order, by a `fields(io, m)` visitor: the
// encoder, the size of the encoding and the decoder are all derived from it, so the two sides
// cannot drift. A field is `io(name, value)`, then for a string or a vector its maximum count,
// then optionally a check: the error text for a bad value (empty: good), which only the decoder
// applies (what is sent was built here). A vector's check applies to each element, and names it
// "field[j]". Step is the one message written by hand (encode_step, decode_step below): its two
// sides are not mirror images (a plan goes out, a plan with its tables comes back, the prefill
// flags are derived from the plan's counts, and each seq is checked against the ones before).
namespace {

// The error text of a negative value.
std::string if_negative(int64_t v) { return v < 0 ? fmt::format("{} is negative", v) : std::string(); }

template <class T>
constexpr bool kIsVector = false;
template <class T>
constexpr bool kIsVector<std::vector<T>> = true;
template <class T>
constexpr bool kIsArray = false;
template <size_t N>
constexpr bool kIsArray<std::array<uint8_t, N>> = true;

// The bytes of a field's encoding (wire.h: fixed-size little-endian integers; a u64 count, then
// the elements; a fixed array as its bytes).
template <class T>
uint64_t wire_size(const T& v) {
  if constexpr (std::is_same_v<T, std::string> || kIsVector<T>)
    return 8 + uint64_t(v.size()) * sizeof(typename T::value_type);
  else if constexpr (kIsArray<T>)
    return v.size();
  else
    return sizeof(T);
}

// Sums the bytes of every field, so that the writer allocates once (a KvPush carries blocks).
struct FieldSizer {
  static constexpr bool kDecoding = false;
  uint64_t bytes = 0;
  template <class T, class... Rest>
  void operator()(std::string_view, const T& v, const Rest&...) {
    bytes += wire_size(v);
  }
};

struct FieldWriter {
  static constexpr bool kDecoding = false;
  WireWriter& w;
  template <class T, class... Rest>
  void operator()(std::string_view, const T& v, const Rest&...) {
    if constexpr (std::is_same_v<T, bool>)
      w.boolean(v);
    else if constexpr (std::is_enum_v<T>)
      (*this)({}, static_cast<std::underlying_type_t<T>>(v));
    else if constexpr (std::is_same_v<T, uint8_t>)
      w.u8(v);
    else if constexpr (std::is_same_v<T, uint16_t>)
      w.u16(v);
    else if constexpr (std::is_same_v<T, uint32_t>)
      w.u32(v);
    else if constexpr (std::is_same_v<T, uint64_t>)
      w.u64(v);
    else if constexpr (std::is_same_v<T, int32_t>)
      w.i32(v);
    else if constexpr (std::is_same_v<T, int64_t>)
      w.i64(v);
    else if constexpr (std::is_same_v<T, std::string>)
      w.str(v);
    else if constexpr (std::is_same_v<T, std::vector<int32_t>>)
      w.i32s(v);
    else if constexpr (std::is_same_v<T, std::vector<uint64_t>>)
      w.u64s(v);
    else if constexpr (std::is_same_v<T, std::vector<uint8_t>>)
      w.blob(v);
    else if constexpr (kIsArray<T>)
      w.bytes(v);
    else
      static_assert(sizeof(T) == 0, "a field type the wire does not carry");
  }
};

struct FieldReader {
  static constexpr bool kDecoding = true;
  WireReader& r;
  bool ended_early = false;  // the message ends before its last field (an older Hello)

  // A fixed-size field, optionally checked.
  template <class T>
  void operator()(std::string_view field, T& v) {
    v = read<T>(field);
  }
  template <class T, class Check>
  requires std::invocable<Check, const T&>
  void operator()(std::string_view field, T& v, const Check& check) {
    v = read<T>(field);
    if (const std::string bad = check(v); !bad.empty()) r.fail(field, bad);
  }
  // A string or a vector of at most `max` elements, optionally each checked.
  template <class T>
  void operator()(std::string_view field, T& v, uint64_t max) {
    if constexpr (std::is_same_v<T, std::string>)
      v = r.str(field, max);
    else if constexpr (std::is_same_v<T, std::vector<int32_t>>)
      v = r.i32s(field, max);
    else if constexpr (std::is_same_v<T, std::vector<uint64_t>>)
      v = r.u64s(field, max);
    else if constexpr (std::is_same_v<T, std::vector<uint8_t>>)
      v = r.blob(field, max);
    else
      static_assert(sizeof(T) == 0, "a counted field type the wire does not carry");
  }
  template <class T, class Check>
  void operator()(std::string_view field, T& v, uint64_t max, const Check& check) {
    (*this)(field, v, max);
    for (size_t j = 0; j < v.size(); ++j)
      if (const std::string bad = check(v[j]); !bad.empty()) r.fail(fmt::format("{}[{}]", field, j), bad);
  }
  void end_here() { ended_early = true; }

 private:
  template <class T>
  T read(std::string_view field) {
    if constexpr (std::is_same_v<T, bool>)
      return r.boolean(field);
    else if constexpr (std::is_enum_v<T>)
      return static_cast<T>(read<std::underlying_type_t<T>>(field));
    else if constexpr (std::is_same_v<T, uint8_t>)
      return r.u8(field);
    else if constexpr (std::is_same_v<T, uint16_t>)
      return r.u16(field);
    else if constexpr (std::is_same_v<T, uint32_t>)
      return r.u32(field);
    else if constexpr (std::is_same_v<T, uint64_t>)
      return r.u64(field);
    else if constexpr (std::is_same_v<T, int32_t>)
      return r.i32(field);
    else if constexpr (std::is_same_v<T, int64_t>)
      return r.i64(field);
    else if constexpr (kIsArray<T>) {
      T a{};
      const auto b = r.bytes(field, a.size());
      std::copy(b.begin(), b.end(), a.begin());
      return a;
    } else {
      static_assert(sizeof(T) == 0, "a field type the wire does not carry");
    }
  }
};

// Each count within [0, 2^20]: a layout is compared with the receiver's own before it is used,
// but no field may make block_bytes() overflow on the way.
template <class Io>
void layout_fields(Io& io, std::string_view field, KvLayout& l) {
  const std::string f(field);
  io(f + ".model", l.model, kMaxShortString);
  io(f + ".weights", l.weights, kMaxShortString);
  io(f + ".dtype", l.dtype, kMaxShortString);
  io(f + ".order", l.order, kMaxShortString);
  const auto in_range = [](int32_t v) {
    return v < 0 || v > (1 << 20) ? fmt::format("{} is outside [0, 2^20]", v) : std::string();
  };
  for (auto [v, name] : {std::pair{&l.block_size, "block_size"},
                         {&l.layers, "layers"},
                         {&l.kv_heads, "kv_heads"},
                         {&l.head_dim, "head_dim"},
                         {&l.tp, "tp"}})
    io(f + "." + name, *v, in_range);
}

template <class Io>
void fields(Io& io, HelloMsg& m) {
  io("protocol", m.protocol);
  // An older client's Hello ends here: say so, rather than fail on a missing field.
  if constexpr (Io::kDecoding)
    if (m.protocol != kProtocolVersion) return io.end_here();
  io("workload_yaml", m.workload_yaml, kMaxWorkloadYaml);
  layout_fields(io, "prefill_layout", m.prefill_layout);
}

template <class Io>
void fields(Io& io, HelloOkMsg& m) {
  io("kv_blocks", m.kv_blocks, if_negative);
  io("block_bytes", m.block_bytes, if_negative);
  io("backend", m.backend, kMaxShortString);
  layout_fields(io, "decode_layout", m.decode_layout);
  io("idle_timeout_ms", m.idle_timeout_ms);
}

template <class Io>
void fields(Io& io, ChallengeMsg& m) {
  io("nonce", m.nonce);
}

template <class Io>
void fields(Io& io, ProofMsg& m) {
  io("mac", m.mac);
}

template <class Io>
void fields(Io& io, StepReplyMsg& m) {
  io("step", m.step);
  io("elapsed_ns", m.elapsed_ns, if_negative);
  io("sampled", m.sampled, kMaxStepSeqs, if_negative);
  io("error", m.error, kMaxErrorString);
}

template <class Io>
void fields(Io& io, KvPushMsg& m) {
  io("ticket", m.ticket);
  io("request", m.request);
  io("num_tokens", m.num_tokens);
  io("dst_blocks", m.dst_blocks, kMaxBlockTable);
  io("block_checksums", m.block_checksums, kMaxBlockTable);
  io("payload", m.payload, kMaxKvPayload);
}

template <class Io>
void fields(Io& io, KvAckMsg& m) {
  io("ticket", m.ticket);
  io("status", m.status, [](KvAckStatus s) {
    return s > KvAckStatus::Corrupt
               ? fmt::format("{} is not a status (0 written, 1 failed, 2 corrupt)", static_cast<int>(s))
               : std::string();
  });
  io("blocks_written", m.blocks_written, if_negative);
  io("digest", m.digest);
  io("error", m.error, kMaxErrorString);
}

template <class Io>
void fields(Io&, ByeMsg&) {}

template <class Io>
void fields(Io& io, ErrorMsg& m) {
  io("message", m.message, kMaxErrorString);
}

template <class Io>
void fields(Io&, PingMsg&) {}

template <class Msg>
std::vector<uint8_t> encode_fields(const Msg& m) {
  // The visitors take the message by non-const reference for the decoder's sake; the sizer and
  // the writer only read it.
  Msg& fields_of = const_cast<Msg&>(m);
  FieldSizer size;
  fields(size, fields_of);
  WireWriter w;
  w.buffer().reserve(size.bytes);
  FieldWriter write{w};
  fields(write, fields_of);
  return w.take();
}

// The message's name in its errors is its type's ("KvPush.dst_blocks: ...").
template <class Msg>
Msg decode_fields(std::span<const uint8_t> payload) {
  WireReader r(payload, msg_type_name(Msg::kType));
  FieldReader read{r};
  Msg m;
  fields(read, m);
  if (!read.ended_early) r.finish();
  return m;
}

}  // namespace

std::vector<uint8_t> encode(const HelloMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const HelloOkMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const ChallengeMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const ProofMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const StepReplyMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const KvPushMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const KvAckMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const ByeMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const ErrorMsg& m) { return encode_fields(m); }
std::vector<uint8_t> encode(const PingMsg& m) { return encode_fields(m); }

HelloMsg decode_hello(std::span<const uint8_t> payload) { return decode_fields<HelloMsg>(payload); }
HelloOkMsg decode_hello_ok(std::span<const uint8_t> payload) { return decode_fields<HelloOkMsg>(payload); }
ChallengeMsg decode_challenge(std::span<const uint8_t> payload) { return decode_fields<ChallengeMsg>(payload); }
ProofMsg decode_proof(std::span<const uint8_t> payload) { return decode_fields<ProofMsg>(payload); }
StepReplyMsg decode_step_reply(std::span<const uint8_t> payload) { return decode_fields<StepReplyMsg>(payload); }
KvPushMsg decode_kv_push(std::span<const uint8_t> payload) { return decode_fields<KvPushMsg>(payload); }
KvAckMsg decode_kv_ack(std::span<const uint8_t> payload) { return decode_fields<KvAckMsg>(payload); }
ByeMsg decode_bye(std::span<const uint8_t> payload) { return decode_fields<ByeMsg>(payload); }
ErrorMsg decode_error(std::span<const uint8_t> payload) { return decode_fields<ErrorMsg>(payload); }
PingMsg decode_ping(std::span<const uint8_t> payload) { return decode_fields<PingMsg>(payload); }

// ---- Step, by hand (above: why) ----

std::vector<uint8_t> encode_step(uint64_t step, const StepPlan& plan) {
  const size_t n = plan.seqs.size();
  if (plan.num_prefill_seqs < 0 || plan.num_decode_seqs < 0 ||
      size_t(plan.num_prefill_seqs) + size_t(plan.num_decode_seqs) != n)
    throw std::invalid_argument(fmt::format("encode_step: {} prefills + {} decodes for {} seqs", plan.num_prefill_seqs,
                                            plan.num_decode_seqs, n));
  if (!plan.tokens.empty() && plan.tokens.size() != size_t(plan.num_tokens))
    throw std::invalid_argument(
        fmt::format("encode_step: {} tokens for a plan of {}", plan.tokens.size(), plan.num_tokens));
  WireWriter w;
  w.u64(step);
  w.boolean(plan.after_idle);
  w.i32(plan.num_tokens);
  w.u64(n);
  const size_t first_prefill = n - size_t(plan.num_prefill_seqs);
  for (size_t i = 0; i < n; ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    w.i32(s.id);
    w.i32(s.num_tokens);
    w.i32(s.num_computed_before);
    w.boolean(s.samples);
    w.boolean(i >= first_prefill);
    w.i32s(s.block_table);
  }
  w.i32s(plan.tokens);
  return w.take();
}

DecodedStep decode_step(std::span<const uint8_t> payload) {
  WireReader r(payload, "Step");
  DecodedStep d;
  d.step = r.u64("step");
  d.plan.after_idle = r.boolean("after_idle");
  const int32_t total = r.i32("num_tokens");
  if (total < 0) r.fail("num_tokens", fmt::format("{} is negative", total));
  const size_t n = r.count("seqs", kMaxStepSeqs, kMinSeqBytes);
  d.plan.seqs.reserve(n);
  d.tables.reserve(n);  // no reallocation: the spans below point into these vectors' buffers
  int64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    ScheduledSeq s;
    s.id = r.i32("seqs.id");
    s.num_tokens = r.i32("seqs.num_tokens");
    s.num_computed_before = r.i32("seqs.num_computed_before");
    s.samples = r.boolean("seqs.samples");
    const bool prefill = r.boolean("seqs.prefill");
    // The seq's index goes into the field name only on the way to an error.
    const auto bad = [&](std::string_view field, const std::string& what) {
      r.fail(fmt::format("seqs[{}]{}", i, field), what);
    };
    if (s.id < 0) bad(".id", fmt::format("{} is negative", s.id));
    if (s.num_tokens < 1) bad(".num_tokens", fmt::format("{} is not >= 1", s.num_tokens));
    if (s.num_computed_before < 0) bad(".num_computed_before", fmt::format("{} is negative", s.num_computed_before));
    if (int64_t{s.num_computed_before} + s.num_tokens > INT32_MAX)
      bad("",
          fmt::format("num_computed_before {} + num_tokens {} overflows int32", s.num_computed_before, s.num_tokens));
    sum += s.num_tokens;
    if (sum > total) bad(".num_tokens", fmt::format("the seqs' tokens exceed the step's {}", total));
    d.tables.push_back(r.i32s("seqs.block_table", kMaxBlockTable));
    const std::vector<int32_t>& table = d.tables.back();
    for (size_t j = 0; j < table.size(); ++j)
      if (table[j] < 0) bad(fmt::format(".block_table[{}]", j), fmt::format("{} is negative", table[j]));
    s.block_table = table;
    // StepPlan::add counts a prefill by num_computed_before < prompt_len: any prompt_len that
    // gives the flag's answer will do (num_computed_before + 1 cannot overflow, checked above).
    d.plan.add(s, prefill ? s.num_computed_before + 1 : s.num_computed_before);
  }
  if (sum != total) r.fail("num_tokens", fmt::format("{} but the seqs' add up to {}", total, sum));
  std::vector<ReqId> ids;
  ids.reserve(n);
  for (const ScheduledSeq& s : d.plan.seqs) ids.push_back(s.id);
  std::sort(ids.begin(), ids.end());
  if (const auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    r.fail("seqs", fmt::format("request {} appears twice", *dup));
  d.plan.tokens = r.i32s("tokens", kMaxStepTokens);
  if (!d.plan.tokens.empty() && d.plan.tokens.size() != size_t(total))
    r.fail("tokens", fmt::format("{} tokens for a step of {} (none, or one per token)", d.plan.tokens.size(), total));
  for (size_t j = 0; j < d.plan.tokens.size(); ++j)
    if (d.plan.tokens[j] < 0) r.fail(fmt::format("tokens[{}]", j), fmt::format("{} is negative", d.plan.tokens[j]));
  r.finish();
  return d;
}

void check_block_ids(const DecodedStep& m, int32_t num_blocks) {
  for (size_t i = 0; i < m.plan.seqs.size(); ++i) {
    const ScheduledSeq& s = m.plan.seqs[i];
    for (size_t j = 0; j < s.block_table.size(); ++j)
      if (s.block_table[j] < 0 || s.block_table[j] >= num_blocks)
        throw WireError(
            fmt::format("Step.seqs[{}] (request {}): block {} at table index {} is outside the pool of {} blocks", i,
                        s.id, s.block_table[j], j, num_blocks));
  }
}

void check_table_lengths(const DecodedStep& m, int32_t block_size) {
  if (block_size < 1) throw std::invalid_argument(fmt::format("check_table_lengths: block size {}", block_size));
  for (size_t i = 0; i < m.plan.seqs.size(); ++i) {
    const ScheduledSeq& s = m.plan.seqs[i];
    const int64_t tokens = int64_t{s.num_computed_before} + s.num_tokens;
    const int64_t needed = (tokens + block_size - 1) / block_size;
    if (int64_t(s.block_table.size()) < needed)
      throw WireError(fmt::format("Step.seqs[{}] (request {}): block table of {} blocks for {} tokens needs {}", i,
                                  s.id, s.block_table.size(), tokens, needed));
  }
}

void check_kv_push(const KvPushMsg& m, int32_t num_blocks, int64_t block_bytes, int32_t block_size) {
  if (block_bytes < 1 || block_size < 1)
    throw std::invalid_argument(fmt::format("check_kv_push: block of {} bytes, {} tokens", block_bytes, block_size));
  const std::string at = fmt::format("KvPush (ticket {}, request {})", m.ticket, m.request);
  if (m.request < 0) throw WireError(fmt::format("{}.request: negative", at));
  const size_t n = m.dst_blocks.size();
  if (n == 0) throw WireError(fmt::format("{}.dst_blocks: empty", at));
  for (size_t j = 0; j < n; ++j)
    if (m.dst_blocks[j] < 0 || m.dst_blocks[j] >= num_blocks)
      throw WireError(fmt::format("{}.dst_blocks[{}]: block {} is outside the pool of {} blocks", at, j,
                                  m.dst_blocks[j], num_blocks));
  std::vector<int32_t> sorted = m.dst_blocks;
  std::sort(sorted.begin(), sorted.end());
  if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
    throw WireError(fmt::format("{}.dst_blocks: block {} appears twice", at, *dup));
  if (m.block_checksums.size() != n)
    throw WireError(fmt::format("{}.block_checksums: {} for {} blocks", at, m.block_checksums.size(), n));
  // n <= kMaxBlockTable, but the vector may have been built locally: divide, do not multiply.
  if (uint64_t(block_bytes) > uint64_t(INT64_MAX) / n || m.payload.size() != uint64_t(block_bytes) * n)
    throw WireError(
        fmt::format("{}.payload: {} bytes for {} blocks of {} bytes", at, m.payload.size(), n, block_bytes));
  if (m.num_tokens < 1 || int64_t{m.num_tokens} > int64_t(n) * block_size)
    throw WireError(fmt::format("{}.num_tokens: {} is outside (0, {}] for {} blocks of {} tokens", at, m.num_tokens,
                                int64_t(n) * block_size, n, block_size));
}

std::string_view to_string(KvAckStatus s) {
  switch (s) {
    case KvAckStatus::Written: return "written";
    case KvAckStatus::Failed: return "failed";
    case KvAckStatus::Corrupt: return "corrupt";
  }
  return "unknown";
}

std::vector<uint64_t> block_checksums(std::span<const uint8_t> bytes, int64_t block_bytes) {
  if (block_bytes < 1 || bytes.size() % uint64_t(block_bytes) != 0)
    throw std::invalid_argument(
        fmt::format("block_checksums: {} bytes are not whole blocks of {} bytes", bytes.size(), block_bytes));
  const size_t bb = size_t(block_bytes), n = bytes.size() / bb;
  std::vector<uint64_t> sums(n);
  for (size_t i = 0; i < n; ++i) sums[i] = XXH3_64bits(bytes.data() + i * bb, bb);
  return sums;
}

uint64_t blocks_digest(std::span<const uint64_t> checksums) {
  WireWriter w;
  w.buffer().reserve(8 * checksums.size());
  for (uint64_t c : checksums) w.u64(c);
  return XXH3_64bits(w.buffer().data(), w.buffer().size());
}

}  // namespace tandem::transfer
