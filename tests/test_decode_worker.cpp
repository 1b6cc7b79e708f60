// The worker's side of 1P1D over tcp (sim/worker/worker_server.cpp) that does not need a socket: what
// it takes from a Hello (decode_instance_workload: nothing but name, seed, model and engine; a
// checkpoint only under --checkpoint-root, with one answer for every path outside it, existing
// or not) and its test-only fault switch (parse_fault_injection). The connection itself runs in
// the cli suite (tests/cli_test.sh, stage 4), against real worker processes.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/checkpoint.h"
#include "core/error.h"
#include "tests/test_helpers.h"
#include "sim/worker/worker_server.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

// The shared temp folder, named for this file's tests.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("tandem_worker") {}
};

// A one-layer checkpoint folder the model section accepts (config.json and one shard).
void make_checkpoint(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 4, "intermediate_size": 2, "num_hidden_layers": 1,
    "num_attention_heads": 2, "vocab_size": 4, "max_position_embeddings": 64, "tie_word_embeddings": true})";
  write_safetensors((dir / "model.safetensors").string(), {}, "F32");
}

const std::string kEngine = "engine: {num_kv_blocks: 16, max_num_seqs: 4, max_num_batched_tokens: 64}\n";

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::string with_checkpoint(const std::string& path) {
  return "name: d\nseed: 3\nmodel: {checkpoint: '" + path + "'}\n" + kEngine;
}

}  // namespace

TEST_CASE("a Hello's decode instance: name, seed, model and engine are taken, anything else refused unread") {
  const Workload w = decode_instance_workload("name: d\nseed: 9\nmodel: tiny\n" + kEngine, "hello", std::nullopt);
  CHECK(w.name == "d");
  CHECK(w.seed == 9);
  CHECK(w.model.name == "tiny");
  CHECK(w.engine.resolved_kv_blocks == 16);
  CHECK(w.engine.max_num_seqs == 4);
  // A trace, a length table or a hardware profile would be opened by the workload's parser: they
  // are refused by their key alone, the same for a file that exists and one that does not.
  for (const std::string& extra : {std::string("requests: {trace: {format: vidur, path: /etc/passwd}}\n"),
                                   std::string("requests: {trace: {format: vidur, path: /no/such/file}}\n"),
                                   std::string("hardware: /etc/hosts\n"), std::string("slo: {ttft_ms: 1}\n")}) {
    CAPTURE(extra);
    const std::string key = extra.substr(0, extra.find(':'));
    CHECK(input_error([&] {
            (void)decode_instance_workload("model: tiny\n" + kEngine + extra, "hello", std::nullopt);
          }) == "hello: '" + key + "': a worker takes a decode instance's name, seed, model and engine only");
  }
}

TEST_CASE("a checkpoint outside --checkpoint-root: one answer, whether the path exists or not") {
  TempDir t;
  const fs::path root = t.path / "served";
  make_checkpoint(root / "ck");
  make_checkpoint(t.path / "outside");  // a real checkpoint, not under the root
  fs::create_directories(t.path / "empty");
  std::ofstream(t.path / "file") << "x";
  const std::vector<fs::path> probes = {t.path / "outside",     t.path / "empty", t.path / "file",
                                        t.path / "no-such-dir", "/etc",           "/no/such/dir"};
  for (const std::optional<fs::path>& r : {std::optional<fs::path>(), std::optional<fs::path>(root)}) {
    std::set<std::string> answers;
    for (const fs::path& p : probes) {
      std::string msg = input_error([&] { (void)decode_instance_workload(with_checkpoint(p.string()), "hello", r); });
      // The path the client gave is quoted back; with it taken out every answer is the same.
      const std::string given = p.string();
      if (const size_t at = msg.find(given); at != std::string::npos)
        msg = msg.substr(0, at) + "P" + msg.substr(at + given.size());
      answers.insert(msg);
    }
    CAPTURE(r.value_or("(none)"));
    REQUIRE(answers.size() == 1);
    CHECK(answers.begin()->find(r ? "is not under this worker's --checkpoint-root: not served"
                                  : "this worker serves no checkpoint (it was started without --checkpoint-root)") !=
          std::string::npos);
  }
}

TEST_CASE("a checkpoint under --checkpoint-root is served; a symlink or .. out of it is not") {
  TempDir t;
  const fs::path root = t.path / "served";
  make_checkpoint(root / "ck");
  make_checkpoint(t.path / "outside");
  fs::create_symlink(t.path / "outside", root / "link-out");
  fs::create_symlink(root / "ck", root / "link-in");
  const Workload w = decode_instance_workload(with_checkpoint((root / "ck").string()), "hello", root);
  CHECK(w.model.checkpoint == fs::canonical(root / "ck").string());
  CHECK(w.model.layers == 1);
  // Relative to the root; a symlink that stays inside is followed.
  CHECK(decode_instance_workload(with_checkpoint("ck"), "hello", root).model.checkpoint == w.model.checkpoint);
  CHECK(decode_instance_workload(with_checkpoint((root / "link-in").string()), "hello", root).model.checkpoint ==
        w.model.checkpoint);
  // The root itself may be the checkpoint (a run's own child worker is started so).
  CHECK(decode_instance_workload(with_checkpoint((root / "ck").string()), "hello", root / "ck").model.checkpoint ==
        w.model.checkpoint);
  for (const std::string& p : {(root / "link-out").string(), (root / "ck" / ".." / ".." / "outside").string(),
                               std::string("../outside"), (t.path / "served-not").string()}) {
    CAPTURE(p);
    CHECK(input_error([&] {
            (void)decode_instance_workload(with_checkpoint(p), "hello", root);
          }).find("is not under this worker's --checkpoint-root: not served") != std::string::npos);
  }
  // Inside the root, the checkpoint's own errors are the client's to read.
  fs::create_directories(root / "bare");
  CHECK(input_error([&] {
          (void)decode_instance_workload(with_checkpoint((root / "bare").string()), "hello", root);
        }).find("config.json") != std::string::npos);
}

TEST_CASE("the test-only fault switch: probabilities, push numbers and delays; a bad item is named") {
  const FaultInjection f = parse_fault_injection("fail=0.02,corrupt=@3:7,partial=0.01,seed=11,delay_ack_ms=5");
  CHECK(f.fail == 0.02);
  CHECK(f.corrupt == 0);
  CHECK(f.corrupt_at == std::set<int64_t>{3, 7});
  CHECK(f.partial == 0.01);
  CHECK(f.seed == 11);
  CHECK(f.delay_ack_ms == 5);
  CHECK(f.delay_step_ms == 0);
  CHECK(f.any());
  CHECK(describe(f) == "fail 0.02, corrupt at push 3, corrupt at push 7, partial 0.01, seed 11, acks delayed 5 ms");
  CHECK_FALSE(parse_fault_injection("").any());
  CHECK(parse_fault_injection("delay_step_ms=40").any());
  CHECK(input_error([] { (void)parse_fault_injection("fail=2"); }).find("fail=2: expected a probability") !=
        std::string::npos);
  CHECK(input_error([] { (void)parse_fault_injection("fail=@0"); }).find("fail=@0") != std::string::npos);
  CHECK(input_error([] {
          (void)parse_fault_injection("fail=0.6,corrupt=0.6");
        }).find("fail + corrupt + partial = 1.2 exceeds 1") != std::string::npos);
  CHECK(input_error([] { (void)parse_fault_injection("drop=0.1"); }).find("unknown key 'drop'") != std::string::npos);
  CHECK(input_error([] { (void)parse_fault_injection("seed"); }).find("'seed' is not KEY=VALUE") != std::string::npos);
  CHECK(input_error([] { (void)parse_fault_injection("delay_ack_ms=-1"); }).find("expected an integer") !=
        std::string::npos);
}
