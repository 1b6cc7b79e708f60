// The KV channel kinds, one row each (channel_kind.cpp holds the table): what the workload
// parser, the run's wiring and calibrate ask of a kind. No other file compares a kind's name;
// adding a kind is its implementation's file plus one row (or, in a test, register_channel_kind).
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/executor.h"
#include "backend/transfer/channel.h"

namespace tandem {

// Which of the CUDA module's device-to-device channels (backend/cuda/cuda_channels.cpp) serves a
// kind between two CUDA executors of one process: the module switches on this, so that no file
// but the table compares a kind's name.
enum class DeviceChannel { none, copy, nccl };

struct ChannelKind {
  std::string name;
  std::string where;            // where the two instances are, for messages: "one process"
  bool moves_kv = true;         // false: the transfer is only priced (a real backend cannot use it)
  bool remote_decode = false;   // the decode instance is a worker process: takes a peer and a secret
  bool needs_cuda = false;      // built by the CUDA backend's module only (between GPUs)
  DeviceChannel device = DeviceChannel::none;  // the CUDA module's implementation, where it has one
  // Between two KV stores of this process; null where another part builds the channel (the
  // topology prices a modelled one, the run's wiring reaches a remote decode, the CUDA module
  // builds its own). A CUDA build's module is asked first for every kind.
  std::function<std::unique_ptr<kv_channel_i>(kv_store_i& from, kv_store_i& to)> in_process;
};

// The row of `name`, or null if no kind has it.
const ChannelKind* find_channel_kind(std::string_view name);
// The row of a kind the workload parser accepted (std::logic_error if none: a bug).
const ChannelKind& channel_kind(std::string_view name);
// Every row, in the table's order (registered ones last).
const std::deque<ChannelKind>& channel_kinds();
// The names of the rows `keep` accepts, for messages: "copy, tcp or nccl" (`last_sep` " or "),
// "sim, copy, tcp, nccl" (", "); each followed by " (where)" with `with_where`.
std::string channel_kind_names(const std::function<bool(const ChannelKind&)>& keep, std::string_view last_sep,
                               bool with_where = false);
// Adds a row, or replaces the row of the same name. For tests (a kind of their own); not
// thread-safe: call it before any run.
void register_channel_kind(ChannelKind kind);

}  // namespace tandem
