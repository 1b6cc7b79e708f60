// The channel's wire format (backend/transfer/wire.h): every message round-trips, and every
// decoder refuses what a lying or broken peer could send: each truncation of a valid
// encoding, trailing bytes, lengths over their field's maximum or over the bytes left, bad
// frame headers, any flipped payload byte, and block ids outside the receiver's pool.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/transfer/wire.h"

using namespace tandem;
using namespace tandem::transfer;

namespace {

using Bytes = std::vector<uint8_t>;

// The decoder for a frame's type; throws WireError on a bad payload.
void decode_payload(MsgType t, std::span<const uint8_t> p) {
  switch (t) {
    case MsgType::Hello: (void)decode_hello(p); return;
    case MsgType::HelloOk: (void)decode_hello_ok(p); return;
    case MsgType::Challenge: (void)decode_challenge(p); return;
    case MsgType::Proof: (void)decode_proof(p); return;
    case MsgType::Step: (void)decode_step(p); return;
    case MsgType::StepReply: (void)decode_step_reply(p); return;
    case MsgType::KvPush: (void)decode_kv_push(p); return;
    case MsgType::KvAck: (void)decode_kv_ack(p); return;
    case MsgType::Bye: (void)decode_bye(p); return;
    case MsgType::Error: (void)decode_error(p); return;
    case MsgType::Ping: (void)decode_ping(p); return;
  }
  FAIL("unknown type");
}

// Two decodes, then two prompts (the scheduler's order), three of them sampling.
struct SamplePlan {
  std::vector<std::vector<int32_t>> tables{{0, 1}, {2, 3, 4}, {5}, {6, 7}};
  StepPlan plan;
  SamplePlan() {
    plan.add({3, 1, 17, true, tables[0]}, 10);
    plan.add({5, 1, 40, true, tables[1]}, 12);
    plan.add({7, 8, 0, false, tables[2]}, 20);
    plan.add({9, 4, 12, true, tables[3]}, 16);
    for (int32_t t = 0; t < plan.num_tokens; ++t) plan.tokens.push_back(100 + t);
    plan.after_idle = true;
  }
};

KvPushMsg sample_push() {
  KvPushMsg m;
  m.ticket = 0x0123456789abcdefULL;
  m.request = 42;
  m.num_tokens = 5;
  m.dst_blocks = {3, 1};
  for (int i = 0; i < 8; ++i) m.payload.push_back(uint8_t(0xa0 + i));  // 2 blocks of 4 bytes
  m.block_checksums = block_checksums(m.payload, 4);
  return m;
}

struct Sample {
  std::string name;  // also the seed file's name under tests/fuzz/corpus/frame/
  MsgType type;
  Bytes payload;
};

// One valid encoding of every message (several for the richer ones): the round-trip,
// truncation and trailing-byte cases run over each, and they are the fuzz target's seeds.
std::vector<Sample> samples() {
  std::vector<Sample> s;
  const KvLayout layout{.model = "tiny (4 layers)", .weights = "fp32 values #0123456789abcdef", .dtype = "fp32",
                        .block_size = 16, .layers = 4, .kv_heads = 4, .head_dim = 32, .tp = 2};
  s.push_back({"hello", MsgType::Hello, encode(HelloMsg{kProtocolVersion, "model: tiny\nrequests: 4\n", layout})});
  s.push_back({"hello_ok", MsgType::HelloOk, encode(HelloOkMsg{64, 4096, "cpu", layout, 60000})});
  ChallengeMsg c;
  for (size_t i = 0; i < c.nonce.size(); ++i) c.nonce[i] = uint8_t(i * 7 + 1);
  s.push_back({"challenge", MsgType::Challenge, encode(c)});
  ProofMsg p;
  for (size_t i = 0; i < p.mac.size(); ++i) p.mac[i] = uint8_t(255 - i);
  s.push_back({"proof", MsgType::Proof, encode(p)});
  const SamplePlan sp;
  s.push_back({"step", MsgType::Step, encode_step(7, sp.plan)});
  StepPlan no_tokens = sp.plan;
  no_tokens.tokens.clear();
  no_tokens.after_idle = false;
  s.push_back({"step_simulated", MsgType::Step, encode_step(8, no_tokens)});
  s.push_back({"step_empty", MsgType::Step, encode_step(9, StepPlan{})});
  s.push_back({"step_reply", MsgType::StepReply, encode(StepReplyMsg{7, 1234567, {11, 12, 13}, ""})});
  s.push_back({"step_reply_error", MsgType::StepReply, encode(StepReplyMsg{8, 0, {}, "out of memory"})});
  s.push_back({"kv_push", MsgType::KvPush, encode(sample_push())});
  s.push_back({"kv_ack", MsgType::KvAck,
               encode(KvAckMsg{0x0123456789abcdefULL, KvAckStatus::Written, 2, 0xfedcba9876543210ULL, ""})});
  s.push_back({"kv_ack_failed", MsgType::KvAck, encode(KvAckMsg{5, KvAckStatus::Failed, 0, 0, "out of memory"})});
  s.push_back({"kv_ack_corrupt", MsgType::KvAck,
               encode(KvAckMsg{6, KvAckStatus::Corrupt, 0, 0, "block 1 of 2: content checksum mismatch"})});
  s.push_back({"bye", MsgType::Bye, encode(ByeMsg{})});
  s.push_back({"error", MsgType::Error, encode(ErrorMsg{"authentication failed"})});
  s.push_back({"ping", MsgType::Ping, encode(PingMsg{})});
  return s;
}

// The field name a WireError names, for the cases that assert which check fired.
std::string wire_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const WireError& e) {
    return e.what();
  }
  return "(no WireError)";
}

std::string frame_seed_dir() { return std::string(TANDEM_SOURCE_DIR) + "/tests/fuzz/corpus/frame"; }

}  // namespace

TEST_CASE("WireWriter writes little-endian; WireReader reads it back") {
  WireWriter w;
  w.u32(0x01020304);
  w.i64(-2);
  w.u16(0xbeef);
  w.boolean(true);
  w.str("ab");
  const Bytes b = w.take();
  REQUIRE(b.size() == 4 + 8 + 2 + 1 + 8 + 2);
  CHECK(b[0] == 0x04);
  CHECK(b[3] == 0x01);
  CHECK(b[4] == 0xfe);
  CHECK(b[11] == 0xff);
  WireReader r(b, "Test");
  CHECK(r.u32("a") == 0x01020304u);
  CHECK(r.i64("b") == -2);
  CHECK(r.u16("c") == 0xbeef);
  CHECK(r.boolean("d"));
  CHECK(r.str("e", 2) == "ab");
  CHECK_NOTHROW(r.finish());
  CHECK(wire_error([&] { (void)r.u8("f"); }) == "Test.f: needs 1 bytes, 0 left");
}

TEST_CASE("every message round-trips") {
  const KvLayout layout{.model = "m", .weights = "w", .dtype = "bf16", .block_size = 16, .layers = 32, .kv_heads = 8,
                        .head_dim = 128, .tp = 4, .order = "x"};
  const HelloMsg hello{kProtocolVersion, std::string(1000, 'y'), layout};
  CHECK(decode_hello(encode(hello)) == hello);
  const HelloOkMsg ok{1 << 20, int64_t{3} << 33, "cuda", layout, UINT32_MAX};
  CHECK(decode_hello_ok(encode(ok)) == ok);
  ChallengeMsg c;
  c.nonce[0] = 1;
  c.nonce[31] = 2;
  CHECK(decode_challenge(encode(c)) == c);
  ProofMsg p;
  p.mac[5] = 9;
  CHECK(decode_proof(encode(p)) == p);
  const StepReplyMsg reply{~uint64_t{0}, INT64_MAX, {0, 1, INT32_MAX}, "why"};
  CHECK(decode_step_reply(encode(reply)) == reply);
  const KvPushMsg push = sample_push();
  CHECK(decode_kv_push(encode(push)) == push);
  const KvAckMsg ack{9, KvAckStatus::Corrupt, INT32_MAX, ~uint64_t{0}, "no"};
  CHECK(decode_kv_ack(encode(ack)) == ack);
  CHECK(decode_ping(encode(PingMsg{})) == PingMsg{});
  CHECK(decode_bye(encode(ByeMsg{})) == ByeMsg{});
  const ErrorMsg err{"bad"};
  CHECK(decode_error(encode(err)) == err);

  // And through a frame.
  for (const Sample& s : samples()) {
    CAPTURE(s.name);
    const Frame f = decode_frame(encode_frame(s.type, s.payload), 1 << 20);
    CHECK(f.type == s.type);
    CHECK(f.payload == s.payload);
    CHECK_NOTHROW(decode_payload(f.type, f.payload));
  }
}

TEST_CASE("a step plan round-trips: seqs, counts, tables and tokens") {
  const SamplePlan sp;
  DecodedStep d = decode_step(encode_step(77, sp.plan));
  CHECK(d.step == 77);
  CHECK(d.plan.after_idle);
  CHECK(d.plan.num_tokens == 14);
  CHECK(d.plan.num_prefill_seqs == 2);
  CHECK(d.plan.num_decode_seqs == 2);
  CHECK(d.plan.num_samples == 3);
  CHECK(d.plan.tokens == sp.plan.tokens);
  REQUIRE(d.plan.seqs.size() == 4);
  REQUIRE(d.tables.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const ScheduledSeq& a = sp.plan.seqs[i];
    const ScheduledSeq& b = d.plan.seqs[i];
    CHECK(b.id == a.id);
    CHECK(b.num_tokens == a.num_tokens);
    CHECK(b.num_computed_before == a.num_computed_before);
    CHECK(b.samples == a.samples);
    CHECK(d.tables[i] == sp.tables[i]);
    CHECK(b.block_table.data() == d.tables[i].data());  // the spans point into the message
    CHECK(b.block_table.size() == d.tables[i].size());
  }
  // A move keeps the spans valid: the tables' buffers move with them.
  const DecodedStep moved = std::move(d);
  CHECK(moved.plan.seqs[1].block_table.data() == moved.tables[1].data());
  CHECK(moved.plan.seqs[1].block_table[2] == 4);

  // Prompts first (warmup's order): only the counts are kept, and they survive.
  StepPlan p;
  const std::vector<int32_t> t0{0}, t1{1};
  p.add({0, 5, 0, true, t0}, 5);
  p.add({1, 1, 9, true, t1}, 3);
  const DecodedStep q = decode_step(encode_step(1, p));
  CHECK(q.plan.num_prefill_seqs == 1);
  CHECK(q.plan.num_decode_seqs == 1);
  CHECK(q.plan.num_samples == 2);
  CHECK(q.plan.num_tokens == 6);
  CHECK(q.plan.tokens.empty());

  StepPlan bad = sp.plan;
  bad.tokens.pop_back();
  CHECK_THROWS_AS((void)encode_step(1, bad), std::invalid_argument);
  bad = sp.plan;
  bad.num_prefill_seqs = 5;
  CHECK_THROWS_AS((void)encode_step(1, bad), std::invalid_argument);
}

TEST_CASE("every decoder rejects each truncation of a valid encoding, and a trailing byte") {
  int64_t truncations = 0;
  for (const Sample& s : samples()) {
    CAPTURE(s.name);
    for (size_t len = 0; len < s.payload.size(); ++len) {
      CAPTURE(len);
      CHECK_THROWS_AS(decode_payload(s.type, std::span(s.payload).first(len)), WireError);
      ++truncations;
    }
    Bytes longer = s.payload;
    longer.push_back(0);
    CHECK(wire_error([&] { decode_payload(s.type, longer); }).find("1 trailing bytes") != std::string::npos);

    const Bytes frame = encode_frame(s.type, s.payload);
    for (size_t len = 0; len < frame.size(); ++len) {
      CAPTURE(len);
      CHECK_THROWS_AS((void)decode_frame(std::span(frame).first(len), 1 << 20), WireError);
      ++truncations;
    }
    Bytes longer_frame = frame;
    longer_frame.push_back(0);
    CHECK(wire_error([&] { (void)decode_frame(longer_frame, 1 << 20); }) == "frame: 1 trailing bytes");
  }
  CHECK(truncations > 1000);  // the loops ran over real encodings
}

TEST_CASE("lengths over their field's maximum or over the bytes left are refused before allocation") {
  // A count far over the maximum, with nothing behind it.
  WireWriter w;
  w.u64(1);
  w.i32(2);
  w.i32(3);
  w.u64(20000000);
  CHECK(wire_error([&] { (void)decode_kv_push(w.buffer()); }) ==
        "KvPush.dst_blocks: length 20000000 exceeds the 16777216 allowed");
  // Under the maximum but over the bytes left.
  WireWriter w2;
  w2.u64(1);
  w2.i32(2);
  w2.i32(3);
  w2.u64(1000);
  w2.i32(0);
  CHECK(wire_error([&] { (void)decode_kv_push(w2.buffer()); }) ==
        "KvPush.dst_blocks: length 1000 needs 4000 bytes, 4 left");
  // A payload length of 2^63.
  WireWriter w3;
  w3.u64(1);
  w3.i32(2);
  w3.i32(3);
  w3.u64(0);
  w3.u64(0);  // no checksums
  w3.u64(uint64_t{1} << 63);
  CHECK(wire_error([&] { (void)decode_kv_push(w3.buffer()); }).find("KvPush.payload: length 9223372036854775808") == 0);
  // A checksum count of 2^40: over the maximum, before anything is allocated.
  WireWriter w4;
  w4.u64(1);
  w4.i32(2);
  w4.i32(3);
  w4.u64(0);
  w4.u64(uint64_t{1} << 40);
  CHECK(wire_error([&] { (void)decode_kv_push(w4.buffer()); }) ==
        "KvPush.block_checksums: length 1099511627776 exceeds the 16777216 allowed");

  WireWriter h;
  h.u32(kProtocolVersion);
  h.u64(kMaxWorkloadYaml + 1);
  CHECK(wire_error([&] { (void)decode_hello(h.buffer()); }).find("Hello.workload_yaml: length 16777217 exceeds") == 0);

  WireWriter s;
  s.u64(1);
  s.boolean(false);
  s.i32(0);
  s.u64(kMaxStepSeqs + 1);
  CHECK(wire_error([&] { (void)decode_step(s.buffer()); }).find("Step.seqs: length 65537 exceeds") == 0);
  WireWriter s2;  // 1000 seqs claimed, one seq's worth of bytes there
  s2.u64(1);
  s2.boolean(false);
  s2.i32(0);
  s2.u64(1000);
  for (int i = 0; i < 22; ++i) s2.u8(0);
  CHECK(wire_error([&] { (void)decode_step(s2.buffer()); }).find("Step.seqs: length 1000 needs 22000 bytes") == 0);
  WireWriter s3;  // one seq whose block table claims more than 2^24 blocks
  s3.u64(1);
  s3.boolean(false);
  s3.i32(1);
  s3.u64(1);
  s3.i32(0);
  s3.i32(1);
  s3.i32(0);
  s3.boolean(true);
  s3.boolean(true);
  s3.u64(kMaxBlockTable + 1);
  CHECK(wire_error([&] { (void)decode_step(s3.buffer()); }).find("Step.seqs.block_table: length 16777217 exceeds") ==
        0);

  WireWriter e;
  e.u64(kMaxErrorString + 1);
  CHECK(wire_error([&] { (void)decode_error(e.buffer()); }).find("Error.message: length 65537 exceeds") == 0);
  WireWriter b;
  b.i32(1);
  b.i64(1);
  b.u64(kMaxShortString + 1);
  CHECK(wire_error([&] { (void)decode_hello_ok(b.buffer()); }).find("HelloOk.backend: length 4097 exceeds") == 0);
}

TEST_CASE("a step's seqs, totals and tokens are checked") {
  // One seq: id, num_tokens, num_computed_before, samples, prefill, a one-block table; then
  // the step's tokens.
  const auto step = [](int32_t total, int32_t id, int32_t n, int32_t before, uint8_t samples, int32_t block,
                       std::vector<int32_t> tokens, int num_seqs = 1) {
    WireWriter w;
    w.u64(5);
    w.boolean(false);
    w.i32(total);
    w.u64(uint64_t(num_seqs));
    for (int i = 0; i < num_seqs; ++i) {
      w.i32(id);
      w.i32(n);
      w.i32(before);
      w.u8(samples);
      w.boolean(false);
      w.i32s(std::vector<int32_t>{block});
    }
    w.i32s(tokens);
    return w.take();
  };
  CHECK_NOTHROW((void)decode_step(step(2, 0, 2, 0, 1, 0, {4, 5})));
  CHECK(wire_error([&] { (void)decode_step(step(0, 0, 0, 0, 1, 0, {})); }) == "Step.seqs[0].num_tokens: 0 is not >= 1");
  CHECK(wire_error([&] { (void)decode_step(step(1, -1, 1, 0, 1, 0, {})); }) == "Step.seqs[0].id: -1 is negative");
  CHECK(wire_error([&] { (void)decode_step(step(1, 0, 1, -3, 1, 0, {})); }) ==
        "Step.seqs[0].num_computed_before: -3 is negative");
  CHECK(wire_error([&] { (void)decode_step(step(2, 0, 2, INT32_MAX - 1, 1, 0, {})); }) ==
        "Step.seqs[0]: num_computed_before 2147483646 + num_tokens 2 overflows int32");
  CHECK(wire_error([&] { (void)decode_step(step(3, 0, 2, 0, 1, 0, {})); }) ==
        "Step.num_tokens: 3 but the seqs' add up to 2");
  CHECK(wire_error([&] { (void)decode_step(step(1, 0, 2, 0, 1, 0, {})); }).find("Step.seqs[0].num_tokens") == 0);
  CHECK(wire_error([&] { (void)decode_step(step(-1, 0, 2, 0, 1, 0, {})); }) == "Step.num_tokens: -1 is negative");
  CHECK(wire_error([&] { (void)decode_step(step(2, 0, 2, 0, 1, -4, {})); }) ==
        "Step.seqs[0].block_table[0]: -4 is negative");
  CHECK(wire_error([&] { (void)decode_step(step(2, 0, 2, 0, 1, 0, {1})); }).find("Step.tokens: 1 tokens") == 0);
  CHECK(wire_error([&] { (void)decode_step(step(2, 0, 2, 0, 1, 0, {1, -1})); }) == "Step.tokens[1]: -1 is negative");
  CHECK(wire_error([&] { (void)decode_step(step(2, 0, 2, 0, 2, 0, {})); }) ==
        "Step.seqs.samples: bool byte 2 is neither 0 nor 1");
  CHECK(wire_error([&] { (void)decode_step(step(4, 6, 2, 0, 1, 0, {}, 2)); }) == "Step.seqs: request 6 appears twice");
  // A total over int32 in the making: the running sum is checked against the declared total.
  CHECK(wire_error([&] {
          (void)decode_step(step(INT32_MAX, 0, INT32_MAX, 0, 1, 0, {}, 2));
        }).find("Step.seqs[1].num_tokens: the seqs' tokens exceed") == 0);
}

TEST_CASE("frame headers: bad magic, type, flags and length; checksum over every payload byte") {
  const Bytes payload = encode(KvAckMsg{3, KvAckStatus::Written, 1, 7, "fine"});
  const Bytes good = encode_frame(MsgType::KvAck, payload);
  REQUIRE(good.size() == kHeaderBytes + payload.size());
  CHECK(good[0] == 'T');
  CHECK(good[3] == '1');
  CHECK(decode_frame(good, 1 << 20).type == MsgType::KvAck);

  Bytes f = good;
  f[0] = 'X';
  CHECK(wire_error([&] { (void)decode_frame(f, 1 << 20); }) == "frame.magic: 0x314b4458 is not TDK1");
  for (const uint16_t type : {uint16_t{0}, uint16_t{12}, uint16_t{0xffff}}) {
    f = good;
    f[4] = uint8_t(type);
    f[5] = uint8_t(type >> 8);
    CHECK(wire_error([&] { (void)decode_frame(f, 1 << 20); }) ==
          "frame.type: " + std::to_string(type) + " is not a message type");
  }
  f = good;
  f[6] = 1;
  CHECK(wire_error([&] { (void)decode_frame(f, 1 << 20); }) == "frame.flags: 1 must be 0");
  CHECK(wire_error([&] { (void)decode_frame(good, payload.size() - 1); }) ==
        "frame.payload_len: " + std::to_string(payload.size()) + " exceeds the " + std::to_string(payload.size() - 1) +
            " allowed");
  // parse_header refuses a huge length from the header alone, before any payload exists.
  WireWriter h;
  h.u32(kFrameMagic);
  h.u16(uint16_t(MsgType::KvPush));
  h.u16(0);
  h.u64(~uint64_t{0});
  h.u64(0);
  CHECK_THROWS_AS(
      (void)parse_header(std::span<const uint8_t, kHeaderBytes>(h.buffer().data(), kHeaderBytes), kDefaultMaxPayload),
      WireError);

  int flips = 0;
  for (size_t i = kHeaderBytes; i < good.size(); ++i) {
    for (const uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
      f = good;
      f[i] ^= bit;
      CAPTURE(i);
      CHECK(wire_error([&] { (void)decode_frame(f, 1 << 20); }).find("frame.checksum: mismatch") == 0);
      ++flips;
    }
  }
  for (size_t i = 16; i < kHeaderBytes; ++i) {  // the checksum field itself
    f = good;
    f[i] ^= 0x10;
    CHECK_THROWS_AS((void)decode_frame(f, 1 << 20), WireError);
    ++flips;
  }
  CHECK(flips == 2 * int(payload.size()) + 8);
  FrameHeader hdr = parse_header(std::span<const uint8_t, kHeaderBytes>(good.data(), kHeaderBytes), 1 << 20);
  CHECK(hdr.payload_len == payload.size());
  CHECK_NOTHROW(check_payload(hdr, payload));
  CHECK_THROWS_AS(check_payload(hdr, std::span(payload).first(payload.size() - 1)), WireError);
}

TEST_CASE("block ids and table lengths against the receiver's pool") {
  const SamplePlan sp;  // blocks 0..7
  const DecodedStep d = decode_step(encode_step(1, sp.plan));
  CHECK_NOTHROW(check_block_ids(d, 8));
  CHECK(wire_error([&] { check_block_ids(d, 7); }) ==
        "Step.seqs[3] (request 9): block 7 at table index 1 is outside the pool of 7 blocks");
  CHECK(wire_error([&] { check_block_ids(d, 0); }).find("Step.seqs[0] (request 3): block 0") == 0);
  // Seq 0 holds 18 tokens after the step in 2 blocks: enough at 16 a block, not at 8.
  CHECK_NOTHROW(check_table_lengths(d, 16));
  CHECK(wire_error([&] { check_table_lengths(d, 8); }) ==
        "Step.seqs[0] (request 3): block table of 2 blocks for 18 tokens needs 3");
  CHECK_THROWS_AS(check_table_lengths(d, 0), std::invalid_argument);

  const KvPushMsg ok = sample_push();  // blocks {3, 1}, 8 bytes, 5 tokens
  CHECK_NOTHROW(check_kv_push(ok, 4, 4, 4));
  CHECK_NOTHROW(check_kv_push(ok, 4, 4, 3));  // 5 tokens in 2 blocks of 3
  CHECK(wire_error([&] { check_kv_push(ok, 3, 4, 4); }) ==
        "KvPush (ticket 81985529216486895, request 42).dst_blocks[0]: block 3 is outside the pool of 3 blocks");
  CHECK(wire_error([&] { check_kv_push(ok, 4, 8, 4); }).find(".payload: 8 bytes for 2 blocks of 8 bytes") !=
        std::string::npos);
  CHECK(wire_error([&] { check_kv_push(ok, 4, 4, 2); }).find(".num_tokens: 5 is outside (0, 4]") != std::string::npos);
  KvPushMsg m = ok;
  m.num_tokens = 0;
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find(".num_tokens: 0 is outside") != std::string::npos);
  m = ok;
  m.dst_blocks = {1, 1};
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find(".dst_blocks: block 1 appears twice") != std::string::npos);
  m = ok;
  m.dst_blocks = {-1, 0};
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find("block -1 is outside") != std::string::npos);
  m = ok;
  m.dst_blocks.clear();
  m.payload.clear();
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find(".dst_blocks: empty") != std::string::npos);
  m = ok;
  m.request = -1;
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find(".request: negative") != std::string::npos);
  m = ok;  // a block size whose product with the count overflows int64
  CHECK_THROWS_AS(check_kv_push(m, 4, INT64_MAX, 4), WireError);
  CHECK_THROWS_AS(check_kv_push(ok, 4, 0, 4), std::invalid_argument);
}

TEST_CASE("content checksums: one per block, a digest over them; KvAck's status and count are checked") {
  const KvPushMsg ok = sample_push();  // blocks {3, 1} of 4 bytes
  REQUIRE(ok.block_checksums.size() == 2);
  CHECK(ok.block_checksums[0] != ok.block_checksums[1]);
  // A flipped byte changes its own block's checksum only, and so the digest.
  std::vector<uint8_t> flipped = ok.payload;
  flipped[5] ^= 0x40;
  const std::vector<uint64_t> sums = block_checksums(flipped, 4);
  CHECK(sums[0] == ok.block_checksums[0]);
  CHECK(sums[1] != ok.block_checksums[1]);
  CHECK(blocks_digest(sums) != blocks_digest(ok.block_checksums));
  // The digest sees order and count: a swapped pair or a block left out is another digest.
  const std::vector<uint64_t> swapped{ok.block_checksums[1], ok.block_checksums[0]};
  CHECK(blocks_digest(swapped) != blocks_digest(ok.block_checksums));
  CHECK(blocks_digest(std::span(ok.block_checksums).first(1)) != blocks_digest(ok.block_checksums));
  CHECK(block_checksums({}, 4).empty());
  CHECK_THROWS_AS((void)block_checksums(ok.payload, 3), std::invalid_argument);
  CHECK_THROWS_AS((void)block_checksums(ok.payload, 0), std::invalid_argument);

  KvPushMsg m = ok;
  m.block_checksums.pop_back();
  CHECK(wire_error([&] { check_kv_push(m, 4, 4, 4); }).find(".block_checksums: 1 for 2 blocks") != std::string::npos);

  Bytes ack = encode(KvAckMsg{1, KvAckStatus::Written, 2, 3, ""});
  ack[8] = 3;  // the status byte, after the ticket
  CHECK(wire_error([&] { (void)decode_kv_ack(ack); }) ==
        "KvAck.status: 3 is not a status (0 written, 1 failed, 2 corrupt)");
  CHECK(wire_error([&] {
          (void)decode_kv_ack(encode(KvAckMsg{1, KvAckStatus::Written, -1, 3, ""}));
        }) == "KvAck.blocks_written: -1 is negative");
  CHECK(KvAckMsg{1, KvAckStatus::Written, 0, 0, ""}.ok());
  CHECK_FALSE(KvAckMsg{1, KvAckStatus::Corrupt, 0, 0, ""}.ok());
}

// The fuzz target's seeds (tests/fuzz/corpus/frame/) are these samples' frames, byte for
// byte, so that a format change cannot leave the fuzzer starting from invalid frames. After
// one: TANDEM_WRITE_FRAME_SEEDS=1 build/tests/transfer_tests -tc='*seeds*' rewrites them.
TEST_CASE("the fuzz seeds are the samples' frames") {
  const bool write = std::getenv("TANDEM_WRITE_FRAME_SEEDS") != nullptr;
  if (write) std::filesystem::create_directories(frame_seed_dir());
  std::map<MsgType, int> types;
  for (const Sample& s : samples()) {
    CAPTURE(s.name);
    const Bytes frame = encode_frame(s.type, s.payload);
    const std::string path = frame_seed_dir() + "/" + s.name + ".bin";
    if (write) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(frame.data()), std::streamsize(frame.size()));
      REQUIRE(out.good());
    }
    std::ifstream in(path, std::ios::binary);
    const Bytes on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(on_disk == frame, "stale seed " << path << ": rerun with TANDEM_WRITE_FRAME_SEEDS=1");
    ++types[s.type];
  }
  CHECK(types.size() == size_t(kMaxMsgType));  // every message type has a seed
}
