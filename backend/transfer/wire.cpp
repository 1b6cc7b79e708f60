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

namespace {

void write_layout(WireWriter& w, const KvLayout& l) {
  w.str(l.model);
  w.str(l.weights);
  w.str(l.dtype);
  w.str(l.order);
  for (int32_t v : {l.block_size, l.layers, l.kv_heads, l.head_dim, l.tp}) w.i32(v);
}

// Each count within [0, 2^20]: a layout is compared with the receiver's own before it is used,
// but no field may make block_bytes() overflow on the way.
KvLayout read_layout(WireReader& r, std::string_view field) {
  KvLayout l;
  const std::string f(field);
  l.model = r.str(f + ".model", kMaxShortString);
  l.weights = r.str(f + ".weights", kMaxShortString);
  l.dtype = r.str(f + ".dtype", kMaxShortString);
  l.order = r.str(f + ".order", kMaxShortString);
  for (auto [v, name] : {std::pair{&l.block_size, "block_size"}, {&l.layers, "layers"}, {&l.kv_heads, "kv_heads"},
                         {&l.head_dim, "head_dim"}, {&l.tp, "tp"}}) {
    *v = r.i32(f + "." + name);
    if (*v < 0 || *v > (1 << 20)) r.fail(f + "." + name, fmt::format("{} is outside [0, 2^20]", *v));
  }
  return l;
}

}  // namespace

std::vector<uint8_t> encode(const HelloMsg& m) {
  WireWriter w;
  w.u32(m.protocol);
  w.str(m.workload_yaml);
  write_layout(w, m.prefill_layout);
  return w.take();
}

HelloMsg decode_hello(std::span<const uint8_t> payload) {
  WireReader r(payload, "Hello");
  HelloMsg m;
  m.protocol = r.u32("protocol");
  // An older client's Hello ends here: say so, rather than fail on a missing field.
  if (m.protocol != kProtocolVersion) return m;
  m.workload_yaml = r.str("workload_yaml", kMaxWorkloadYaml);
  m.prefill_layout = read_layout(r, "prefill_layout");
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const HelloOkMsg& m) {
  WireWriter w;
  w.i32(m.kv_blocks);
  w.i64(m.block_bytes);
  w.str(m.backend);
  write_layout(w, m.decode_layout);
  w.u32(m.idle_timeout_ms);
  return w.take();
}

HelloOkMsg decode_hello_ok(std::span<const uint8_t> payload) {
  WireReader r(payload, "HelloOk");
  HelloOkMsg m;
  m.kv_blocks = r.i32("kv_blocks");
  if (m.kv_blocks < 0) r.fail("kv_blocks", fmt::format("{} is negative", m.kv_blocks));
  m.block_bytes = r.i64("block_bytes");
  if (m.block_bytes < 0) r.fail("block_bytes", fmt::format("{} is negative", m.block_bytes));
  m.backend = r.str("backend", kMaxShortString);
  m.decode_layout = read_layout(r, "decode_layout");
  m.idle_timeout_ms = r.u32("idle_timeout_ms");
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const ChallengeMsg& m) {
  WireWriter w;
  w.bytes(m.nonce);
  return w.take();
}

ChallengeMsg decode_challenge(std::span<const uint8_t> payload) {
  WireReader r(payload, "Challenge");
  ChallengeMsg m;
  const auto b = r.bytes("nonce", m.nonce.size());
  std::copy(b.begin(), b.end(), m.nonce.begin());
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const ProofMsg& m) {
  WireWriter w;
  w.bytes(m.mac);
  return w.take();
}

ProofMsg decode_proof(std::span<const uint8_t> payload) {
  WireReader r(payload, "Proof");
  ProofMsg m;
  const auto b = r.bytes("mac", m.mac.size());
  std::copy(b.begin(), b.end(), m.mac.begin());
  r.finish();
  return m;
}

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

std::vector<uint8_t> encode(const StepReplyMsg& m) {
  WireWriter w;
  w.u64(m.step);
  w.i64(m.elapsed_ns);
  w.i32s(m.sampled);
  w.str(m.error);
  return w.take();
}

StepReplyMsg decode_step_reply(std::span<const uint8_t> payload) {
  WireReader r(payload, "StepReply");
  StepReplyMsg m;
  m.step = r.u64("step");
  m.elapsed_ns = r.i64("elapsed_ns");
  if (m.elapsed_ns < 0) r.fail("elapsed_ns", fmt::format("{} is negative", m.elapsed_ns));
  m.sampled = r.i32s("sampled", kMaxStepSeqs);
  for (size_t j = 0; j < m.sampled.size(); ++j)
    if (m.sampled[j] < 0) r.fail(fmt::format("sampled[{}]", j), fmt::format("{} is negative", m.sampled[j]));
  m.error = r.str("error", kMaxErrorString);
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const KvPushMsg& m) {
  WireWriter w;
  w.buffer().reserve(8 + 4 + 4 + 8 + 4 * m.dst_blocks.size() + 8 + 8 * m.block_checksums.size() + 8 + m.payload.size());
  w.u64(m.ticket);
  w.i32(m.request);
  w.i32(m.num_tokens);
  w.i32s(m.dst_blocks);
  w.u64s(m.block_checksums);
  w.blob(m.payload);
  return w.take();
}

KvPushMsg decode_kv_push(std::span<const uint8_t> payload) {
  WireReader r(payload, "KvPush");
  KvPushMsg m;
  m.ticket = r.u64("ticket");
  m.request = r.i32("request");
  m.num_tokens = r.i32("num_tokens");
  m.dst_blocks = r.i32s("dst_blocks", kMaxBlockTable);
  m.block_checksums = r.u64s("block_checksums", kMaxBlockTable);
  m.payload = r.blob("payload", kMaxKvPayload);
  r.finish();
  return m;
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

std::vector<uint8_t> encode(const KvAckMsg& m) {
  WireWriter w;
  w.u64(m.ticket);
  w.u8(static_cast<uint8_t>(m.status));
  w.i32(m.blocks_written);
  w.u64(m.digest);
  w.str(m.error);
  return w.take();
}

KvAckMsg decode_kv_ack(std::span<const uint8_t> payload) {
  WireReader r(payload, "KvAck");
  KvAckMsg m;
  m.ticket = r.u64("ticket");
  const uint8_t status = r.u8("status");
  if (status > static_cast<uint8_t>(KvAckStatus::Corrupt))
    r.fail("status", fmt::format("{} is not a status (0 written, 1 failed, 2 corrupt)", int(status)));
  m.status = static_cast<KvAckStatus>(status);
  m.blocks_written = r.i32("blocks_written");
  if (m.blocks_written < 0) r.fail("blocks_written", fmt::format("{} is negative", m.blocks_written));
  m.digest = r.u64("digest");
  m.error = r.str("error", kMaxErrorString);
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const ByeMsg&) { return {}; }

ByeMsg decode_bye(std::span<const uint8_t> payload) {
  WireReader(payload, "Bye").finish();
  return {};
}

std::vector<uint8_t> encode(const ErrorMsg& m) {
  WireWriter w;
  w.str(m.message);
  return w.take();
}

ErrorMsg decode_error(std::span<const uint8_t> payload) {
  WireReader r(payload, "Error");
  ErrorMsg m;
  m.message = r.str("message", kMaxErrorString);
  r.finish();
  return m;
}

std::vector<uint8_t> encode(const PingMsg&) { return {}; }

PingMsg decode_ping(std::span<const uint8_t> payload) {
  WireReader(payload, "Ping").finish();
  return {};
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
