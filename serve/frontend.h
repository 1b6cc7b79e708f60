// tandem serve's HTTP front end: Boost.Beast on one Asio thread (as the worker's server), the
// OpenAI endpoints that `vllm bench serve` and the `openai` SDK use, Server-Sent Events for
// streams. It never blocks: a client's request becomes engine requests through ServedRun (one
// per prompt), their tokens come back as Notes (ServedRun's Outbox) and go out as SSE chunks.
//   backpressure  each connection writes one buffer at a time; what the engine emits meanwhile is
//                 appended to the next one (a slow reader gets larger writes, never a blocked loop)
//   limits        body size (413), header size (431), connections (503 at accept), requests in
//                 the engine (503), a read timeout for a request's head and body (408)
//   cancellation  while a request is served the socket is read: end of stream or an error means
//                 the client left, and each of its engine requests still alive is cancelled (the
//                 engine's Cancel path: KV freed once, by its owner, also mid-transfer under PD)
//   shutdown      begin_drain: no new requests (503), the engine closes, requests in flight go on
//                 for drain_s, then those left are cancelled and answered "server shutting down"
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "serve/api.h"
#include "serve/served_run.h"

namespace tandem::serve {

struct FrontendOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (port() says which)
  std::string api_key;   // empty: none asked for
  std::string model;     // the served model's name (/v1/models)
  int32_t max_connections = 4096;
  int64_t max_body_bytes = 8 << 20;
  int32_t max_queue = 8192;  // engine requests alive at once
  double read_timeout_s = 30;
  double drain_s = 30;
  // Threads that send a drain's chunks: 2, the io thread and a sender (a step's chunks for many
  // streams split between the two cores); 1, the io thread alone.
  int send_threads = 2;
  bool chunk_timestamps = false;  // an SSE comment per chunk with the engine's instant (the benchmark)
};

// Throws InputError naming --send-threads unless it is 1 or 2 (the command checks it before the
// backend's warm-up, the front end again before it takes the port).
void check_send_threads(int send_threads);

class Frontend {
 public:
  // Binds the listener (throws InputError naming the address when it cannot).
  Frontend(ServedRun& run, const FrontendOptions& o);
  ~Frontend();
  uint16_t port() const;
  // Serves until the engine's run has ended (after a drain); on the calling thread.
  void run();
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::serve
