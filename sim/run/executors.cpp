#include "sim/run/executors.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/cost_model.h"
#include "backend/transfer/channel_kind.h"

namespace tandem {

cpu::CpuExecutorOptions cpu_executor_options(const EngineSpec& e) {
  return {.kv_blocks = e.resolved_kv_blocks, .block_size = e.block_size, .tp = e.tp, .deterministic = e.deterministic};
}

cuda::CudaExecutorOptions cuda_executor_options(const EngineSpec& e) {
  return {.kv_blocks = e.resolved_kv_blocks,
          .block_size = e.block_size,
          .tp = e.tp,
          .device = e.device,
          .deterministic = e.deterministic,
          .cuda_graph = e.cuda_graph,
          .attention = e.cuda_attention == "mma"         ? 1
                       : e.cuda_attention == "split"     ? 2
                       : e.cuda_attention == "mma_split" ? 3
                                                         : 0,
          .row_kernels = e.cuda_row_kernels == "v2" ? 2 : 1,
          .own_gemm = e.cuda_gemm == "own",
          .max_step_tokens = e.max_num_batched_tokens,
          .max_step_seqs = e.max_num_seqs};
}

std::unique_ptr<executor_i> make_executor(Workload& w, const std::string& backend, const ExecutorFactory* cuda) {
  if (backend == "sim") return std::make_unique<SimExecutor>(make_cost_model(w.model, w.hardware, w.engine.tp));
  if ((backend == "cpu" || backend == "cuda") && !w.model.llama_decoder())
    throw InputError(fmt::format(
        "--backend {}: model '{}' has a {} MLP and {} positions; the real backends compute the Llama decoder "
        "(swiglu MLP, rope positions) only: simulate it (--backend sim)",
        backend, w.model.name, w.model.mlp, w.model.positions));
  if (backend == "cpu") return cpu::make_cpu_executor(w.model, w.seed, cpu_executor_options(w.engine));
  if (backend == "cuda") {
    if (!cuda)
      throw InputError(
          "--backend cuda: this build has no CUDA backend (configure with -Dcuda=enabled where nvcc, "
          "cuBLAS and NCCL are installed)");
    return (*cuda)(w);
  }
  throw InputError(fmt::format("--backend {}: unknown (known: sim, cpu, cuda)", backend));
}

namespace {
// The CPU instances a run puts on this machine share its memory, so they are checked together,
// before any is built (each alone may fit where all do not): those of this process (1P1D over
// copy, data-parallel replicas), and a decode worker this process starts itself, on loopback.
// A worker at channel.peer checks its own process.
void check_cpu_run_memory(const Workload& w, std::span<const InstanceSpec> specs, bool remote_decode) {
  if (specs.size() < 2) return;  // make_cpu_executor checks a lone instance, naming its knobs
  std::vector<cpu::CpuMemoryNeed> parts;
  for (const InstanceSpec& in : specs) {
    const bool in_worker = remote_decode && in.role == InstanceRole::Decode;
    if (in_worker && !w.disaggregation.channel.peer.empty()) continue;
    std::string part = w.disaggregation.enabled ? std::string(to_string(in.role)) : fmt::format("instance {}", in.id);
    if (in_worker) part += " (a worker process on this host)";
    parts.push_back(cpu::cpu_memory_need(w.model, cpu_executor_options(in.engine), std::move(part)));
  }
  cpu::check_cpu_memory(parts);
}
}  // namespace

RunExecutors make_run_executors(Workload& w, std::span<const InstanceSpec> specs, const std::string& backend,
                                const ExecutorFactory* cuda, int threads, const ChannelFactory* channels) {
  RunExecutors r;
  const ChannelKind* kind = w.disaggregation.enabled ? &channel_kind(w.disaggregation.channel.kind) : nullptr;
  const bool remote_decode = kind && backend != "sim" && kind->remote_decode;
  if (backend == "cpu") check_cpu_run_memory(w, specs, remote_decode);
  // An instance's executor by role (1P1D has one of each), once it is built.
  auto built = [&](InstanceRole role) -> executor_i& {
    for (size_t i = 0; i < r.executors.size(); ++i)
      if (specs[i].role == role) return *r.executors[i];
    throw std::logic_error(fmt::format("make_run_executors: no {} instance built yet", to_string(role)));
  };
  for (const InstanceSpec& in : specs) {
    if (remote_decode && in.role == InstanceRole::Decode) {  // built by the worker, in its process
      r.remote = std::make_unique<DecodeWorkerLink>(w, in, backend, threads, built(InstanceRole::Prefill).kv_store());
      r.executors.push_back(&r.remote->executor());
      r.channel = &r.remote->channel();
      continue;
    }
    Workload one = instance_workload(w, in);
    r.owned.push_back(make_executor(one, backend, cuda));
    w.model = one.model;  // a checkpoint's spec, as the executor read it
    r.executors.push_back(r.owned.back().get());
  }
  if (!w.disaggregation.enabled || r.simulated() || r.remote) return r;
  executor_i &prefill = built(InstanceRole::Prefill), &decode = built(InstanceRole::Decode);
  if (!kind->moves_kv)
    throw InputError(fmt::format(
        "disaggregation.channel.kind: {} only prices a transfer and moves no KV, so --backend {} would decode without "
        "the prompt's KV: use {}",
        kind->name, backend,
        channel_kind_names([](const ChannelKind& k) { return k.moves_kv && !k.needs_cuda; }, " or ", true)));
  if (channels) {  // a CUDA build's own (device to device, nccl), when both executors are its
    r.owned_channel = (*channels)(kind->name, prefill, decode);
    if (r.owned_channel) {
      r.channel = r.owned_channel.get();
      return r;
    }
  }
  const std::string in_one_process = channel_kind_names([](const ChannelKind& k) { return bool(k.in_process); }, " or ");
  if (kind->in_process) {
    kv_store_i* from = prefill.kv_store();
    kv_store_i* to = decode.kv_store();
    if (!from || !to)
      throw InputError(
          fmt::format("disaggregation.channel.kind: {}: the {} backend exposes no KV store", kind->name, backend));
    r.owned_channel = kind->in_process(*from, *to);
    r.channel = r.owned_channel.get();
    return r;
  }
  if (kind->needs_cuda)
    throw InputError(fmt::format(
        "disaggregation.channel.kind: {} moves KV between {}: it needs --backend cuda (here {}) in a build "
        "with the CUDA backend; {} runs in one process on any backend",
        kind->name, kind->where, backend, in_one_process));
  throw InputError(fmt::format(
      "disaggregation.channel.kind: {} is not available for --backend {} in this build ({} runs in one process)",
      kind->name, backend, in_one_process));
}

const ExecutorFactory* cuda_executor_factory() {
  static const ExecutorFactory factory = [](Workload& w) {
    return cuda_module().make_executor(w.model, w.seed, cuda_executor_options(w.engine));
  };
  return cuda_module_built() ? &factory : nullptr;
}

const ChannelFactory* cuda_channel_factory() {
  static const ChannelFactory factory = [](const std::string& kind, executor_i& prefill,
                                           executor_i& decode) -> std::unique_ptr<kv_channel_i> {
    if (!cuda_module_loaded()) return nullptr;
    return cuda_module().make_channel(kind, prefill, decode);
  };
  return cuda_module_built() ? &factory : nullptr;
}

WarmUpShape warm_up_shape(const Workload& w) {
  return {w.engine.resolved_kv_blocks, w.engine.block_size, w.engine.max_num_batched_tokens, w.engine.max_num_seqs,
          w.model.max_model_len};
}

}  // namespace tandem
