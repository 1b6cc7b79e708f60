#include "backend/transfer/channel_kind.h"

#include <fmt/format.h>

#include <stdexcept>
#include <deque>
#include <vector>

#include "backend/transfer/channels.h"

namespace tandem {

namespace {
// The table. The implementations: SimChannel and CopyChannel (channels.h), the tcp channel
// (sim/remote/tcp_channel.h, with its worker), the CUDA module's device copy and nccl
// (backend/cuda/cuda_channels.cpp).
// A deque: a row found stays where it is when a test adds one.
std::deque<ChannelKind>& table() {
  static std::deque<ChannelKind> rows = {
      {.name = "sim", .where = "modelled", .moves_kv = false, .in_process = {}},
      {.name = "copy",
       .where = "one process",
       .device = DeviceChannel::copy,
       .in_process = [](kv_store_i& from, kv_store_i& to) -> std::unique_ptr<kv_channel_i> {
         return std::make_unique<CopyChannel>(from, to);
       }},
      {.name = "tcp", .where = "two processes", .remote_decode = true, .in_process = {}},
      {.name = "nccl", .where = "two GPUs", .needs_cuda = true, .device = DeviceChannel::nccl, .in_process = {}},
  };
  return rows;
}
}  // namespace

const ChannelKind* find_channel_kind(std::string_view name) {
  for (const ChannelKind& k : table())
    if (k.name == name) return &k;
  return nullptr;
}

const ChannelKind& channel_kind(std::string_view name) {
  if (const ChannelKind* k = find_channel_kind(name)) return *k;
  throw std::logic_error(fmt::format("no KV channel kind '{}' (the workload parser should have refused it)", name));
}

const std::deque<ChannelKind>& channel_kinds() { return table(); }

std::string channel_kind_names(const std::function<bool(const ChannelKind&)>& keep, std::string_view last_sep,
                               bool with_where) {
  std::vector<std::string> names;
  for (const ChannelKind& k : table())
    if (keep(k)) names.push_back(with_where ? fmt::format("{} ({})", k.name, k.where) : k.name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? std::string(last_sep) : std::string(", ");
    out += names[i];
  }
  return out;
}

void register_channel_kind(ChannelKind kind) {
  for (ChannelKind& k : table())
    if (k.name == kind.name) {
      k = std::move(kind);
      return;
    }
  table().push_back(std::move(kind));
}

}  // namespace tandem
