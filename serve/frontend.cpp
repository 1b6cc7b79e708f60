#include "serve/frontend.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "serve/metrics_text.h"
#include "serve/parallel_send.h"
#include "serve/tokenizer.h"

namespace tandem::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

namespace {

std::string reason_phrase(int status) {
  return std::string(http::obsolete_reason(http::int_to_status(unsigned(status))));
}

std::string response(int status, std::string_view content_type, std::string_view body, bool keep_alive) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{}", status,
                     reason_phrase(status), content_type, body.size(), keep_alive ? "keep-alive" : "close", body);
}

// A fail reason that the request's own fields caused (it could never be served): 400, naming them.
std::optional<ApiError> refusal_of(FailReason r, bool chat) {
  const std::string prompt = chat ? "messages" : "prompt";
  const std::string max = chat ? "max_completion_tokens" : "max_tokens";
  switch (r) {
    case FailReason::EmptyPrompt: return ApiError{400, "the prompt is empty", prompt};
    case FailReason::EmptyOutput: return ApiError{400, "max_tokens must be at least 1", max};
    case FailReason::ExceedsMaxModelLen:
      return ApiError{400, "the prompt's tokens plus max_tokens exceed the model's context (max_model_len)", max};
    case FailReason::ExceedsKvCapacity:
    case FailReason::ExceedsDecodeKvCapacity:
      return ApiError{400, fmt::format("the prompt plus max_tokens can never fit in the KV cache ({})", to_string(r)),
                      max};
    case FailReason::PromptOverBudget:
      return ApiError{400, "the prompt is longer than a step's token budget and prompts are not chunked", prompt};
    case FailReason::NoStateSlots: return ApiError{400, "the model has no state slots to serve a request", ""};
    default: return std::nullopt;
  }
}

std::string json_char(char c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    default: return std::string(1, c);  // output_byte gives printable ASCII only
  }
}

}  // namespace

class Session;

struct Frontend::Impl {
  Impl(ServedRun& r, const FrontendOptions& o)
      : run(r), opts(o), acceptor(io), signals(io, SIGINT, SIGTERM), drain_timer(io), outbox([this] {
          asio::post(io, [this] { drain_outbox(); });
        }) {}

  ServedRun& run;
  FrontendOptions opts;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::signal_set signals;
  asio::steady_timer drain_timer;
  Outbox outbox;
  std::unordered_map<ReqId, std::shared_ptr<Session>> by_slot;  // engine requests alive
  int32_t connections = 0;
  int32_t writes_in_flight = 0;  // after the run ended, the io thread stops once these are out
  int64_t alive = 0;             // engine requests submitted and not ended
  int64_t next_call = 0;
  bool draining = false;
  bool run_ended = false;
  std::vector<Note> notes;
  // While a drain runs, the sessions with bytes to send are listed, and sent together at its end:
  // a large batch on two threads (the io thread and `sender`), see serve/parallel_send.h.
  bool batching = false;
  std::vector<std::shared_ptr<Session>> batch;
  std::vector<SendJob> jobs;
  std::unique_ptr<ParallelSend> sender;  // null: --send-threads 1
  int64_t drain_ns = 0;                  // --chunk-timestamps: when the drain being run began (CLOCK_MONOTONIC)

  void accept();
  void stop_when_written() {
    if (run_ended && writes_in_flight == 0) io.stop();
  }
  void drain_outbox();
  void begin_drain(const char* why);
  void cancel_all();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Frontend::Impl& fe, tcp::socket s) : fe_(fe), stream_(std::move(s)) { ++fe_.connections; }
  ~Session() { --fe_.connections; }
  void start() { read_request(); }
  void on_note(const Note& n);
  // The drain's batch: this session's bytes to send, then what the send did with them.
  SendJob job() { return {stream_.socket().native_handle(), pending_.data(), pending_.size()}; }
  void batch_sent(const SendJob& j);
  void shut_down_requests();  // the drain ran out: those still alive end as cancelled by the server

 private:
  struct Choice {
    ReqId slot = -1;
    int32_t prompt_len = 0;
    int32_t tokens = 0;
    bool done = false;
    RequestStatus status = RequestStatus::Running;
    FailReason reason = FailReason::None;
    std::string text;
    std::vector<Token> ids;
  };

  void read_request();
  void on_read(beast::error_code ec);
  void handle(http::request<http::string_body>& req);
  void handle_ask(const http::request<http::string_body>& req, bool chat);
  void reply(int status, std::string_view content_type, std::string_view body);
  void reply_error(const ApiError& e) { reply(e.status, "application/json", e.body()); }
  void send(std::string s);
  void flush();
  void watch_for_disconnect();
  void client_gone();
  void end_call();
  void send_stream_head();
  std::string chunk(size_t index, std::string_view content, bool last, const Note& n) const;
  std::string final_body() const;

  Frontend::Impl& fe_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string pending_, inflight_;
  bool writing_ = false, close_after_ = false, keep_alive_ = false, closed_ = false;
  bool watching_ = false, next_after_watch_ = false, gone_ = false, shut_down_ = false;
  // The call being served (one at a time per connection).
  bool in_call_ = false, head_sent_ = false;
  bool listed_ = false;  // in the drain's batch
  Ask ask_;
  std::vector<Choice> choices_;
  size_t open_choices_ = 0;
  std::string call_id_;
  int64_t created_ = 0;
  std::string chunk_head_;  // every chunk's opening, up to the choice index
  std::optional<ApiError> failure_;
};

void Session::read_request() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(uint64_t(fe_.opts.max_body_bytes));
  stream_.expires_after(std::chrono::milliseconds(int64_t(fe_.opts.read_timeout_s * 1000)));
  http::async_read(stream_, buf_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void Session::on_read(beast::error_code ec) {
  stream_.expires_never();
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::operation_aborted) {
    closed_ = true;
    return;
  }
  keep_alive_ = false;
  if (ec == http::error::body_limit)
    return reply_error(
        {413, fmt::format("the request body is larger than the limit of {} bytes", fe_.opts.max_body_bytes), ""});
  if (ec == http::error::header_limit) return reply_error({431, "the request's header is too large", ""});
  if (ec == beast::error::timeout) return reply_error({408, "the request was not received in time", ""});
  if (ec) return reply_error({400, fmt::format("malformed HTTP request: {}", ec.message()), ""});
  http::request<http::string_body> req = parser_->release();
  keep_alive_ = req.keep_alive();
  handle(req);
}

void Session::handle(http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (!fe_.opts.api_key.empty() && path != "/health") {
    const auto auth = req.find(http::field::authorization);
    if (auth == req.end() || auth->value() != "Bearer " + fe_.opts.api_key)
      return reply_error({401, "a valid API key is required (Authorization: Bearer KEY)", "", "authentication_error"});
  }
  const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
  if (path == "/health" || path == "/v1/models" || path == "/metrics") {
    if (!get) return reply_error({405, fmt::format("{} takes GET", path), ""});
    if (path == "/health") return reply(200, "text/plain", "");
    if (path == "/metrics")
      return reply(200, "text/plain; version=0.0.4", metrics_text(fe_.run.stats(), fe_.opts.model));
    const json model = {{"id", fe_.opts.model},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "tandem"},
                        {"root", fe_.opts.model},
                        {"parent", nullptr},
                        {"max_model_len", fe_.run.workload().model.max_model_len}};
    return reply(200, "application/json", json{{"object", "list"}, {"data", json::array({model})}}.dump());
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return reply_error({405, fmt::format("{} takes POST", path), ""});
    return handle_ask(req, path == "/v1/chat/completions");
  }
  reply_error({404, fmt::format("no endpoint {}", path), ""});
}

void Session::handle_ask(const http::request<http::string_body>& req, bool chat) {
  if (fe_.draining) return reply_error({503, "the server is shutting down", "", "server_error"});
  // A full queue refuses before the body is parsed and tokenised (the per-request work).
  if (fe_.alive >= fe_.opts.max_queue)
    return reply_error(
        {503, fmt::format("the server's queue is full ({} requests in flight)", fe_.alive), "", "server_error"});
  const Workload& w = fe_.run.workload();
  ApiLimits limits{w.model.vocab, w.model.max_model_len};
  auto parsed = parse_ask(req.body(), chat, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply_error(*e);
  Ask& a = std::get<Ask>(parsed);
  if (!a.model.empty() && a.model != fe_.opts.model)
    return reply_error({404,
                        fmt::format("the model '{}' does not exist (this server serves '{}')", a.model, fe_.opts.model),
                        "model", "NotFoundError"});
  if (fe_.alive + int64_t(a.prompts.size()) > fe_.opts.max_queue)
    return reply_error(
        {503, fmt::format("the server's queue is full ({} requests in flight)", fe_.alive), "", "server_error"});
  ask_ = std::move(a);
  in_call_ = true;
  head_sent_ = false;
  failure_.reset();
  choices_.clear();
  call_id_ = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", fe_.next_call++);
  created_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  chunk_head_ =
      fmt::format(R"(data: {{"id":"{}","object":"{}","created":{},"model":{},"choices":[{{"index":)", call_id_,
                  chat ? "chat.completion.chunk" : "text_completion", created_, json(fe_.opts.model).dump());
  for (auto& p : ask_.prompts) {
    const auto len = int32_t(p.size());
    const ReqId slot = fe_.run.submit(std::move(p), ask_.max_tokens);
    if (slot < 0) {
      failure_ = ApiError{503,
                          fmt::format("the server has taken the {} requests it takes in its life (--max-requests): "
                                      "restart it, or start it with a higher --max-requests (0: no limit)",
                                      fe_.run.max_requests()),
                          "", "server_error"};
      break;
    }
    Choice c;
    c.slot = slot;
    c.prompt_len = len;
    choices_.push_back(std::move(c));
    fe_.by_slot[slot] = shared_from_this();
    ++fe_.alive;
  }
  ask_.prompts.clear();
  open_choices_ = choices_.size();
  if (open_choices_ == 0) return end_call();
  if (failure_)
    for (const Choice& c : choices_) fe_.run.cancel(c.slot);
  watch_for_disconnect();
}

// The socket is read while a call is served: the client's end of stream is its cancel.
void Session::watch_for_disconnect() {
  watching_ = true;
  stream_.socket().async_read_some(buf_.prepare(512), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->watching_ = false;
    self->buf_.commit(n);
    if (self->next_after_watch_) {  // cancelled by us: the call ended and the connection is kept
      self->next_after_watch_ = false;
      self->read_request();
      return;
    }
    if (ec) self->client_gone();
    // Bytes (a pipelined request) stay in the buffer for the next read; no more watching.
  });
}

void Session::client_gone() {
  if (gone_) return;
  gone_ = true;
  closed_ = true;
  for (const Choice& c : choices_)
    if (!c.done) fe_.run.cancel(c.slot);
  beast::error_code ec;
  stream_.socket().close(ec);
}

void Session::shut_down_requests() {
  shut_down_ = true;
  for (const Choice& c : choices_)
    if (!c.done) fe_.run.cancel(c.slot);
}

std::string Session::chunk(size_t index, std::string_view content, bool last, const Note& n) const {
  std::string s;
  // The emission instant, then where the chunk has been since (the benchmark's split): pushed
  // into the outbox, the io thread's wake-up that took it, the chunk made and handed to the socket
  // (q=1: behind this socket's write in flight, so it goes out when that one is done).
  if (fe_.opts.chunk_timestamps)
    s = fmt::format(": t={} p={} d={} w={} q={}\n", fe_.run.start_steady_ns() + n.at, n.pushed_ns, fe_.drain_ns,
                    Outbox::steady_ns(), writing_ ? 1 : 0);
  s += chunk_head_;
  s += std::to_string(index);
  if (ask_.chat)
    s += fmt::format(R"(,"delta":{{"content":"{}"}},"logprobs":null,"finish_reason":{}}}]}})", content,
                     last ? "\"length\"" : "null");
  else
    s += fmt::format(R"(,"text":"{}","logprobs":null,"finish_reason":{}}}]}})", content, last ? "\"length\"" : "null");
  s += "\n\n";
  return s;
}

void Session::send_stream_head() {
  head_sent_ = true;
  send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n");
}

void Session::on_note(const Note& n) {
  Choice* c = nullptr;
  size_t index = 0;
  for (; index < choices_.size(); ++index)
    if (choices_[index].slot == n.id) {
      c = &choices_[index];
      break;
    }
  if (!c || c->done) return;
  if (n.kind == Note::Kind::Token) {
    ++c->tokens;
    if (gone_ || failure_) return;
    const char b = output_byte(n.token);
    if (ask_.return_token_ids || !ask_.stream) c->ids.push_back(n.token);
    if (ask_.stream) {
      if (!head_sent_) send_stream_head();
      std::string s = chunk(index, json_char(b), c->tokens == ask_.max_tokens, n);
      if (ask_.chat && c->tokens == 1) {  // the first delta names the role
        const std::string from = R"("delta":{)";
        s.insert(s.find(from) + from.size(), R"("role":"assistant",)");
      }
      if (ask_.return_token_ids) {
        const size_t at = s.rfind("\"logprobs\"");
        s.insert(at, fmt::format(R"("token_ids":[{}],)", n.token));
      }
      send(std::move(s));
    } else {
      c->text += b;
    }
    return;
  }
  c->done = true;
  c->status = n.status;
  c->reason = n.reason;
  --open_choices_;
  fe_.by_slot.erase(n.id);
  --fe_.alive;
  if (!failure_) {
    if (n.status == RequestStatus::Failed) {
      if (auto e = refusal_of(n.reason, ask_.chat); e && c->tokens == 0)
        failure_ = *e;
      else
        failure_ = ApiError{500, fmt::format("the request failed: {}", to_string(n.reason)), "", "server_error"};
    } else if (n.status == RequestStatus::Cancelled && !gone_) {
      failure_ = ApiError{503, "the server is shutting down: the request was cancelled", "", "server_error"};
    }
    if (failure_)  // one choice failed: the others end too
      for (const Choice& o : choices_)
        if (!o.done) fe_.run.cancel(o.slot);
  }
  if (open_choices_ == 0) end_call();
}

std::string Session::final_body() const {
  json choices = json::array();
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    prompt += c.prompt_len;
    completion += c.tokens;
    json one = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", "length"}};
    if (ask_.chat)
      one["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      one["text"] = c.text;
    if (ask_.return_token_ids) one["token_ids"] = c.ids;
    choices.push_back(std::move(one));
  }
  return json{
      {"id", call_id_},
      {"object", ask_.chat ? "chat.completion" : "text_completion"},
      {"created", created_},
      {"model", fe_.opts.model},
      {"choices", std::move(choices)},
      {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}}}}
      .dump();
}

void Session::end_call() {
  in_call_ = false;
  if (gone_) return;
  if (ask_.stream && head_sent_) {
    if (failure_)
      send(fmt::format("data: {}\n\n", failure_->body()));
    else if (ask_.include_usage) {
      int64_t prompt = 0, completion = 0;
      for (const Choice& c : choices_) {
        prompt += c.prompt_len;
        completion += c.tokens;
      }
      send(fmt::format(
          R"(data: {{"id":"{}","object":"{}","created":{},"model":{},"choices":[],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}})"
          "\n\n",
          call_id_, ask_.chat ? "chat.completion.chunk" : "text_completion", created_, json(fe_.opts.model).dump(),
          prompt, completion, prompt + completion));
    }
    send("data: [DONE]\n\n");
    close_after_ = true;
    if (!writing_) flush();
    return;
  }
  if (failure_) return reply_error(*failure_);
  reply(200, "application/json", final_body());
}

void Session::reply(int status, std::string_view content_type, std::string_view body) {
  if (!keep_alive_) close_after_ = true;
  send(response(status, content_type, body, keep_alive_));
  if (!writing_) flush();
}

void Session::send(std::string s) {
  if (closed_) return;
  pending_ += s;
  if (!writing_) flush();
}

void Session::batch_sent(const SendJob& j) {
  listed_ = false;
  if (closed_) return;
  if (j.sent < 0 && j.err != EAGAIN && j.err != EWOULDBLOCK && j.err != EINTR) return client_gone();
  if (j.sent > 0) pending_.erase(0, size_t(j.sent));
  flush();  // the rest (a full socket) by async_write; then a close or the next request
}

void Session::flush() {
  if (closed_) return;
  if (fe_.batching && !pending_.empty() && !writing_) {  // sent at the drain's end, with the others
    if (!listed_) {
      listed_ = true;
      fe_.batch.push_back(shared_from_this());
    }
    return;
  }
  if (pending_.empty()) {
    if (close_after_) {
      closed_ = true;
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      stream_.socket().close(ec);
      return;
    }
    if (!in_call_) {  // a reply went out and the connection is kept: the next request
      if (watching_) {
        next_after_watch_ = true;
        beast::error_code ec;
        stream_.socket().cancel(ec);
      } else {
        read_request();
      }
    }
    return;
  }
  writing_ = true;
  ++fe_.writes_in_flight;
  inflight_.clear();
  inflight_.swap(pending_);
  asio::async_write(stream_.socket(), asio::buffer(inflight_),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      --self->fe_.writes_in_flight;
                      if (ec)
                        self->client_gone();
                      else
                        self->flush();
                      self->fe_.stop_when_written();
                    });
}

void Frontend::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket s) {
    if (ec) {
      if (ec != asio::error::operation_aborted && acceptor.is_open()) accept();
      return;
    }
    s.set_option(tcp::no_delay(true), ec);
    if (connections >= opts.max_connections) {
      auto msg = std::make_shared<std::string>(response(
          503, "application/json",
          ApiError{503, fmt::format("too many connections (at most {})", opts.max_connections), "", "server_error"}
              .body(),
          false));
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      asio::async_write(*sock, asio::buffer(*msg), [sock, msg](beast::error_code, size_t) {
        beast::error_code e;
        sock->shutdown(tcp::socket::shutdown_send, e);
        sock->close(e);
      });
    } else {
      std::make_shared<Session>(*this, std::move(s))->start();
    }
    accept();
  });
}

void Frontend::Impl::drain_outbox() {
  if (opts.chunk_timestamps) drain_ns = Outbox::steady_ns();
  outbox.take(notes);
  batching = true;
  for (const Note& n : notes) {
    const auto it = by_slot.find(n.id);
    if (it == by_slot.end()) continue;
    const std::shared_ptr<Session> s = it->second;  // on_note may erase the entry
    s->on_note(n);
  }
  batching = false;
  if (batch.empty()) return;
  jobs.clear();
  for (const auto& s : batch) jobs.push_back(s->job());
  // Below this a second thread's wake-up costs about what it saves.
  constexpr size_t kParallelFrom = 16;
  if (sender && jobs.size() >= kParallelFrom)
    sender->send_all(jobs);
  else
    for (SendJob& j : jobs) send_now(j);
  for (size_t i = 0; i < batch.size(); ++i) batch[i]->batch_sent(jobs[i]);
  batch.clear();
}

void Frontend::Impl::begin_drain(const char* why) {
  if (draining) {  // a second signal: end what is left now
    cancel_all();
    return;
  }
  draining = true;
  std::fprintf(stderr, "tandem serve: %s: draining (%lld request(s) in flight, up to %.0f s; again to end them now)\n",
               why, static_cast<long long>(alive), opts.drain_s);
  beast::error_code ec;
  acceptor.close(ec);
  run.close();
  drain_timer.expires_after(std::chrono::milliseconds(int64_t(opts.drain_s * 1000)));
  drain_timer.async_wait([this](beast::error_code e) {
    if (!e) cancel_all();
  });
}

void Frontend::Impl::cancel_all() {
  std::vector<std::shared_ptr<Session>> sessions;
  for (auto& [slot, s] : by_slot) sessions.push_back(s);
  for (auto& s : sessions) s->shut_down_requests();
}

void check_send_threads(int send_threads) {
  if (send_threads < 1 || send_threads > 2)
    throw InputError(fmt::format("--send-threads {}: must be 1 or 2", send_threads));
}

Frontend::Frontend(ServedRun& run, const FrontendOptions& o) : impl_(std::make_unique<Impl>(run, o)) {
  Impl& m = *impl_;
  check_send_threads(o.send_threads);  // before the port is taken
  beast::error_code ec;
  const auto addr = asio::ip::make_address(o.host, ec);
  if (ec) throw InputError(fmt::format("--listen {}:{}: not an IP address", o.host, o.port));
  const tcp::endpoint ep(addr, o.port);
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw InputError(fmt::format("--listen {}:{}: {}", o.host, o.port, ec.message()));
  m.outbox.set_stamps(o.chunk_timestamps);
  if (o.send_threads == 2) m.sender = std::make_unique<ParallelSend>();
  run.set_outbox(&m.outbox);
}

Frontend::~Frontend() = default;

uint16_t Frontend::port() const { return impl_->acceptor.local_endpoint().port(); }

void Frontend::run() {
  Impl& m = *impl_;
  m.signals.async_wait([&m](beast::error_code ec, int sig) {
    if (ec) return;
    m.begin_drain(sig == SIGINT ? "SIGINT" : "SIGTERM");
    // Keep listening for a second one.
    m.signals.async_wait([&m](beast::error_code e, int) {
      if (!e) m.begin_drain("again");
    });
  });
  m.run.start([&m] {
    asio::post(m.io, [&m] {
      m.run_ended = true;
      m.drain_outbox();
      m.stop_when_written();
    });
  });
  m.accept();
  m.io.run();
}

}  // namespace tandem::serve
