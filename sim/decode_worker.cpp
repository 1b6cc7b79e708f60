#include "sim/decode_worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <fstream>
#include <iostream>
#include <sstream>

#include "backend/cpu/kernels.h"
#include "backend/transfer/auth.h"
#include "backend/warmup.h"
#include "core/error.h"
#include "sim/executors.h"

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

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
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

// Reads the prompt's blocks from the prefill instance's KV store and pushes them; the worker's
// KvAck ends the ticket. Its abort is never synchronous: the push may already be on the wire,
// and only the worker's answer says it was written (or not).
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
    {
      std::lock_guard lock(mu_);
      started_[t.ticket] = std::chrono::steady_clock::now();
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
  // The time from start() to the worker's answer, measured here.
  Duration elapsed(uint64_t ticket) {
    std::lock_guard lock(mu_);
    const auto it = started_.find(ticket);
    if (it == started_.end()) return 0;
    const Duration d = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - it->second).count();
    started_.erase(it);
    return d;
  }

 private:
  DecodeWorkerLink& owner_;
  kv_store_i& from_;
  std::mutex mu_;
  std::map<uint64_t, std::chrono::steady_clock::time_point> started_;
};

DecodeWorkerLink::DecodeWorkerLink(const Workload& w, const InstanceSpec& decode, const std::string& backend,
                                   int threads, kv_store_i* prefill_kv)
    : decode_instance_(decode.id), timeout_(milliseconds(int64_t(w.disaggregation.channel.timeout_ms))) {
  if (!prefill_kv) throw InputError(fmt::format("the tcp channel: the {} backend exposes no KV store", backend));
  const ChannelSpec& ch = w.disaggregation.channel;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (ch.peer.empty()) {
    start_child(backend, threads);
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
  // A child listens before it says so; a peer may still be starting: retried up to the timeout.
  link_ = TcpLink::connect(host, port, timeout_);
  // A worker that stops reading blocks a send; no longer than the timeout.
  link_->set_write_timeout(timeout_);
  if (!ch.secret_file.empty()) authenticate_as_client(*link_, read_secret_file(ch.secret_file), timeout_);
  // The worker builds the decode instance from its own engine section; nothing of the
  // disaggregation section (paths of this machine) goes over.
  Workload one = instance_workload(w, decode);
  one.disaggregation = DisaggregationSpec{};
  const KvLayout prefill_layout = prefill_kv->kv_layout();
  link_->send(HelloMsg{kProtocolVersion, to_yaml(one), prefill_layout});
  // The worker answers once its model is built and warmed up: timeout_ms bounds that too (raise
  // it for a large model).
  const Frame f = link_->receive(timeout_);
  if (f.type == MsgType::Error)
    throw InputError(fmt::format("the decode worker at {} refused the decode instance: {}", peer_,
                                 decode_error(f.payload).message));
  if (f.type == MsgType::Challenge)
    throw InputError(fmt::format(
        "the decode worker at {} asks for authentication: set disaggregation.channel.secret_file to its secret", peer_));
  if (f.type != MsgType::HelloOk)
    throw std::runtime_error(fmt::format("the decode worker at {} answered {} to Hello", peer_, msg_type_name(f.type)));
  const HelloOkMsg ok = decode_hello_ok(f.payload);
  // The worker compared the layouts already; checked here too, so that neither side trusts the other's word.
  if (const KvLayoutCheck c = check_kv_layouts(prefill_layout, ok.decode_layout); c.match == KvLayoutMatch::Incompatible)
    throw InputError(fmt::format("the decode worker at {}: {}", peer_, c.why));
  if (ok.block_bytes != ok.decode_layout.block_bytes() || ok.kv_blocks != decode.engine.resolved_kv_blocks)
    throw InputError(fmt::format(
        "the decode worker at {} holds {} KV blocks of {} bytes (its layout says {}); this run expects {} blocks",
        peer_, ok.kv_blocks, ok.block_bytes, ok.decode_layout.block_bytes(), decode.engine.resolved_kv_blocks));
  executor_ = std::make_unique<RemoteExecutor>(*this, ok.backend + "@" + peer_);
  channel_ = std::make_unique<TcpChannel>(*this, *prefill_kv);
}

DecodeWorkerLink::~DecodeWorkerLink() { detach(); }
executor_i& DecodeWorkerLink::executor() { return *executor_; }
kv_channel_i& DecodeWorkerLink::channel() { return *channel_; }

void DecodeWorkerLink::start_child(const std::string& backend, int threads) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("tcp channel: pipe() failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::string threads_s = std::to_string(threads);
  std::vector<std::string> args = {"tandem", "worker", "--listen", "127.0.0.1:0", "--once", "--backend", backend};
  if (backend == "cpu") args.insert(args.end(), {"--threads", threads_s});
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

void DecodeWorkerLink::detach() {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
    inbox_ = nullptr;
  }
  if (link_) {
    try {
      link_->send(ByeMsg{});
    } catch (const std::exception&) {  // already gone: nothing to say goodbye to
    }
    link_->close();
  }
  if (child_ > 0) {  // a child ends at Bye (or at the closed connection); one that hangs is killed
    for (int i = 0; i < 100; ++i) {
      if (waitpid(child_, nullptr, WNOHANG) == child_) {
        child_ = -1;
        return;
      }
      usleep(50'000);
    }
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
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
      case MsgType::KvAck: {
        const KvAckMsg m = decode_kv_ack(f.payload);
        if (!m.ok) std::cerr << fmt::format("tandem: the decode worker at {} refused transfer {}: {}\n", peer_, m.ticket, m.error);
        post(TransferDone{m.ticket, m.ok, channel_->elapsed(m.ticket)});
        return;
      }
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

// One connection: Hello, then steps and KV pushes until Bye or the connection ends. A frame
// that does not check ends the connection (the peer is not to be trusted), never the process.
int serve(TcpLink& link, const std::string& backend, const std::string& secret, const ExecutorFactory* cuda) {
  // One connection at a time: one that says nothing gives way soon. Until the Hello is in, no
  // frame may be larger than a Hello can be.
  const milliseconds hello_timeout(10'000);
  link.set_max_payload(uint64_t{17} << 20);
  if (!secret.empty()) authenticate_as_server(link, secret, hello_timeout);
  Frame f = link.receive(hello_timeout);
  if (f.type != MsgType::Hello) throw WireError(fmt::format("expected Hello, got {}", msg_type_name(f.type)));
  const HelloMsg hello = decode_hello(f.payload);
  if (hello.protocol != kProtocolVersion)
    throw WireError(fmt::format("protocol {} (this worker speaks {})", hello.protocol, kProtocolVersion));
  std::unique_ptr<executor_i> exec;
  Workload w;
  try {
    w = parse_workload(hello.workload_yaml, "decode workload from " + link.peer());
    exec = make_executor(w, backend, cuda);
    if (!exec->kv_store()) throw InputError(fmt::format("the {} backend exposes no KV store", backend));
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
  link.send(HelloOkMsg{kv.num_blocks(), kv.block_bytes(), exec->name(), decode_layout});
  // Steps run on their own thread, one at a time in arrival order; KV pushes are written as they
  // arrive, beside a running step: the blocks a push fills belong to a request the scheduler
  // will not schedule before this push's KvAck, so no step reads them meanwhile, and a push
  // never waits behind a decode step (as an RDMA write would not).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<DecodedStep> steps;
  bool done = false;
  std::vector<std::byte> relaid;  // a push re-laid out (prefill at another TP), reused
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
  try {
    for (;;) {
      const Frame f = link.receive(milliseconds(int64_t(24) * 3600 * 1000));  // a closed peer ends it at once
      if (f.type == MsgType::Step) {
        DecodedStep d = decode_step(f.payload);
        check_block_ids(d, kv.num_blocks());
        check_table_lengths(d, w.engine.block_size);
        {
          std::lock_guard lock(mu);
          steps.push_back(std::move(d));
        }
        cv.notify_one();
      } else if (f.type == MsgType::KvPush) {
        const KvPushMsg m = decode_kv_push(f.payload);
        check_kv_push(m, kv.num_blocks(), hello.prefill_layout.block_bytes(), w.engine.block_size);
        if (layouts.match == KvLayoutMatch::Relayout) {
          relaid.resize(m.payload.size());
          relayout_kv_blocks(hello.prefill_layout, decode_layout, as_bytes(m.payload), relaid);
          kv.write_blocks(m.dst_blocks, relaid);
        } else {
          kv.write_blocks(m.dst_blocks, as_bytes(m.payload));
        }
        link.send(KvAckMsg{m.ticket, true, {}});
      } else if (f.type == MsgType::Bye) {
        stop_stepper();  // the steps already taken are answered first
        return 0;
      } else {
        throw WireError(fmt::format("unexpected {} frame", msg_type_name(f.type)));
      }
    }
  } catch (...) {
    stop_stepper();
    throw;
  }
}

}  // namespace

int worker_command(const std::vector<std::string>& args, const std::function<std::unique_ptr<executor_i>(Workload&)>* cuda) {
  namespace po = boost::program_options;
  po::options_description opts("options");
  opts.add_options()("listen", po::value<std::string>(), "HOST:PORT to listen on (port 0: any free port)")(
      "backend", po::value<std::string>()->default_value("cpu"), "cpu or cuda: runs the decode instance")(
      "threads", po::value<int>()->default_value(0), "CPU backend threads (0: all cores)")(
      "secret-file", po::value<std::string>(), "a shared secret both sides prove (required off loopback)")(
      "once", po::bool_switch(), "serve one connection, then exit (a run's own child)")("help,h", po::bool_switch(),
                                                                                     "this help");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    std::cout << "usage: tandem worker --listen HOST:PORT [--backend cpu|cuda] [--threads N] [--secret-file F] "
                 "[--once]\n  serves the decode instance of `tandem run` with disaggregation.channel.kind=tcp "
                 "and disaggregation.channel.peer=HOST:PORT\n"
              << opts;
    return 0;
  }
  if (!vm.count("listen")) throw InputError("--listen HOST:PORT is required");
  const auto [host, port] = split_host_port(vm["listen"].as<std::string>());
  const std::string secret = vm.count("secret-file") ? read_secret_file(vm["secret-file"].as<std::string>()) : "";
  if (!is_loopback(host) && secret.empty())
    throw InputError(fmt::format(
        "--listen {}: listening off loopback needs --secret-file (a shared secret the client must prove)", host));
  const std::string backend = vm["backend"].as<std::string>();
  if (backend != "cpu" && !(backend == "cuda" && cuda))
    throw InputError(fmt::format("--backend {}: not available in this build (known: cpu{})", backend,
                                 cuda ? ", cuda" : ""));
  if (backend == "cpu") cpu::set_threads(vm["threads"].as<int>());
  TcpListener listener(host, port);
  std::cout << fmt::format("tandem worker: listening on {}:{}", host, listener.port()) << std::endl;
  for (;;) {
    int rc = 1;
    try {
      std::unique_ptr<TcpLink> link = listener.accept(milliseconds(int64_t(365) * 24 * 3600 * 1000));
      try {
        rc = serve(*link, backend, secret, cuda);
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
