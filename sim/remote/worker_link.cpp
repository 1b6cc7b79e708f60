#include "sim/remote/worker_link.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <iostream>

#include "backend/transfer/auth.h"
#include "core/error.h"
#include "sim/remote/worker_address.h"

namespace tandem {

using namespace transfer;
using std::chrono::milliseconds;

namespace {

// What the worker takes of the decode instance (decode_instance_workload): its name, seed, model
// and engine. Nothing else of this machine (trace or profile paths) goes over.
std::string hello_workload_yaml(const Workload& one) {
  const YAML::Node all = YAML::Load(to_yaml(one));
  YAML::Node n(YAML::NodeType::Map);
  for (const char* k : {"name", "seed", "model", "engine"}) n[k] = all[k];
  YAML::Emitter out;
  out << n;
  return out.c_str();
}

}  // namespace

DecodeWorkerLink::DecodeWorkerLink(const Workload& w, const InstanceSpec& decode, const std::string& backend,
                                   int threads, kv_store_i* prefill_kv)
    : decode_instance_(decode.id), timeout_(milliseconds(int64_t(w.disaggregation.channel.timeout_ms))) {
  if (!prefill_kv) throw InputError(fmt::format("the tcp channel: the {} backend exposes no KV store", backend));
  const ChannelSpec& ch = w.disaggregation.channel;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (ch.peer.empty()) {
    child_ = std::make_unique<WorkerChild>(backend, threads, w.model.checkpoint);
    port = child_->port();
  } else {
    std::tie(host, port) = split_host_port(ch.peer);
    if (!is_loopback(host) && ch.secret_file.empty())
      throw InputError(fmt::format(
          "disaggregation.channel.peer {} is not a loopback address: set disaggregation.channel.secret_file (a "
          "shared secret both sides prove) to use it",
          ch.peer));
  }
  peer_ = fmt::format("{}:{}", host, port);
  if (!ch.peer.empty()) {
    // A worker in another terminal: say where this run waits, since a wrong address shows only as
    // a wait (a refused port fails within a second, a silent host only at timeout_ms).
    std::cerr << fmt::format("tandem: connecting to the decode worker at {} (up to {} ms)\n", peer_, timeout_.count());
    if (threads > 0)
      std::cerr << fmt::format(
          "tandem: --threads {} sets this process's threads only; the worker at {} computes on its own --threads\n",
          threads, peer_);
  }
  try {
    // A child listens before it says so; a peer may still be starting: retried up to the timeout.
    link_ = TcpLink::connect(host, port, timeout_);
    // A worker that stops reading blocks a send; no longer than the timeout.
    link_->set_write_timeout(timeout_);
    if (!ch.secret_file.empty()) authenticate_as_client(*link_, read_secret_file(ch.secret_file), timeout_);
    // The worker builds the decode instance from its own engine section.
    Workload one = instance_workload(w, decode);
    one.disaggregation = DisaggregationSpec{};
    const KvLayout prefill_layout = prefill_kv->kv_layout();
    link_->send(HelloMsg{kProtocolVersion, hello_workload_yaml(one), prefill_layout});
    // The worker answers once its model is built and warmed up: timeout_ms bounds that too (raise
    // it for a large model).
    const Frame f = link_->receive(timeout_);
    if (f.type == MsgType::Error)
      throw InputError(fmt::format("the decode worker at {} refused the decode instance: {}", peer_,
                                   decode_error(f.payload).message));
    if (f.type == MsgType::Challenge)
      throw InputError(fmt::format(
          "the decode worker at {} asks for authentication: set disaggregation.channel.secret_file to its secret",
          peer_));
    if (f.type != MsgType::HelloOk)
      throw std::runtime_error(
          fmt::format("the decode worker at {} answered {} to Hello", peer_, msg_type_name(f.type)));
    const HelloOkMsg ok = decode_hello_ok(f.payload);
    // The worker compared the layouts already; checked here too, so that neither side trusts the other's word.
    if (const KvLayoutCheck c = check_kv_layouts(prefill_layout, ok.decode_layout);
        c.match == KvLayoutMatch::Incompatible)
      throw InputError(fmt::format("the decode worker at {}: {}", peer_, c.why));
    if (ok.block_bytes != ok.decode_layout.block_bytes() || ok.kv_blocks != decode.engine.resolved_kv_blocks)
      throw InputError(fmt::format(
          "the decode worker at {} holds {} KV blocks of {} bytes (its layout says {}); this run expects {} blocks",
          peer_, ok.kv_blocks, ok.block_bytes, ok.decode_layout.block_bytes(), decode.engine.resolved_kv_blocks));
    executor_ = std::make_unique<RemoteExecutor>(*link_, ok.backend + "@" + peer_, peer_,
                                                 [this](Event e) { post(std::move(e)); });
    channel_ = std::make_unique<TcpChannel>(*link_, *prefill_kv, peer_, [this](Event e) { post(std::move(e)); });
    if (ok.idle_timeout_ms > 0) start_heartbeat(milliseconds(ok.idle_timeout_ms));
  } catch (...) {  // a child started for this run goes with it
    detach();
    throw;
  }
}

DecodeWorkerLink::~DecodeWorkerLink() { detach(); }
executor_i& DecodeWorkerLink::executor() { return *executor_; }
kv_channel_i& DecodeWorkerLink::channel() { return *channel_; }

void DecodeWorkerLink::attach(Inbox& inbox) {
  {
    std::lock_guard lock(mu_);
    inbox_ = &inbox;
  }
  link_->start_reader([this](Frame&& f) { on_frame(std::move(f)); },
                      [this](std::string reason) { on_close(reason); });
}

void DecodeWorkerLink::start_heartbeat(milliseconds idle) {
  const milliseconds every = std::max(milliseconds(1), idle / 4);
  heartbeat_ = std::thread([this, every] {
    std::unique_lock lock(mu_);
    while (!heartbeat_cv_.wait_for(lock, every, [&] { return closing_; })) {
      lock.unlock();
      try {  // a short bound: a worker that does not take a ping is the reader's or a deadline's to report
        link_->send(MsgType::Ping, encode(PingMsg{}), std::min(every, milliseconds(1000)));
      } catch (const std::exception&) {}
      lock.lock();
    }
  });
}

void DecodeWorkerLink::detach() {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
    inbox_ = nullptr;
  }
  heartbeat_cv_.notify_all();
  // One grace for the goodbye and the child's exit together: a worker that stopped (SIGSTOP, a
  // hung host) must not hold the end of the run; one that is fine exits at Bye in milliseconds.
  const milliseconds grace = std::min(timeout_, milliseconds(1000));
  const auto deadline = std::chrono::steady_clock::now() + grace;
  if (link_) {
    try {
      link_->send(MsgType::Bye, encode(ByeMsg{}), grace);
    } catch (const std::exception&) {  // already gone, or not reading: nothing to say goodbye to
    }
    link_->close();  // wakes a heartbeat blocked in a send
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (child_) child_->end(deadline);  // it ends at Bye (or at the closed connection); else killed
}

void DecodeWorkerLink::post(Event e) {
  std::lock_guard lock(mu_);
  if (inbox_) inbox_->post(std::move(e));
}

void DecodeWorkerLink::on_frame(Frame&& f) {
  try {
    switch (f.type) {
      case MsgType::StepReply: {
        StepReplyMsg m = decode_step_reply(f.payload);
        if (!m.error.empty()) {
          post(PeerLost{fmt::format("the decode worker at {} failed step {}: {}", peer_, m.step, m.error)});
          return;
        }
        StepResult r;
        r.elapsed = m.elapsed_ns;
        r.sampled = std::move(m.sampled);
        post(StepFinished{decode_instance_, std::move(r)});
        return;
      }
      case MsgType::KvAck: post(channel_->judge(decode_kv_ack(f.payload))); return;
      case MsgType::Error:
        post(PeerLost{fmt::format("the decode worker at {} reported: {}", peer_, decode_error(f.payload).message)});
        return;
      default:
        post(PeerLost{fmt::format("the decode worker at {} sent an unexpected {} frame", peer_, msg_type_name(f.type))});
    }
  } catch (const std::exception& e) {  // a frame that does not decode: the connection is not to be trusted
    post(PeerLost{fmt::format("the decode worker at {} sent a bad frame: {}", peer_, e.what())});
  }
}

void DecodeWorkerLink::on_close(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
  }
  post(PeerLost{fmt::format("the decode worker at {} is gone: {}", peer_, reason)});
}

}  // namespace tandem
