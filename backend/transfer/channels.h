// The in-process channels: sim (modelled time) and copy (two KV stores in one process).
#pragma once
#include <memory>
#include <vector>

#include "backend/executor.h"
#include "backend/transfer/channel.h"

namespace tandem {

// One link: transfers that overlap in time share it, each waiting for the ones before it to
// leave the wire (FCFS), as on one NIC; the latency is paid by each.
class SimChannel final : public kv_channel_i {
 public:
  explicit SimChannel(const ChannelModel& m) : m_(m) {}
  std::string name() const override { return "sim"; }
  TransferStart start(const KvTransfer& t) override;
  bool abort(uint64_t) override { return true; }  // nothing is written: stopping is immediate

 private:
  ChannelModel m_;
  Time link_free_ = 0;  // when the transfers started so far have left the wire
};

// Copies the blocks at start(), through a staging buffer, and reports the measured time.
// Synchronous, so an abort always finds it finished. The two stores' layouts are compared at
// construction (kv_layout.h): the same, the blocks move as bytes; different tensor parallelism,
// they are re-laid out on the way (a second buffer); anything else throws InputError naming both.
class CopyChannel final : public kv_channel_i {
 public:
  CopyChannel(kv_store_i& from, kv_store_i& to);
  std::string name() const override { return "copy"; }
  TransferStart start(const KvTransfer& t) override;
  bool abort(uint64_t) override { return true; }
  bool relayouts() const { return relayout_; }

 private:
  kv_store_i& from_;
  kv_store_i& to_;
  KvLayout from_layout_, to_layout_;
  bool relayout_ = false;
  std::vector<std::byte> staging_, relaid_;  // grow to the largest transfer, reused
};

}  // namespace tandem
