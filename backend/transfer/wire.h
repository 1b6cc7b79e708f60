// The prefill/decode channel's wire format: frames and the messages they carry. Nothing read
// from the wire is trusted (DESIGN.md, stage 4): every length is checked against the bytes
// left and a per-field maximum before anything is allocated, a frame's payload against its
// checksum, and block ids against the pool by check_block_ids/check_kv_push before use. A
// decoder either returns a well-formed message or throws WireError naming the field.
//
// Integers are little-endian. Strings and vectors are a u64 count, then the elements.
// A frame: magic 'T','D','K','1' (u32), type (u16), flags (u16, 0), payload length (u64),
// XXH3-64 of the payload (u64), then the payload.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/transfer/kv_layout.h"
#include "policies/plan.h"

namespace tandem::transfer {

// A malformed frame or message. Its message names the field ("KvPush.dst_blocks: ...").
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class MsgType : uint16_t {
  Hello = 1,
  HelloOk,
  Challenge,
  Proof,
  Step,
  StepReply,
  KvPush,
  KvAck,
  Bye,
  Error,
  Ping
};
inline constexpr uint16_t kMinMsgType = 1;
inline constexpr uint16_t kMaxMsgType = 11;
// "Hello", "KvPush", ...; "unknown" for a value outside the enum.
std::string_view msg_type_name(MsgType t);

// Appends fields to a byte buffer.
class WireWriter {
 public:
  void u8(uint8_t v);
  void u16(uint16_t v);
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i32(int32_t v);
  void i64(int64_t v);
  void boolean(bool v);
  void str(std::string_view s);            // u64 length, then the bytes
  void i32s(std::span<const int32_t> v);   // u64 count, then the elements
  void u64s(std::span<const uint64_t> v);  // u64 count, then the elements
  void blob(std::span<const uint8_t> v);   // u64 length, then the bytes
  void bytes(std::span<const uint8_t> v);  // the bytes alone (fixed-size fields)
  std::vector<uint8_t>& buffer() { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads fields from a span. Every read checks the bytes left; every count is checked against
// the bytes left and against `max` before the result is allocated. Errors read
// "<message>.<field>: ...".
class WireReader {
 public:
  WireReader(std::span<const uint8_t> bytes, std::string_view message) : bytes_(bytes), message_(message) {}
  uint8_t u8(std::string_view field);
  uint16_t u16(std::string_view field);
  uint32_t u32(std::string_view field);
  uint64_t u64(std::string_view field);
  int32_t i32(std::string_view field);
  int64_t i64(std::string_view field);
  bool boolean(std::string_view field);  // 0 or 1; any other byte is an error (one encoding per value)
  std::string str(std::string_view field, uint64_t max_len);
  std::vector<int32_t> i32s(std::string_view field, uint64_t max_count);
  std::vector<uint64_t> u64s(std::string_view field, uint64_t max_count);
  std::vector<uint8_t> blob(std::string_view field, uint64_t max_len);
  std::span<const uint8_t> bytes(std::string_view field, size_t n);
  // A u64 count of elements of at least min_elem_bytes each, checked against max and the
  // bytes left.
  size_t count(std::string_view field, uint64_t max, size_t min_elem_bytes);
  size_t remaining() const { return bytes_.size() - pos_; }
  // The message must end here: trailing bytes are an error.
  void finish() const;
  [[noreturn]] void fail(std::string_view field, std::string_view what) const;

 private:
  template <class T>
  T fixed(std::string_view field);
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  std::string_view message_;
};

// ---- frames ----

inline constexpr uint32_t kFrameMagic = 0x314B4454;  // 'T','D','K','1' in wire (little-endian) order
inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint64_t kDefaultMaxPayload = uint64_t{4} << 30;

struct FrameHeader {
  MsgType type = MsgType::Hello;
  uint64_t payload_len = 0;
  uint64_t checksum = 0;
};

struct Frame {
  MsgType type = MsgType::Hello;
  std::vector<uint8_t> payload;
};

uint64_t payload_checksum(std::span<const uint8_t> payload);
// The header for this payload (with its checksum): sent before the payload, which need not
// be copied next to it.
std::array<uint8_t, kHeaderBytes> encode_header(MsgType type, std::span<const uint8_t> payload);
std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> payload);
// Throws WireError on a bad magic, an unknown type, nonzero flags or a length over max_payload,
// so a receiver knows the header is sound before it reads (or allocates for) the payload.
FrameHeader parse_header(std::span<const uint8_t, kHeaderBytes> bytes, uint64_t max_payload);
// Throws WireError unless the payload has the header's length and checksum.
void check_payload(const FrameHeader& header, std::span<const uint8_t> payload);
// Exactly one frame: throws on truncation, trailing bytes, or anything parse_header or
// check_payload reject.
Frame decode_frame(std::span<const uint8_t> bytes, uint64_t max_payload);

// ---- messages: encode(x) is the payload; decode_x(payload) rejects truncation and trailing bytes ----

// 2: Hello and HelloOk carry each side's KV layout (kv_layout.h).
// 3: HelloOk carries the worker's idle timeout (the client pings within it); KvPush carries a
//    checksum per block of the sender's KV, KvAck a status, the blocks written and a digest of
//    what the worker read back from them; Ping.
inline constexpr uint32_t kProtocolVersion = 3;
inline constexpr uint64_t kMaxWorkloadYaml = uint64_t{16} << 20;
inline constexpr uint64_t kMaxShortString = 4096;   // backend names
inline constexpr uint64_t kMaxErrorString = 65536;  // error texts
inline constexpr uint64_t kMaxStepSeqs = 65536;
inline constexpr uint64_t kMaxBlockTable = uint64_t{1} << 24;  // blocks per sequence (and per push)
inline constexpr uint64_t kMaxStepTokens = INT32_MAX;          // a plan's token total is an int32
inline constexpr uint64_t kMaxKvPayload = uint64_t{1} << 40;   // the frame's limit binds first

// The client's first message: the decode instance to build, and how the prefill side's KV
// blocks (what KvPush carries) are laid out.
struct HelloMsg {
  static constexpr MsgType kType = MsgType::Hello;
  uint32_t protocol = kProtocolVersion;
  std::string workload_yaml;
  KvLayout prefill_layout;
  bool operator==(const HelloMsg&) const = default;
};

// The worker built it: its pool, and how its blocks are laid out (the client checks the two
// layouts too; the worker re-lays pushes out where they differ by tensor parallelism), and how
// long it waits for the next frame before it drops the connection (0: for ever): the client
// sends a Ping well within that when it has nothing else to send.
struct HelloOkMsg {
  static constexpr MsgType kType = MsgType::HelloOk;
  int32_t kv_blocks = 0;
  int64_t block_bytes = 0;
  std::string backend;
  KvLayout decode_layout;
  uint32_t idle_timeout_ms = 0;
  bool operator==(const HelloOkMsg&) const = default;
};

struct ChallengeMsg {
  static constexpr MsgType kType = MsgType::Challenge;
  std::array<uint8_t, 32> nonce{};
  bool operator==(const ChallengeMsg&) const = default;
};

struct ProofMsg {
  static constexpr MsgType kType = MsgType::Proof;
  std::array<uint8_t, 32> mac{};
  bool operator==(const ProofMsg&) const = default;
};

// A step plan as received. plan.seqs[i].block_table points into tables[i], so the struct
// moves (the inner vectors keep their buffers) but does not copy.
struct DecodedStep {
  static constexpr MsgType kType = MsgType::Step;
  uint64_t step = 0;
  StepPlan plan;
  std::vector<std::vector<int32_t>> tables;
  DecodedStep() = default;
  DecodedStep(DecodedStep&&) = default;
  DecodedStep& operator=(DecodedStep&&) = default;
  DecodedStep(const DecodedStep&) = delete;
  DecodedStep& operator=(const DecodedStep&) = delete;
};

struct StepReplyMsg {
  static constexpr MsgType kType = MsgType::StepReply;
  uint64_t step = 0;
  int64_t elapsed_ns = 0;
  std::vector<int32_t> sampled;
  std::string error;  // empty on success
  bool operator==(const StepReplyMsg&) const = default;
};

// One request's KV blocks, block after block (dst_blocks.size() * block_bytes bytes), to be
// written into the receiver's blocks dst_blocks. ticket names the transfer (DESIGN.md: a
// completion carries its ticket, so one that arrives after a cancel is recognised).
// block_checksums: block_checksums() of the payload as the sender read it from its blocks, one
// per block. The frame's checksum covers the bytes on the wire; these cover them end to end,
// from the sender's blocks to what the receiver writes and reads back.
struct KvPushMsg {
  static constexpr MsgType kType = MsgType::KvPush;
  uint64_t ticket = 0;
  int32_t request = 0;
  int32_t num_tokens = 0;
  std::vector<int32_t> dst_blocks;
  std::vector<uint64_t> block_checksums;
  std::vector<uint8_t> payload;
  bool operator==(const KvPushMsg&) const = default;
};

// What became of a push. Written: blocks_written blocks (the first ones of dst_blocks) were
// written and read back, and digest is blocks_digest() of what was read (in the sender's
// layout): the sender compares both with its own, so a short or garbled write fails that
// transfer even if the receiver did not notice. Failed: nothing usable was written (error
// says why). Corrupt: the receiver found a block that does not match its checksum, before
// writing or when reading it back. Either way the connection goes on: a bad payload fails its
// transfer, only a bad frame ends the connection.
enum class KvAckStatus : uint8_t { Written = 0, Failed = 1, Corrupt = 2 };
std::string_view to_string(KvAckStatus s);

struct KvAckMsg {
  static constexpr MsgType kType = MsgType::KvAck;
  uint64_t ticket = 0;
  KvAckStatus status = KvAckStatus::Failed;
  int32_t blocks_written = 0;
  uint64_t digest = 0;
  std::string error;
  bool ok() const { return status == KvAckStatus::Written; }
  bool operator==(const KvAckMsg&) const = default;
};

// Sent by the client when it has had nothing else to send for a while (HelloOk's idle timeout):
// a live client that is merely idle keeps its worker; a stopped one loses it.
struct PingMsg {
  static constexpr MsgType kType = MsgType::Ping;
  bool operator==(const PingMsg&) const = default;
};

struct ByeMsg {
  static constexpr MsgType kType = MsgType::Bye;
  bool operator==(const ByeMsg&) const = default;
};

struct ErrorMsg {
  static constexpr MsgType kType = MsgType::Error;
  std::string message;
  bool operator==(const ErrorMsg&) const = default;
};

std::vector<uint8_t> encode(const HelloMsg& m);
std::vector<uint8_t> encode(const HelloOkMsg& m);
std::vector<uint8_t> encode(const ChallengeMsg& m);
std::vector<uint8_t> encode(const ProofMsg& m);
std::vector<uint8_t> encode(const StepReplyMsg& m);
std::vector<uint8_t> encode(const KvPushMsg& m);
std::vector<uint8_t> encode(const KvAckMsg& m);
std::vector<uint8_t> encode(const ByeMsg& m);
std::vector<uint8_t> encode(const ErrorMsg& m);
std::vector<uint8_t> encode(const PingMsg& m);
// The plan with its step number. A StepPlan keeps how many of its seqs are prefills, not
// which: the wire carries a prefill flag per seq, set on the last num_prefill_seqs seqs (the
// scheduler's order: decodes first, then prompts), so the decoded plan has the same counts.
// Throws std::invalid_argument for a plan whose counts disagree with its seqs.
std::vector<uint8_t> encode_step(uint64_t step, const StepPlan& plan);

HelloMsg decode_hello(std::span<const uint8_t> payload);
HelloOkMsg decode_hello_ok(std::span<const uint8_t> payload);
ChallengeMsg decode_challenge(std::span<const uint8_t> payload);
ProofMsg decode_proof(std::span<const uint8_t> payload);
// Checks each seq (id >= 0 and unique, num_tokens >= 1, num_computed_before >= 0, their sum
// within int32, block ids >= 0), the plan's token total against the seqs', and the tokens
// (none, or exactly the total, each >= 0). Block ids against the pool: check_block_ids.
DecodedStep decode_step(std::span<const uint8_t> payload);
StepReplyMsg decode_step_reply(std::span<const uint8_t> payload);
KvPushMsg decode_kv_push(std::span<const uint8_t> payload);
KvAckMsg decode_kv_ack(std::span<const uint8_t> payload);
ByeMsg decode_bye(std::span<const uint8_t> payload);
ErrorMsg decode_error(std::span<const uint8_t> payload);
PingMsg decode_ping(std::span<const uint8_t> payload);

// XXH3-64 of each block of `bytes` (a whole number of blocks of block_bytes, else
// std::invalid_argument), in order.
std::vector<uint64_t> block_checksums(std::span<const uint8_t> bytes, int64_t block_bytes);
// One value for a run of blocks: XXH3-64 of their checksums as little-endian u64s, in order.
uint64_t blocks_digest(std::span<const uint64_t> checksums);

// The receiver's checks against its own pool, before a decoded message touches it.
// Every block id < num_blocks; throws WireError naming the seq and the block.
void check_block_ids(const DecodedStep& m, int32_t num_blocks);
// Every seq's table covers its context after the step (num_computed_before + num_tokens
// tokens at block_size a block), so an executor never reads past a table.
void check_table_lengths(const DecodedStep& m, int32_t block_size);
// request >= 0; dst_blocks non-empty, distinct and < num_blocks; one checksum per block;
// payload exactly dst_blocks.size() * block_bytes bytes; num_tokens in (0, dst_blocks.size() *
// block_size].
void check_kv_push(const KvPushMsg& m, int32_t num_blocks, int64_t block_bytes, int32_t block_size);

}  // namespace tandem::transfer
