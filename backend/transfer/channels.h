// The in-process channels: sim (modelled time) and copy (two KV stores in one process).
#pragma once
#include <deque>
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
  // Nothing is written, so stopping is immediate: the link is free from `now` for what the
  // transfer had not sent yet, unless a transfer is booked behind it (that one keeps its slot).
  bool abort(uint64_t ticket, Time now) override;

 private:
  // A transfer's slot on the link. Its end was announced at start() (the engine's completion is
  // posted for then), so a slot never moves; an abort only cuts the aborted one short.
  struct Booking {
    uint64_t ticket;
    Time on_wire, off_wire;
  };
  ChannelModel m_;
  Time link_free_ = 0;            // when the transfers booked so far have left the wire
  std::deque<Booking> bookings_;  // those not known to be off the wire, in link order
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
  bool abort(uint64_t, Time) override { return true; }
  bool relayouts() const { return relayout_; }

 private:
  kv_store_i& from_;
  kv_store_i& to_;
  KvLayout from_layout_, to_layout_;
  bool relayout_ = false;
  std::vector<std::byte> staging_, relaid_;  // grow to the largest transfer, reused
};

}  // namespace tandem
