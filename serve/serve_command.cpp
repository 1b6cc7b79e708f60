#include "serve/serve_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <yaml-cpp/yaml.h>

#include <boost/program_options.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "serve/frontend.h"
#include "serve/served_run.h"
#include "serve/tokenizer.h"
#include "sim/outputs/outputs_schema.h"

namespace po = boost::program_options;

namespace tandem::serve {

namespace {

constexpr const char* kServeUsage =
    "usage: tandem serve WORKLOAD.yaml [--backend sim|cpu|cuda] [--listen HOST:PORT] [--api-key-file F]\n"
    "                    [--out DIR [--trace full|steps|requests|none]] [--set KEY=VALUE ...] [--threads N]\n"
    "                    [--max-connections N] [--max-queue N] [--max-body-bytes N] [--max-requests N]\n"
    "                    [--drain-s S] [--served-model-name NAME] [--record-prompts]\n"
    "       tandem serve --write-tokenizer --out DIR   # the byte-level tokenizer's Hugging Face files\n";

// A workload for serving needs no requests: requests come from clients. Without a requests:
// section, a placeholder one (never used) lets the workload's checks run unchanged.
Workload load_served_workload(const std::string& path, const std::vector<Override>& sets, bool& had_requests) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open workload file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const YAML::Node top = YAML::Load(text);
  had_requests = top.IsMap() && top["requests"];
  if (top.IsMap() && !had_requests)
    text +=
        "\nrequests: {count: 1, arrival: {process: poisson, rate: 1}, prompt_len: {dist: fixed, value: 1}, "
        "output_len: {dist: fixed, value: 1}}\n";
  return parse_workload(text, path, sets);
}

// 1,024 streams are 1,024 sockets: the soft limit on open files goes up to the hard one.
void raise_open_files_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// What was served, as a workload `tandem run` replays: the arrivals (a vidur trace: offset, prompt
// tokens, tokens asked for) and the workload that reads them.
// With --record-prompts, also the prompts' token ids (prompt_token_ids), which `tandem run` then
// serves instead of ids from the seed.
void write_served_workload(const std::string& dir, const Workload& w, const ServedRun& run, bool with_prompts) {
  const std::vector<Request>& served = run.served();
  const std::string csv = w.requests.trace->path;  // dir's arrivals.csv, absolute
  std::ofstream f(csv);
  f << "arrived_at,num_prefill_tokens,num_decode_tokens" << (with_prompts ? ",prompt_token_ids\n" : "\n");
  const Time t0 = served.empty() ? 0 : served.front().arrival;
  for (const Request& r : served) {
    f << fmt::format("{:.9f},{},{}", to_seconds(r.arrival - t0), r.prompt_len, r.max_output);
    if (with_prompts) f << ',' << fmt::format("{}", fmt::join(run.recorded_prompt(r.id), " "));
    f << '\n';
  }
  std::ofstream y(dir + "/served_workload.yaml");
  y << "# What `tandem serve` served, as a workload: `tandem run` replays these arrivals in simulation.\n"
    << to_yaml(w);
  if (!f || !y) throw std::runtime_error(fmt::format("cannot write {}/arrivals.csv or served_workload.yaml", dir));
}

}  // namespace

int serve_command(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("backend", po::value<std::string>()->default_value("sim"),
                     "sim (the cost model's step times, under the wall clock), cpu or cuda (the real models)")(
      "listen", po::value<std::string>()->default_value("127.0.0.1:8000"), "HOST:PORT (port 0: any free one)")(
      "api-key-file", po::value<std::string>(), "clients must send Authorization: Bearer <the file's first line>")(
      "out", po::value<std::string>(),
      "at the end: requests.csv, summary.json, steps.csv, trace.json, arrivals.csv, "
      "served_workload.yaml")("trace", po::value<std::string>()->default_value("full"),
                              "trace.json detail: full, steps, requests or none")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a workload key")(
      "threads", po::value<int>()->default_value(0), "CPU backend threads (0: all cores)")(
      "served-model-name", po::value<std::string>(), "the model's name in the API (default: the workload's model)")(
      "max-connections", po::value<int32_t>()->default_value(4096), "more are answered 503")(
      "max-queue", po::value<int32_t>()->default_value(8192), "engine requests in flight; more are answered 503")(
      "max-body-bytes", po::value<int64_t>()->default_value(8 << 20), "larger request bodies are answered 413")(
      "max-requests", po::value<int64_t>()->default_value(1'000'000),
      "requests this server takes in its life, then 503 (0: no limit); memory grows with the requests taken")(
      "drain-s", po::value<double>()->default_value(30), "on SIGINT/SIGTERM: how long requests in flight may go on")(
      "record-prompts", po::bool_switch(),
      "with --out: arrivals.csv also holds each prompt's token ids, so tandem run of served_workload.yaml replays "
      "them id for id (memory then grows with the prompt tokens served)")(
      "send-threads", po::value<int>()->default_value(2),
      "threads that send a step's chunks to the sockets: 2 (the io thread and one more, for 16 or more sockets "
      "at once) or 1 (the io thread alone)")(
      "chunk-timestamps", po::bool_switch(),
      "an SSE comment line before each chunk: the engine instant it was emitted at (CLOCK_MONOTONIC ns)")(
      "write-tokenizer", po::bool_switch(), "write tokenizer.json and tokenizer_config.json into --out DIR, and exit")(
      "help,h", po::bool_switch(), "this help");
  po::options_description hidden;
  hidden.add_options()("workload", po::value<std::string>());
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("workload", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    std::cout << kServeUsage << opts;
    return 0;
  }
  if (vm["write-tokenizer"].as<bool>()) {
    if (!vm.count("out")) throw InputError("--write-tokenizer writes into --out DIR, which is missing");
    write_tokenizer_files(vm["out"].as<std::string>());
    std::cout << "tandem serve: wrote " << vm["out"].as<std::string>() << "/tokenizer.json and tokenizer_config.json\n";
    return 0;
  }
  if (!vm.count("workload")) throw InputError(std::string("missing WORKLOAD.yaml\n") + kServeUsage);
  const auto sets = vm.count("set") ? parse_sets(vm["set"].as<std::vector<std::string>>()) : std::vector<Override>{};
  bool had_requests = false;
  Workload w = load_served_workload(vm["workload"].as<std::string>(), sets, had_requests);
  if (had_requests)
    std::cerr << "tandem serve: note: the workload's requests: section is not used; requests come from HTTP clients\n";
  // What is served is a trace: the arrivals the clients make (written at the end with --out), so
  // that the outputs describe this run's load, not the file's unused section.
  w.requests = RequestsSpec{};
  w.requests.trace = TraceSpec{};
  w.requests.trace->format = TraceSpec::Format::Vidur;
  w.requests.trace->path =
      (vm.count("out") ? std::filesystem::absolute(vm["out"].as<std::string>()) : std::filesystem::path("(clients)")) /
      "arrivals.csv";

  FrontendOptions fo;
  const std::string listen = vm["listen"].as<std::string>();
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) throw InputError(fmt::format("--listen {}: expected HOST:PORT", listen));
  fo.host = listen.substr(0, colon);
  if (fo.host.size() > 2 && fo.host.front() == '[') fo.host = fo.host.substr(1, fo.host.size() - 2);
  try {
    const int port = std::stoi(listen.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    fo.port = uint16_t(port);
  } catch (const std::exception&) {
    throw InputError(fmt::format("--listen {}: the port must be a number in 0..65535", listen));
  }
  if (vm.count("api-key-file")) {
    std::ifstream f(vm["api-key-file"].as<std::string>());
    std::getline(f, fo.api_key);
    if (!f && fo.api_key.empty())
      throw InputError(fmt::format("--api-key-file {}: cannot read a key", vm["api-key-file"].as<std::string>()));
  }
  fo.model = vm.count("served-model-name") ? vm["served-model-name"].as<std::string>() : w.model.name;
  fo.max_connections = vm["max-connections"].as<int32_t>();
  fo.max_queue = vm["max-queue"].as<int32_t>();
  fo.max_body_bytes = vm["max-body-bytes"].as<int64_t>();
  fo.drain_s = vm["drain-s"].as<double>();
  fo.chunk_timestamps = vm["chunk-timestamps"].as<bool>();
  fo.send_threads = vm["send-threads"].as<int>();
  if (fo.max_connections < 1 || fo.max_queue < 1 || fo.max_body_bytes < 1 || fo.drain_s < 0)
    throw InputError("--max-connections, --max-queue and --max-body-bytes must be at least 1, --drain-s at least 0");
  check_send_threads(fo.send_threads);  // before the backend's warm-up and the port

  ServeOptions so;
  so.backend = vm["backend"].as<std::string>();
  so.threads = vm["threads"].as<int>();
  so.max_requests = vm["max-requests"].as<int64_t>();
  so.record_prompts = vm["record-prompts"].as<bool>();
  if (so.record_prompts && !vm.count("out"))
    throw InputError("--record-prompts writes into --out DIR, which is missing");
  if (vm.count("out")) {
    so.out = vm["out"].as<std::string>();
    so.trace = parse_trace_detail(vm["trace"].as<std::string>());
  }
  // SIGINT and SIGTERM are the front end's (an asio::signal_set: a drain); a client that leaves
  // mid-write is an error on its socket, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  raise_open_files_limit();
  ServedRun run(w, so);
  Frontend fe(run, fo);
  std::cerr << fmt::format("tandem serve: {} on --backend {}, listening on http://{}:{}\n", fo.model, so.backend,
                           fo.host, fe.port())
            << std::flush;
  fe.run();
  Summary s = run.finish();
  if (so.out) write_served_workload(*so.out, w, run, so.record_prompts);
  s.peak_rss_kb = std::max(s.peak_rss_kb, peak_rss_kb());
  print_summary(std::cout, s);
  if (!s.run_error.empty()) {
    std::cerr << "tandem serve: run failed: " << s.run_error << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem::serve
