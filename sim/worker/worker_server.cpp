#include "sim/worker/worker_server.h"

#include <fmt/format.h>
#include <signal.h>
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
#include "sim/run/executors.h"
#include "sim/remote/worker_address.h"
#include "sim/base/yaml_reader.h"



namespace tandem {

using namespace transfer;
using std::chrono::milliseconds;

namespace {

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
std::span<const uint8_t> as_u8(std::span<const std::byte> v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size()};
}

}  // namespace

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

}  // namespace

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

