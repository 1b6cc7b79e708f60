// The workload's disaggregation section (stage 4): one prefill and one decode instance, their
// overrides of the engine section, and the KV channel between them. Absent or enabled: false,
// the run is stage 3 exactly, and the resolved workload prints no such section.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "backend/transfer/auth.h"
#include "backend/transfer/channel_kind.h"
#include "sim/workload/config_sections.h"

namespace tandem {
std::string_view to_string(FirstTokenFrom f) { return f == FirstTokenFrom::Decode ? "decode" : "prefill"; }
}  // namespace tandem

namespace tandem::config_detail {

namespace {

InstanceOverrides parse_overrides(const Field& f, const EngineSpec& e, const ModelSpec& m, const HardwareSpec& hw,
                                  const char* role) {
  InstanceOverrides o;
  if (!f.present()) return o;
  // The link between prefill and decode is one, the channel's; an instance's own link (its TP
  // all-reduces) is part of its hardware. A link given on one instance would price nothing.
  for (const char* k : {"link", "bandwidth_gbs", "latency_us", "link_bandwidth_gbs", "link_latency_us"})
    if (f.is_map() && f.has(k))
      f[k].fail(fmt::format(
          "an instance has no link of its own to the other: the prefill-decode link is disaggregation.channel "
          "(bandwidth_gbs and latency_us, or profile); the link between this instance's GPUs (its tp all-reduces) is "
          "its hardware's: disaggregation.{}.hardware.link_bandwidth_gbs and link_latency_us",
          role));
  f.expect_map({"max_num_seqs", "max_num_batched_tokens", "max_num_partial_prefills", "num_kv_blocks", "tp", "device",
                "hardware"});
  if (f.has("hardware")) o.hardware = parse_hardware(f["hardware"], hw);
  if (f.has("max_num_seqs")) o.max_num_seqs = int32_t(f.get_int("max_num_seqs", 0, 1, 1 << 20));
  if (f.has("max_num_batched_tokens"))
    o.max_num_batched_tokens = int32_t(f.get_int("max_num_batched_tokens", 0, 1, kI32Max));
  if (f.has("max_num_partial_prefills"))
    o.max_num_partial_prefills = int32_t(f.get_int("max_num_partial_prefills", 0, 1, 1 << 20));
  if (f.has("num_kv_blocks")) o.num_kv_blocks = int32_t(f.get_int("num_kv_blocks", 0, 1, 1 << 27));
  if (f.has("tp")) {
    o.tp = int32_t(f.get_int("tp", 0, 1, 1024));
    if (const std::string why = m.tp_split_problem(*o.tp); !why.empty()) f["tp"].fail(why);
  }
  if (f.has("device")) o.device = int32_t(f.get_int("device", 0, 0, 1023));
  const int32_t budget = o.max_num_batched_tokens.value_or(e.max_num_batched_tokens);
  if (e.enable_chunked_prefill && budget < e.block_size)
    f["max_num_batched_tokens"].fail(fmt::format(
        "with chunked prefill the token budget ({}) is the chunk size and must be at least one block ({} tokens)", budget,
        e.block_size));
  return o;
}

// A channel's measured times: [[bytes, seconds], ...], bytes strictly increasing, seconds
// positive and never decreasing (a larger transfer does not take less time).
std::vector<ChannelPoint> parse_channel_table(const Field& f) {
  if (!f.is_seq() || f.items().empty()) f.fail("a list of [bytes, seconds] pairs (at least one)");
  std::vector<ChannelPoint> t;
  for (const Field& p : f.items()) {
    if (!p.is_seq() || p.items().size() != 2) p.fail("a [bytes, seconds] pair");
    const ChannelPoint c{p.items()[0].as_double(1, 1e15), p.items()[1].as_double(1e-12, 1e6)};
    if (!t.empty() && c.bytes <= t.back().bytes)
      p.fail(fmt::format("bytes must increase ({} after {})", c.bytes, t.back().bytes));
    if (!t.empty() && c.seconds < t.back().seconds)
      p.fail(fmt::format("seconds must not decrease ({} after {})", c.seconds, t.back().seconds));
    t.push_back(c);
  }
  return t;
}

// The file tandem calibrate --channel writes: kind, a table of measured times, and the line fit
// (bandwidth_gbs, latency_us) of older profiles.
void read_channel_profile(const Field& f, ChannelSpec& ch) {
  YAML::Node n;
  try {
    n = YAML::LoadFile(ch.profile);
  } catch (const YAML::Exception& e) {
    f.fail(fmt::format("{}: not a channel profile: {}", ch.profile, e.what()));
  }
  if (n.IsMap() && n["table"]) {
    const YamlSource src{ch.profile, {}, {}};  // the profile's own file:line:column in messages
    ch.table = parse_channel_table(Field(n["table"], "table", &src));
    return;
  }
  const auto number = [&](const char* key, double lo, double hi) {
    double v = 0;
    try {
      if (!n.IsMap() || !n[key] || !n[key].IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "missing");
      v = n[key].as<double>();
    } catch (const YAML::Exception&) {
      f.fail(fmt::format("{}: '{}' is missing or not a number (a file from tandem calibrate --channel)", ch.profile, key));
    }
    if (!(v >= lo && v <= hi)) f.fail(fmt::format("{}: {} = {} is outside [{}, {}]", ch.profile, key, v, lo, hi));
    return v;
  };
  ch.bandwidth_gbs = number("bandwidth_gbs", 1e-6, 1e6);
  ch.latency_us = number("latency_us", 0, 1e9);
}

YAML::Node overrides_yaml(const InstanceOverrides& o) {
  YAML::Node n(YAML::NodeType::Map);
  if (o.max_num_seqs) n["max_num_seqs"] = *o.max_num_seqs;
  if (o.max_num_batched_tokens) n["max_num_batched_tokens"] = *o.max_num_batched_tokens;
  if (o.max_num_partial_prefills) n["max_num_partial_prefills"] = *o.max_num_partial_prefills;
  // The instance's own cache as resolved (its tp's), so that the output reads back to it.
  if (o.resolved_kv_blocks > 0)
    n["num_kv_blocks"] = o.resolved_kv_blocks;
  else if (o.num_kv_blocks)
    n["num_kv_blocks"] = *o.num_kv_blocks;
  if (o.tp) n["tp"] = *o.tp;
  if (o.device) n["device"] = *o.device;
  if (o.hardware) n["hardware"] = hardware_yaml(*o.hardware);
  return n;
}

}  // namespace

DisaggregationSpec parse_disaggregation(const Field& f, const EngineSpec& engine, const ModelSpec& model,
                                        const HardwareSpec& hardware) {
  DisaggregationSpec d;
  if (!f.present()) return d;
  f.expect_map({"enabled", "prefill", "decode", "channel", "first_token_from"});
  if (f.has("enabled")) d.enabled = f["enabled"].as_bool();
  if (f.has("first_token_from")) {
    const std::string from = f.get_string("first_token_from", "prefill");
    if (from == "decode")
      d.first_token_from = FirstTokenFrom::Decode;
    else if (from != "prefill")
      f["first_token_from"].fail(fmt::format("unknown source '{}' (known: prefill, decode)", from));
  }
  d.prefill = parse_overrides(f["prefill"], engine, model, hardware, "prefill");
  d.decode = parse_overrides(f["decode"], engine, model, hardware, "decode");
  if (f.has("channel")) {
    // Three ways to price a transfer: one given with --set replaces the file's others.
    const Field c = f["channel"].prefer_overrides({{"profile"}, {"table"}, {"bandwidth_gbs", "latency_us"}});
    c.expect_map(
        {"kind", "bandwidth_gbs", "latency_us", "table", "layerwise", "timeout_ms", "peer", "secret_file", "profile",
         "link"});
    ChannelSpec& ch = d.channel;
    ch.kind = c.get_string("kind", ch.kind);
    const ChannelKind* kind = find_channel_kind(ch.kind);
    if (!kind)
      c["kind"].fail(fmt::format("unknown channel '{}' (known: {})", ch.kind,
                                 channel_kind_names([](const ChannelKind&) { return true; }, ", ")));
    // A peer and a secret are for a kind whose decode instance is another process.
    const std::string remote_kinds =
        channel_kind_names([](const ChannelKind& k) { return k.remote_decode; }, " or ");
    // A measured channel (tandem calibrate --channel): its bandwidth and latency, unless the
    // section gives them too.
    if (c.has("profile")) {
      ch.profile = c["profile"].as_path();
      c["profile"].require_file(ch.profile);
      read_channel_profile(c["profile"], ch);
    }
    // A named link (NVLink, PCIe, InfiniBand, Ethernet): its nominal bandwidth and assumed
    // latency, each of which bandwidth_gbs or latency_us given beside it overrides.
    if (c.has("link")) {
      const std::string name = c["link"].as_string();
      const std::optional<LinkPreset> l = link_preset(name);
      if (!l) c["link"].fail(fmt::format("unknown link preset '{}' (known: {})", name, link_preset_names()));
      if (c.has("profile") || c.has("table"))
        c["link"].fail("give a link preset or a measured channel (profile, table), not both");
      ch.link = name;
      ch.bandwidth_gbs = l->bandwidth_gbs;
      ch.latency_us = l->latency_us;
    }
    ch.bandwidth_gbs = c.get_double("bandwidth_gbs", ch.bandwidth_gbs, 1e-6, 1e6);
    ch.latency_us = c.get_double("latency_us", ch.latency_us, 0, 1e9);
    if (c.has("profile") && (c.has("bandwidth_gbs") || c.has("latency_us") || c.has("table")))
      c["profile"].fail(
          "give a channel profile, a table or bandwidth_gbs/latency_us, not two of them (one given with --set "
          "replaces the file's others)");
    if (c.has("table")) {
      if (c.has("bandwidth_gbs") || c.has("latency_us"))
        c["table"].fail(
            "give a table or bandwidth_gbs/latency_us, not both (the table's times include the latency; one given "
            "with --set replaces the file's other)");
      ch.table = parse_channel_table(c["table"]);
    }
    if (c.has("layerwise")) ch.layerwise = c["layerwise"].as_bool();
    ch.timeout_ms = c.get_double("timeout_ms", ch.timeout_ms, 1, 1e9);
    ch.peer = c.get_string("peer", "");
    if (!ch.peer.empty()) {
      const size_t colon = ch.peer.rfind(':');
      const bool port_ok = colon != std::string::npos && colon + 1 < ch.peer.size() &&
                           ch.peer.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
                           ch.peer.size() - colon - 1 <= 5 && std::stoi(ch.peer.substr(colon + 1)) <= 65535 &&
                           std::stoi(ch.peer.substr(colon + 1)) > 0;
      if (colon == 0 || !port_ok) c["peer"].fail(fmt::format("'{}' is not HOST:PORT (port 1-65535)", ch.peer));
      if (!kind->remote_decode) c["peer"].fail(fmt::format("a peer is for the {} channel only", remote_kinds));
    }
    if (c.has("secret_file")) {
      ch.secret_file = c["secret_file"].as_path();
      c["secret_file"].require_file(ch.secret_file);
      try {  // the rules the worker applies: the trimmed length, no access by group or others
        (void)transfer::read_secret_file(ch.secret_file);
      } catch (const InputError& e) {
        c["secret_file"].fail(e.what());
      }
      if (!kind->remote_decode)
        c["secret_file"].fail(fmt::format("a secret is for the {} channel only", remote_kinds));
    }
  }
  if (d.enabled && engine.policy == BatchingPolicy::Static)
    f["enabled"].fail(
        "prefill/decode separation needs continuous batching (engine.policy: continuous): a static batch cannot "
        "hand its members off one by one");
  return d;
}

YAML::Node disaggregation_yaml(const DisaggregationSpec& d) {
  YAML::Node n;
  n["enabled"] = d.enabled;
  n["first_token_from"] = std::string(to_string(d.first_token_from));
  n["prefill"] = overrides_yaml(d.prefill);
  n["decode"] = overrides_yaml(d.decode);
  YAML::Node c;
  c["kind"] = d.channel.kind;
  if (!d.channel.link.empty()) c["link"] = d.channel.link;  // the numbers below as resolved (overrides included)
  if (d.channel.table.empty()) {
    c["bandwidth_gbs"] = yaml_number(d.channel.bandwidth_gbs);
    c["latency_us"] = yaml_number(d.channel.latency_us);
  } else {
    YAML::Node t(YAML::NodeType::Sequence);
    for (const ChannelPoint& p : d.channel.table) {
      YAML::Node pair(YAML::NodeType::Sequence);
      pair.push_back(yaml_number(p.bytes));
      pair.push_back(yaml_number(p.seconds));
      pair.SetStyle(YAML::EmitterStyle::Flow);
      t.push_back(pair);
    }
    t.SetStyle(YAML::EmitterStyle::Flow);
    c["table"] = t;
  }
  c["layerwise"] = d.channel.layerwise;
  c["timeout_ms"] = yaml_number(d.channel.timeout_ms);
  if (!d.channel.peer.empty()) c["peer"] = d.channel.peer;
  if (!d.channel.secret_file.empty()) c["secret_file"] = yaml_path(d.channel.secret_file);
  n["channel"] = c;
  return n;
}

}  // namespace tandem::config_detail
