#include "sim/decode_worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <boost/program_options.hpp>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "backend/cpu/kernels.h"
#include "backend/transfer/auth.h"
#include "backend/warmup.h"
#include "core/error.h"
#include "sim/executors.h"
#include "sim/yaml_reader.h"

extern char** environ;

namespace tandem {

using namespace transfer;
using std::chrono::milliseconds;

namespace {

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

// HOST:PORT, already checked by the workload parser (or the worker's options).
std::pair<std::string, uint16_t> split_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) throw InputError(fmt::format("'{}' is not HOST:PORT", s));
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    throw InputError(fmt::format("'{}' is not HOST:PORT (port 0-65535)", s));
  return {s.substr(0, colon), uint16_t(std::stoi(port))};
}

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

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
std::span<const uint8_t> as_u8(std::span<const std::byte> v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size()};
}

}  // namespace

// The decode instance's executor here: a step goes out as a frame; its answer comes back as a
// StepFinished in the inbox.
class DecodeWorkerLink::RemoteExecutor final : public executor_i {
 public:
  RemoteExecutor(DecodeWorkerLink& owner, std::string name) : owner_(owner), name_(std::move(name)) {}
  StepResult execute(const StepPlan&) override { throw std::logic_error("RemoteExecutor: asynchronous only"); }
  // A send that fails means the worker is gone: the run ends through the inbox, as when the
  // reader sees the connection close (whichever comes first says so).
  void submit(const StepPlan& plan, int64_t step_index) override {
    try {
      owner_.link_->send(MsgType::Step, encode_step(uint64_t(step_index), plan));
    } catch (const std::exception& e) {
      owner_.post(PeerLost{fmt::format("the decode worker at {}: sending step {} failed: {}", owner_.peer_, step_index,
                                       e.what())});
    }
  }
  bool asynchronous() const override { return true; }
  bool remote() const override { return true; }
  std::string name() const override { return name_; }
  bool simulated() const override { return false; }
  bool needs_tokens() const override { return true; }

 private:
  DecodeWorkerLink& owner_;
  std::string name_;
};

// Reads the prompt's blocks from the prefill instance's KV store and pushes them with a checksum
// per block; the worker's KvAck ends the ticket. Its abort is never synchronous: the push may
// already be on the wire, and only the worker's answer says it was written (or not).
class DecodeWorkerLink::TcpChannel final : public kv_channel_i {
 public:
  TcpChannel(DecodeWorkerLink& owner, kv_store_i& from) : owner_(owner), from_(from) {}
  std::string name() const override { return "tcp"; }
  TransferStart start(const KvTransfer& t) override {
    KvPushMsg m;
    m.ticket = t.ticket;
    m.request = t.request;
    m.num_tokens = t.num_tokens;
    m.dst_blocks.assign(t.dst_blocks.begin(), t.dst_blocks.end());
    m.payload.resize(t.src_blocks.size() * size_t(from_.block_bytes()));
    from_.read_blocks(t.src_blocks, {reinterpret_cast<std::byte*>(m.payload.data()), m.payload.size()});
    m.block_checksums = block_checksums(m.payload, from_.block_bytes());
    {
      std::lock_guard lock(mu_);
      sent_[t.ticket] =
          Sent{std::chrono::steady_clock::now(), int32_t(t.src_blocks.size()), blocks_digest(m.block_checksums)};
    }
    try {
      owner_.link_->send(m);
    } catch (const std::exception& e) {  // the worker is gone: the run ends (its answer will never come)
      owner_.post(PeerLost{fmt::format("the decode worker at {}: sending transfer {} failed: {}", owner_.peer_,
                                       t.ticket, e.what())});
    }
    return {.async = true, .ok = true, .elapsed = 0, .bytes = int64_t(m.payload.size()), .error = {}};
  }
  bool abort(uint64_t, Time) override { return false; }
  // The worker's answer, judged here, not taken on its word: the transfer delivered only if the
  // worker wrote every block and what it read back has the digest of what was sent. A short
  // count is a partial transfer, another digest a corrupt one; either fails this transfer alone.
  TransferDone judge(const KvAckMsg& a) {
    std::lock_guard lock(mu_);
    const auto it = sent_.find(a.ticket);
    if (it == sent_.end()) return {a.ticket, false, 0, TransferFault::Error};  // not ours: stale for the engine
    const Sent s = it->second;
    sent_.erase(it);
    const Duration d =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - s.at).count();
    TransferDone done{a.ticket, false, d, TransferFault::Error};
    std::string why = a.error;
    if (a.status == KvAckStatus::Corrupt) {
      done.fault = TransferFault::Corrupt;
    } else if (a.status == KvAckStatus::Written && a.blocks_written != s.blocks) {
      done.fault = TransferFault::Partial;
      why = fmt::format("{} of {} blocks written", a.blocks_written, s.blocks);
    } else if (a.status == KvAckStatus::Written && a.digest != s.digest) {
      done.fault = TransferFault::Corrupt;
      why = "the blocks the worker read back differ from the ones sent (digest mismatch)";
    } else if (a.status == KvAckStatus::Written) {
      done.ok = true;
      done.fault = TransferFault::None;
    }
    if (!done.ok)
      std::cerr << fmt::format("tandem: transfer {} to the decode worker at {} failed ({}): {}\n", a.ticket,
                               owner_.peer_,
                               done.fault == TransferFault::Corrupt   ? "corrupt"
                               : done.fault == TransferFault::Partial ? "partial"
                                                                      : "error",
                               why);
    return done;
  }

 private:
  struct Sent {
    std::chrono::steady_clock::time_point at;
    int32_t blocks = 0;
    uint64_t digest = 0;  // blocks_digest of the checksums sent
  };
  DecodeWorkerLink& owner_;
  kv_store_i& from_;
  std::mutex mu_;
  std::map<uint64_t, Sent> sent_;
};

DecodeWorkerLink::DecodeWorkerLink(const Workload& w, const InstanceSpec& decode, const std::string& backend,
                                   int threads, kv_store_i* prefill_kv)
    : decode_instance_(decode.id), timeout_(milliseconds(int64_t(w.disaggregation.channel.timeout_ms))) {
  if (!prefill_kv) throw InputError(fmt::format("the tcp channel: the {} backend exposes no KV store", backend));
  const ChannelSpec& ch = w.disaggregation.channel;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (ch.peer.empty()) {
    start_child(backend, threads, w.model.checkpoint);
    port = child_port_;
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
    executor_ = std::make_unique<RemoteExecutor>(*this, ok.backend + "@" + peer_);
    channel_ = std::make_unique<TcpChannel>(*this, *prefill_kv);
    if (ok.idle_timeout_ms > 0) start_heartbeat(milliseconds(ok.idle_timeout_ms));
  } catch (...) {  // a child started for this run goes with it
    detach();
    throw;
  }
}

DecodeWorkerLink::~DecodeWorkerLink() { detach(); }
executor_i& DecodeWorkerLink::executor() { return *executor_; }
kv_channel_i& DecodeWorkerLink::channel() { return *channel_; }

void DecodeWorkerLink::start_child(const std::string& backend, int threads, const std::string& checkpoint) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("tcp channel: pipe() failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::string threads_s = std::to_string(threads);
  std::vector<std::string> args = {"tandem", "worker", "--listen", "127.0.0.1:0", "--once", "--backend", backend};
  if (backend == "cpu") args.insert(args.end(), {"--threads", threads_s});
  // Its checkpoint root is this run's checkpoint: it serves that folder and nothing else.
  if (!checkpoint.empty()) args.insert(args.end(), {"--checkpoint-root", checkpoint});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&child_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    child_ = -1;
    throw std::runtime_error(fmt::format("tcp channel: starting the decode worker failed: {}", std::strerror(rc)));
  }
  // Its first line says where it listens: "tandem worker: listening on 127.0.0.1:PORT".
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (line.find('\n') == std::string::npos) {
    pollfd p{fds[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    char buf[256];
    ssize_t n = 0;
    if (left <= 0 || poll(&p, 1, int(left)) <= 0 || (n = read(fds[0], buf, sizeof buf)) <= 0) break;
    line.append(buf, size_t(n));
  }
  close(fds[0]);
  const size_t colon = line.rfind(':');
  const size_t nl = line.find('\n');
  if (nl == std::string::npos || colon == std::string::npos || colon > nl) {
    detach();
    throw std::runtime_error("tcp channel: the decode worker did not say where it listens (it failed to start)");
  }
  child_port_ = uint16_t(std::stoi(line.substr(colon + 1, nl - colon - 1)));
}

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
  if (child_ > 0) {  // a child ends at Bye (or at the closed connection); one that does not is killed
    while (waitpid(child_, nullptr, WNOHANG) != child_) {
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(child_, SIGKILL);
        waitpid(child_, nullptr, 0);
        break;
      }
      usleep(10'000);
    }
    child_ = -1;
  }
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

// ---- the worker ----

namespace {

struct WorkerOptions {
  std::string backend = "cpu";
  std::string secret;                                    // empty: none (loopback only)
  milliseconds idle_timeout{60'000};                     // 0: never
  std::optional<std::filesystem::path> checkpoint_root;  // canonical; none: no checkpoint served
  FaultInjection faults;
};

enum class PushFault : uint8_t { None, Fail, Corrupt, Partial };

// How the two sides' blocks relate, and the buffers a push reuses.
struct PushContext {
  kv_store_i& kv;
  KvLayout prefill, decode;
  bool relayout = false;
  std::vector<std::byte> relaid, back, back_relaid;
};

// A push, in order: each block checked against the sender's checksum (the frame's checksum
// covered the wire; this covers the bytes from the sender's blocks to here), the blocks written
// (re-laid out where the two sides' TP differ), read back and checked again, and the answer: the
// blocks written and the digest of what was read, in the sender's layout. A push is reported
// written only once its bytes read back (LMCache #1350: a completion before the bytes are
// readable lets the decode read garbage). A write that fails fails this transfer alone.
// `fault` (test only, --inject-transfer-faults): Fail answers Failed before writing; Corrupt
// flips a byte after the frame's check (the content check must find it); Partial writes the
// first half of the blocks only and says so (the sender must count it).
KvAckMsg write_push(KvPushMsg& m, PushContext& c, PushFault fault) {
  KvAckMsg ack;
  ack.ticket = m.ticket;
  const int64_t block_bytes = c.prefill.block_bytes();
  const size_t n = m.dst_blocks.size();
  if (fault == PushFault::Fail) {
    ack.status = KvAckStatus::Failed;
    ack.error = "injected failure (--inject-transfer-faults, test only): nothing written";
    return ack;
  }
  if (fault == PushFault::Corrupt)  // an exponent bit of a value in the middle block: a large error if used
    m.payload[(n / 2) * size_t(block_bytes) + 3] ^= 0x40;
  const std::vector<uint64_t> arrived = block_checksums(m.payload, block_bytes);
  for (size_t i = 0; i < n; ++i)
    if (arrived[i] != m.block_checksums[i]) {
      ack.status = KvAckStatus::Corrupt;
      ack.error = fmt::format("block {} of {} (for block {}) does not match its checksum: nothing written", i, n,
                              m.dst_blocks[i]);
      return ack;
    }
  const size_t written = fault == PushFault::Partial ? n / 2 : n;
  const std::span<const int32_t> blocks = std::span(m.dst_blocks).first(written);
  try {
    std::span<const std::byte> in = as_bytes(m.payload).first(written * size_t(block_bytes));
    if (c.relayout) {
      c.relaid.resize(in.size());
      relayout_kv_blocks(c.prefill, c.decode, in, c.relaid);
      in = c.relaid;
    }
    c.kv.write_blocks(blocks, in);
    c.back.resize(written * size_t(c.kv.block_bytes()));
    c.kv.read_blocks(blocks, c.back);
    std::span<const std::byte> seen = c.back;
    if (c.relayout) {
      c.back_relaid.resize(written * size_t(block_bytes));
      relayout_kv_blocks(c.decode, c.prefill, c.back, c.back_relaid);
      seen = c.back_relaid;
    }
    const std::vector<uint64_t> read = block_checksums(as_u8(seen), block_bytes);
    for (size_t i = 0; i < written; ++i)
      if (read[i] != m.block_checksums[i]) {
        ack.status = KvAckStatus::Corrupt;
        ack.error =
            fmt::format("block {} of {} (block {}) reads back other bytes than were written", i, n, m.dst_blocks[i]);
        return ack;
      }
    ack.status = KvAckStatus::Written;
    ack.blocks_written = int32_t(written);
    ack.digest = blocks_digest(read);
  } catch (const std::exception& e) {
    ack.status = KvAckStatus::Failed;
    ack.error = fmt::format("writing {} blocks failed: {}", written, e.what());
  }
  return ack;
}

// The injected fault for the next push (FaultInjection), drawn in push order: a given push
// number first, else by the probabilities.
class FaultDraw {
 public:
  explicit FaultDraw(const FaultInjection& f) : f_(f), rng_(f.seed) {}
  PushFault next() {
    ++pushes_;
    if (f_.fail_at.count(pushes_)) return PushFault::Fail;
    if (f_.corrupt_at.count(pushes_)) return PushFault::Corrupt;
    if (f_.partial_at.count(pushes_)) return PushFault::Partial;
    if (f_.fail + f_.corrupt + f_.partial <= 0) return PushFault::None;
    const double u = double(rng_() >> 11) * 0x1.0p-53;
    if (u < f_.fail) return PushFault::Fail;
    if (u < f_.fail + f_.corrupt) return PushFault::Corrupt;
    if (u < f_.fail + f_.corrupt + f_.partial) return PushFault::Partial;
    return PushFault::None;
  }

 private:
  const FaultInjection& f_;
  std::mt19937_64 rng_;
  int64_t pushes_ = 0;
};

// One connection: Hello, then steps and KV pushes until Bye or the connection ends. A frame
// that does not check ends the connection (the peer is not to be trusted), never the process.
int serve(TcpLink& link, const WorkerOptions& o, const ExecutorFactory* cuda) {
  // One connection at a time: one that says nothing gives way soon. Until the Hello is in, no
  // frame may be larger than a Hello can be.
  const milliseconds hello_timeout(10'000);
  link.set_max_payload(uint64_t{17} << 20);
  if (!o.secret.empty()) authenticate_as_server(link, o.secret, hello_timeout);
  Frame f = link.receive(hello_timeout);
  if (f.type != MsgType::Hello) throw WireError(fmt::format("expected Hello, got {}", msg_type_name(f.type)));
  const HelloMsg hello = decode_hello(f.payload);
  if (hello.protocol != kProtocolVersion)
    throw WireError(fmt::format("protocol {} (this worker speaks {})", hello.protocol, kProtocolVersion));
  std::unique_ptr<executor_i> exec;
  Workload w;
  try {
    w = decode_instance_workload(hello.workload_yaml, "decode workload from " + link.peer(), o.checkpoint_root);
    exec = make_executor(w, o.backend, cuda);
    if (!exec->kv_store()) throw InputError(fmt::format("the {} backend exposes no KV store", o.backend));
    warm_up(*exec, warm_up_shape(w));
  } catch (const std::exception& e) {
    link.send(ErrorMsg{e.what()});
    std::cerr << "tandem worker: refused the decode instance: " << e.what() << "\n";
    return 2;
  }
  kv_store_i& kv = *exec->kv_store();
  // Before any block moves: the prefill side's blocks must be ones this pool can hold, as they
  // are or re-laid out (another tensor-parallel split); anything else is refused naming both.
  const KvLayout decode_layout = kv.kv_layout();
  const KvLayoutCheck layouts = check_kv_layouts(hello.prefill_layout, decode_layout);
  if (layouts.match == KvLayoutMatch::Incompatible) {
    link.send(ErrorMsg{layouts.why});
    std::cerr << "tandem worker: refused the decode instance: " << layouts.why << "\n";
    return 2;
  }
  link.set_max_payload(kDefaultMaxPayload);
  // A client that stops reading must not hold this worker either: no send waits longer than the
  // idle timeout.
  if (o.idle_timeout.count() > 0) link.set_write_timeout(o.idle_timeout);
  link.send(HelloOkMsg{kv.num_blocks(), kv.block_bytes(), exec->name(), decode_layout,
                       uint32_t(std::min<int64_t>(o.idle_timeout.count(), UINT32_MAX))});
  // Steps run on their own thread, one at a time in arrival order; KV pushes are written as they
  // arrive, beside a running step: the blocks a push fills belong to a request the scheduler
  // will not schedule before this push's KvAck, so no step reads them meanwhile, and a push
  // never waits behind a decode step (as an RDMA write would not).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<DecodedStep> steps;
  bool done = false;
  PushContext push{kv, hello.prefill_layout, decode_layout, layouts.match == KvLayoutMatch::Relayout, {}, {}, {}};
  FaultDraw faults(o.faults);
  std::thread stepper([&] {
    for (;;) {
      DecodedStep d;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return done || !steps.empty(); });
        if (steps.empty()) return;
        d = std::move(steps.front());
        steps.pop_front();
      }
      if (o.faults.delay_step_ms > 0) std::this_thread::sleep_for(milliseconds(o.faults.delay_step_ms));
      StepReplyMsg r;
      r.step = d.step;
      try {
        StepResult res = exec->execute(d.plan);
        r.elapsed_ns = res.elapsed;
        r.sampled = std::move(res.sampled);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      try {
        link.send(r);
      } catch (const std::exception&) {  // the connection is gone; the receive loop ends too
        return;
      }
    }
  });
  const auto stop_stepper = [&] {
    {
      std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_one();
    stepper.join();
  };
  // What this connection served, for the worker's line at its end.
  int64_t num_steps = 0, num_pushes = 0, push_bytes = 0;
  const auto served_since = std::chrono::steady_clock::now();
  // Without an idle timeout a closed peer still ends the wait at once; a stopped one would not.
  const milliseconds idle = o.idle_timeout.count() > 0 ? o.idle_timeout : milliseconds(int64_t(24) * 3600 * 1000);
  try {
    for (;;) {
      const Frame f = link.receive(idle);
      if (f.type == MsgType::Step) {
        DecodedStep d = decode_step(f.payload);
        ++num_steps;
        check_block_ids(d, kv.num_blocks());
        check_table_lengths(d, w.engine.block_size);
        {
          std::lock_guard lock(mu);
          steps.push_back(std::move(d));
        }
        cv.notify_one();
      } else if (f.type == MsgType::KvPush) {
        ++num_pushes;
        push_bytes += int64_t(f.payload.size());
        KvPushMsg m = decode_kv_push(f.payload);
        check_kv_push(m, kv.num_blocks(), hello.prefill_layout.block_bytes(), w.engine.block_size);
        const KvAckMsg ack = write_push(m, push, faults.next());
        if (o.faults.delay_ack_ms > 0) std::this_thread::sleep_for(milliseconds(o.faults.delay_ack_ms));
        link.send(ack);
      } else if (f.type == MsgType::Ping) {
        (void)decode_ping(f.payload);  // the client is alive: the next wait starts afresh
      } else if (f.type == MsgType::Bye) {
        stop_stepper();  // the steps already taken are answered first
        // One line a run served, so that a worker in a terminal of its own shows it did something.
        std::cout << fmt::format(
                         "tandem worker: served a run from {}: model {} on {}, {} decode steps, {} KV pushes ({:.1f} "
                         "MB), {:.1f} s",
                         link.peer(), w.model.name, exec->name(), num_steps, num_pushes, double(push_bytes) / 1e6,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - served_since).count())
                  << std::endl;
        return 0;
      } else {
        throw WireError(fmt::format("unexpected {} frame", msg_type_name(f.type)));
      }
    }
  } catch (...) {
    link.close();  // a stepper blocked sending to a client that stopped reading wakes and leaves
    stop_stepper();
    throw;
  }
}

// "0.05" (a probability per push) or "@3:7" (pushes 3 and 7, counted from 1 per connection).
void parse_fault_rate(const std::string& key, const std::string& v, double& p, std::set<int64_t>& at) {
  const auto bad = [&] {
    throw InputError(
        fmt::format("--inject-transfer-faults: {}={}: expected a probability in [0, 1] or @N[:N...] "
                    "(push numbers from 1)",
                    key, v));
  };
  if (!v.empty() && v[0] == '@') {
    std::stringstream ss(v.substr(1));
    std::string n;
    while (std::getline(ss, n, ':')) {
      if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos) bad();
      const int64_t k = std::stoll(n);
      if (k < 1) bad();
      at.insert(k);
    }
    if (at.empty()) bad();
    return;
  }
  size_t used = 0;
  try {
    p = std::stod(v, &used);
  } catch (const std::exception&) {
    bad();
  }
  if (used != v.size() || !(p >= 0 && p <= 1)) bad();
}

}  // namespace

FaultInjection parse_fault_injection(const std::string& spec) {
  FaultInjection f;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(
          fmt::format("--inject-transfer-faults: '{}' is not KEY=VALUE (keys: fail, corrupt, partial, "
                      "seed, delay_ack_ms, delay_step_ms)",
                      item));
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    const auto number = [&](int64_t max) {
      if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoull(v) > uint64_t(max))
        throw InputError(fmt::format("--inject-transfer-faults: {}={}: expected an integer in [0, {}]", key, v, max));
      return int64_t(std::stoull(v));
    };
    if (key == "fail")
      parse_fault_rate(key, v, f.fail, f.fail_at);
    else if (key == "corrupt")
      parse_fault_rate(key, v, f.corrupt, f.corrupt_at);
    else if (key == "partial")
      parse_fault_rate(key, v, f.partial, f.partial_at);
    else if (key == "seed")
      f.seed = uint64_t(number(INT64_MAX));
    else if (key == "delay_ack_ms")
      f.delay_ack_ms = number(600'000);
    else if (key == "delay_step_ms")
      f.delay_step_ms = number(600'000);
    else
      throw InputError(
          fmt::format("--inject-transfer-faults: unknown key '{}' (keys: fail, corrupt, partial, seed, "
                      "delay_ack_ms, delay_step_ms)",
                      key));
  }
  if (f.fail + f.corrupt + f.partial > 1)
    throw InputError(fmt::format("--inject-transfer-faults: fail + corrupt + partial = {} exceeds 1",
                                 f.fail + f.corrupt + f.partial));
  return f;
}

std::string describe(const FaultInjection& f) {
  std::string s;
  const auto rate = [&](const char* name, double p, const std::set<int64_t>& at) {
    if (p > 0) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", name, p);
    for (int64_t k : at) s += fmt::format("{}{} at push {}", s.empty() ? "" : ", ", name, k);
  };
  rate("fail", f.fail, f.fail_at);
  rate("corrupt", f.corrupt, f.corrupt_at);
  rate("partial", f.partial, f.partial_at);
  if (f.fail + f.corrupt + f.partial > 0) s += fmt::format(", seed {}", f.seed);
  if (f.delay_ack_ms > 0) s += fmt::format("{}acks delayed {} ms", s.empty() ? "" : ", ", f.delay_ack_ms);
  if (f.delay_step_ms > 0) s += fmt::format("{}steps delayed {} ms", s.empty() ? "" : ", ", f.delay_step_ms);
  return s;
}

bool FaultInjection::any() const {
  return fail + corrupt + partial > 0 || !fail_at.empty() || !corrupt_at.empty() || !partial_at.empty() ||
         delay_ack_ms > 0 || delay_step_ms > 0;
}

namespace {

// Whether `p` is `root` or below it (both absolute and normalised).
bool within(const std::filesystem::path& p, const std::filesystem::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

}  // namespace

Workload decode_instance_workload(const std::string& hello_yaml, const std::string& from,
                                  const std::optional<std::filesystem::path>& checkpoint_root) {
  namespace fs = std::filesystem;
  YAML::Node root = load_yaml_file_document(hello_yaml, from, "a decode instance");
  if (!root.IsMap()) throw InputError(fmt::format("{}: the decode instance is not a mapping", from));
  YAML::Node taken(YAML::NodeType::Map);
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "(not a name)";
      if (key != "name" && key != "seed" && key != "model" && key != "engine")
        throw InputError(
            fmt::format("{}: '{}': a worker takes a decode instance's name, seed, model and engine only", from, key));
      taken[key] = kv.second;
    }
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: {}", from, e.what()));
  }
  YAML::Node model = taken["model"];
  if (model.IsMap() && model["checkpoint"]) {
    // One answer for every path outside the root, whether it exists or not, before anything of it
    // is opened: a client that did not authenticate learns nothing of this host's files.
    const YAML::Node c = model["checkpoint"];
    const std::string given = c.IsScalar() ? c.Scalar() : "";
    const auto refuse = [&]() -> void {
      throw InputError(
          checkpoint_root
              ? fmt::format("{}: field 'model.checkpoint': '{}' is not under this worker's --checkpoint-root: not "
                            "served",
                            from, given)
              : fmt::format("{}: field 'model.checkpoint': this worker serves no checkpoint (it was started without "
                            "--checkpoint-root)",
                            from));
    };
    if (!checkpoint_root || given.empty()) refuse();
    std::error_code ec, root_ec;
    const fs::path base = fs::weakly_canonical(*checkpoint_root, root_ec);
    fs::path p(given);
    if (p.is_relative()) p = base / p;
    const fs::path resolved = fs::weakly_canonical(p, ec);  // symlinks followed, ".." resolved
    if (ec || root_ec || !within(resolved, base)) refuse();
    model["checkpoint"] = resolved.string();
  }
  // Placeholders: a worker neither prices steps (hardware) nor makes requests; the engine section
  // carries the resolved KV cache size.
  taken["hardware"] = YAML::Load(
      "{name: decode-worker, peak_tflops: 1, mem_bandwidth_tbs: 1, step_overhead_us: 0, memory_gb: 1, "
      "link_bandwidth_gbs: 1, link_latency_us: 0}");
  taken["requests"] = YAML::Load("{count: 1, arrival: {process: burst}, prompt_len: 1, output_len: 1}");
  YAML::Emitter out;
  out << taken;
  return parse_workload(out.c_str(), from);
}

int worker_command(const std::vector<std::string>& args, const std::function<std::unique_ptr<executor_i>(Workload&)>* cuda) {
  namespace po = boost::program_options;
  namespace fs = std::filesystem;
  po::options_description opts("options");
  opts.add_options()("listen", po::value<std::string>(), "HOST:PORT to listen on (port 0: any free port)")(
      "backend", po::value<std::string>()->default_value("cpu"), "cpu or cuda: runs the decode instance")(
      "threads", po::value<int>()->default_value(0), "CPU backend threads (0: all cores)")(
      "secret-file", po::value<std::string>(), "a shared secret both sides prove (required off loopback)")(
      "idle-timeout-ms", po::value<int64_t>()->default_value(60000),
      "drop a client that sends nothing this long (a live one pings); 0: never")(
      "checkpoint-root", po::value<std::string>(),
      "serve model.checkpoint folders under DIR only (default: none, dummy weights only)")(
      "once", po::bool_switch(), "serve one connection, then exit (a run's own child)")(
      "inject-transfer-faults", po::value<std::string>(),
      "TEST ONLY: fail, corrupt or cut KV transfers, delay acks or steps (also $TANDEM_WORKER_INJECT)")(
      "help,h", po::bool_switch(), "this help");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    std::cout << "usage: tandem worker --listen HOST:PORT [--backend cpu|cuda] [--threads N] [--secret-file F]\n"
                 "                     [--idle-timeout-ms MS] [--checkpoint-root DIR] [--once]\n"
                 "  serves the decode instance of `tandem run` with disaggregation.channel.kind=tcp "
                 "and disaggregation.channel.peer=HOST:PORT\n"
              << opts;
    return 0;
  }
  if (!vm.count("listen")) throw InputError("--listen HOST:PORT is required");
  const auto [host, port] = split_host_port(vm["listen"].as<std::string>());
  WorkerOptions o;
  o.secret = vm.count("secret-file") ? read_secret_file(vm["secret-file"].as<std::string>()) : "";
  if (!is_loopback(host) && o.secret.empty())
    throw InputError(fmt::format(
        "--listen {}: listening off loopback needs --secret-file (a shared secret the client must prove)", host));
  o.backend = vm["backend"].as<std::string>();
  if (o.backend != "cpu" && !(o.backend == "cuda" && cuda))
    throw InputError(
        fmt::format("--backend {}: not available in this build (known: cpu{})", o.backend, cuda ? ", cuda" : ""));
  const int64_t idle = vm["idle-timeout-ms"].as<int64_t>();
  if (idle < 0 || idle > int64_t(UINT32_MAX))
    throw InputError(fmt::format("--idle-timeout-ms {}: expected 0 (never) to {}", idle, UINT32_MAX));
  o.idle_timeout = milliseconds(idle);
  if (vm.count("checkpoint-root")) {
    const std::string r = vm["checkpoint-root"].as<std::string>();
    std::error_code ec;
    if (!fs::is_directory(r, ec)) throw InputError(fmt::format("--checkpoint-root {}: not a directory", r));
    o.checkpoint_root = fs::canonical(r, ec);
    if (ec) throw InputError(fmt::format("--checkpoint-root {}: {}", r, ec.message()));
  }
  const char* env = std::getenv("TANDEM_WORKER_INJECT");
  if (vm.count("inject-transfer-faults"))
    o.faults = parse_fault_injection(vm["inject-transfer-faults"].as<std::string>());
  else if (env && *env)
    o.faults = parse_fault_injection(env);
  if (o.faults.any()) std::cerr << "tandem worker: TEST ONLY: injecting " << describe(o.faults) << "\n";
  if (o.backend == "cpu") cpu::set_threads(vm["threads"].as<int>());
  // A run's own child writes its "listening on" line into a pipe the run closes once read: its
  // later lines must fail quietly, not end it with SIGPIPE (its sockets send with MSG_NOSIGNAL).
  signal(SIGPIPE, SIG_IGN);
  TcpListener listener(host, port);
  std::cout << fmt::format("tandem worker: listening on {}:{}", host, listener.port()) << std::endl;
  for (;;) {
    int rc = 1;
    try {
      std::unique_ptr<TcpLink> link = listener.accept(milliseconds(int64_t(365) * 24 * 3600 * 1000));
      try {
        rc = serve(*link, o, cuda);
      } catch (const std::exception& e) {
        std::cerr << fmt::format("tandem worker: connection from {} ended: {}\n", link->peer(), e.what());
        try {
          link->send(ErrorMsg{e.what()});
        } catch (const std::exception&) {
        }
      }
    } catch (const TransportError& e) {
      std::cerr << "tandem worker: " << e.what() << "\n";
    }
    if (vm["once"].as<bool>()) return rc;
  }
}

}  // namespace tandem
