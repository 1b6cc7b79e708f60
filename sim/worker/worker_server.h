// `tandem worker`: the decode side of the tcp channel, in its own process. It serves one client
// at a time: a Hello (the decode instance's workload and the prefill side's KV layout), then
// steps (answered by StepReply) and KV pushes (each block checked, written, read back and checked
// again before its KvAck) until Bye. The client side is DecodeWorkerLink (sim/remote/worker_link.h).
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "sim/workload/config.h"
#include "sim/worker/worker_faults.h"

namespace tandem {

// The decode instance a Hello asks for, as the worker builds it. Only the Hello's name, seed,
// model and engine are taken (any other key is refused unread); hardware and requests are
// placeholders (a worker neither prices steps nor makes requests). A model.checkpoint must
// resolve, symlinks and ".." followed, to `checkpoint_root` or below (a relative one from the
// root); none: no checkpoint is served. Every path outside gets one message, whether or not it
// exists, and nothing of it is opened: a client that did not authenticate (loopback without a
// secret) learns nothing of the worker's files.
Workload decode_instance_workload(const std::string& hello_yaml, const std::string& from,
                                  const std::optional<std::filesystem::path>& checkpoint_root);

// `tandem worker`: serves decode instances over TCP (see above). `cuda`: the CUDA backend's
// factory in a CUDA build (sim/commands/main.cpp), as for make_executor.
int worker_command(const std::vector<std::string>& args, const std::function<std::unique_ptr<executor_i>(Workload&)>* cuda);

}  // namespace tandem
