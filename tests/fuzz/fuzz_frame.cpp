// The prefill/decode channel's frames (backend/transfer/wire.h), as a lying or broken peer
// could send them: decode_frame with a 1 MiB payload limit, then the decoder for the frame's
// type, then the receiver's checks against small pools. Here WireError is the expected answer
// to bad input (a bad frame ends its connection, never the process: DESIGN.md, stage 4); any
// other exception, a crash or a sanitizer report is a finding. A message that decodes must
// encode back to the same bytes (a step: to a plan with the same content).
//
// Mutated frames almost never carry the right checksum, so each input is tried twice: as it
// is (the checksum check) and with its checksum field recomputed (the decoders behind it).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/transfer/wire.h"

namespace {

using namespace tandem::transfer;

constexpr uint64_t kMaxPayload = uint64_t{1} << 20;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "FINDING: %s\n", what);
  std::abort();
}

void same_bytes(const std::vector<uint8_t>& reencoded, const std::vector<uint8_t>& payload, const char* what) {
  if (reencoded != payload) finding(what);
}

void same_step(const DecodedStep& a, const DecodedStep& b) {
  const tandem::StepPlan &p = a.plan, &q = b.plan;
  if (a.step != b.step || p.after_idle != q.after_idle || p.num_tokens != q.num_tokens ||
      p.num_prefill_seqs != q.num_prefill_seqs || p.num_decode_seqs != q.num_decode_seqs ||
      p.num_samples != q.num_samples || p.tokens != q.tokens || p.seqs.size() != q.seqs.size() || a.tables != b.tables)
    finding("Step: re-encoded plan differs");
  for (size_t i = 0; i < p.seqs.size(); ++i) {
    const tandem::ScheduledSeq &s = p.seqs[i], &t = q.seqs[i];
    if (s.id != t.id || s.num_tokens != t.num_tokens || s.num_computed_before != t.num_computed_before ||
        s.samples != t.samples)
      finding("Step: re-encoded seq differs");
    if (s.block_table.data() != a.tables[i].data() || s.block_table.size() != a.tables[i].size())
      finding("Step: a block table span does not point into the message");
  }
}

// The receiver's checks may refuse a message that decoded: that is WireError too.
template <class F>
void receiver_check(F f) {
  try {
    f();
  } catch (const WireError&) {}
}

void decode_and_check(std::span<const uint8_t> bytes) {
  const Frame f = decode_frame(bytes, kMaxPayload);
  const std::vector<uint8_t>& p = f.payload;
  switch (f.type) {
    case MsgType::Hello: {
      // Another protocol version's Hello is read up to its version only (the worker then names
      // both versions): nothing after it is parsed, so only the current version round-trips.
      const HelloMsg m = decode_hello(p);
      if (m.protocol == kProtocolVersion) same_bytes(encode(m), p, "Hello");
      else if (!m.workload_yaml.empty() || !m.prefill_layout.model.empty()) finding("Hello: another version parsed on");
      break;
    }
    case MsgType::HelloOk: same_bytes(encode(decode_hello_ok(p)), p, "HelloOk"); break;
    case MsgType::Challenge: same_bytes(encode(decode_challenge(p)), p, "Challenge"); break;
    case MsgType::Proof: same_bytes(encode(decode_proof(p)), p, "Proof"); break;
    case MsgType::Step: {
      const DecodedStep d = decode_step(p);
      same_step(d, decode_step(encode_step(d.step, d.plan)));
      receiver_check([&] { check_block_ids(d, 16); });
      receiver_check([&] { check_table_lengths(d, 4); });
      break;
    }
    case MsgType::StepReply: same_bytes(encode(decode_step_reply(p)), p, "StepReply"); break;
    case MsgType::KvPush: {
      const KvPushMsg m = decode_kv_push(p);
      same_bytes(encode(m), p, "KvPush");
      receiver_check([&] { check_kv_push(m, 16, 4, 2); });
      break;
    }
    case MsgType::KvAck: same_bytes(encode(decode_kv_ack(p)), p, "KvAck"); break;
    case MsgType::Bye: same_bytes(encode(decode_bye(p)), p, "Bye"); break;
    case MsgType::Error: same_bytes(encode(decode_error(p)), p, "Error"); break;
    case MsgType::Ping: same_bytes(encode(decode_ping(p)), p, "Ping"); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  try {
    decode_and_check(input);
  } catch (const WireError&) {}
  if (size >= kHeaderBytes) {
    std::vector<uint8_t> fixed(input.begin(), input.end());
    const uint64_t sum = payload_checksum(std::span(fixed).subspan(kHeaderBytes));
    for (size_t i = 0; i < 8; ++i) fixed[16 + i] = uint8_t(sum >> (8 * i));  // the header's checksum field
    try {
      decode_and_check(fixed);
    } catch (const WireError&) {}
  }
  return 0;
}
