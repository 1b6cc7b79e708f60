#include "sim/commands/generate_command.h"

#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/llama.h"
#include "sim/workload/config.h"

namespace tandem {

namespace po = boost::program_options;

int generate_command(const std::vector<std::string>& args) {
  po::options_description opts("tandem generate");
  opts.add_options()("checkpoint", po::value<std::string>(), "Hugging Face folder (config.json + *.safetensors)")(
      "model", po::value<std::string>(), "or a preset with dummy weights")(
      "seed", po::value<std::string>(), "dummy weights' seed (with --model; default 0)")(
      "prompt", po::value<std::string>(), "space-separated token ids")(
      "max-tokens", po::value<int>()->default_value(32), "tokens to generate")(
      "logits-out", po::value<std::string>(),
      "write raw logits, no header: float32 in the host's byte order, vocab floats a row, one row for every "
      "position followed by a token (row i scores token i + 1): P + N - 1 rows for a prompt of P ids and "
      "--max-tokens N")("threads", po::value<int>()->default_value(0),
                                                 "threads (0: all cores)")("help,h", po::bool_switch(), "this help");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  if (vm["help"].as<bool>()) {
    std::cout << "usage: tandem generate (--checkpoint DIR | --model PRESET [--seed N]) --prompt \"IDS\" [--max-tokens N] "
                 "[--logits-out FILE] [--threads N]\n"
              << opts;
    return 0;
  }
  if (vm.count("checkpoint") == vm.count("model"))
    throw InputError("generate: give --checkpoint DIR or --model PRESET");
  if (!vm.count("prompt")) throw InputError("generate: --prompt \"ID ID ...\" is required");
  if (vm.count("checkpoint") && vm.count("seed"))
    throw InputError("generate: --seed sets dummy weights (with --model); a --checkpoint has its own weights");
  uint64_t seed = 0;
  if (vm.count("seed")) {  // digits only: boost would read "-1" as 2^64 - 1
    const std::string& t = vm["seed"].as<std::string>();
    size_t used = 0;
    try {
      if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos) seed = std::stoull(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != t.size())
      throw InputError(fmt::format("generate: --seed: '{}' is not an integer in [0, 2^64)", t));
  }
  cpu::set_threads(vm["threads"].as<int>());
  ModelSpec m;
  cpu::LlamaWeights w;
  if (vm.count("checkpoint")) {
    w = cpu::load_checkpoint(vm["checkpoint"].as<std::string>(), m);
    m.name = vm["checkpoint"].as<std::string>();
  } else {
    auto p = model_preset(vm["model"].as<std::string>());
    if (!p) throw InputError(fmt::format("generate: unknown model preset '{}'", vm["model"].as<std::string>()));
    m = *p;
    cpu::check_fits_in_memory(m, 0);
    w = cpu::dummy_weights(m, seed);
  }
  std::vector<Token> prompt;
  std::istringstream in(vm["prompt"].as<std::string>());
  for (std::string tok; in >> tok;) {
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(tok, &used);
    } catch (const std::exception&) {}
    if (used != tok.size() || v < 0 || v >= m.vocab)
      throw InputError(fmt::format("generate: --prompt: '{}' is not a token id in [0, {})", tok, m.vocab));
    prompt.push_back(Token(v));
  }
  const int n_new = vm["max-tokens"].as<int>();
  if (prompt.empty() || n_new < 0 || n_new > 1'000'000)
    throw InputError("generate: need a non-empty prompt and 0 <= --max-tokens <= 1000000");
  const int64_t total = int64_t(prompt.size()) + n_new;
  if (total > m.max_model_len)
    throw InputError(fmt::format("generate: prompt ({}) + --max-tokens ({}) exceeds the model's max_model_len ({})",
                                 prompt.size(), n_new, m.max_model_len));
  const int32_t bs = 16, blocks = blocks_for(total, bs);  // any block size: the model is invariant to it
  cpu::LlamaModel model(m, std::move(w), blocks, bs);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) table[size_t(b)] = b;
  // One token per step, so every position's logits come out; the chunk-invariance of the
  // model makes this identical to one prefill of the whole prompt.
  std::vector<Token> seq = prompt, sampled;
  std::vector<float> logits, all;
  for (int32_t pos = 0; pos + 1 < total; ++pos) {
    StepPlan plan;
    plan.add({0, 1, pos, true, table}, int32_t(prompt.size()));
    plan.tokens = {seq[size_t(pos)]};
    sampled.clear();
    model.forward(plan, plan.tokens, sampled, &logits);
    all.insert(all.end(), logits.begin(), logits.end());
    if (pos + 1 >= int32_t(prompt.size())) seq.push_back(sampled[0]);
  }
  for (size_t i = prompt.size(); i < seq.size(); ++i) std::cout << (i > prompt.size() ? " " : "") << seq[i];
  std::cout << "\n";
  if (vm.count("logits-out")) {
    std::ofstream f(vm["logits-out"].as<std::string>(), std::ios::binary);
    if (!f) throw InputError(fmt::format("generate: cannot write {}", vm["logits-out"].as<std::string>()));
    f.write(reinterpret_cast<const char*>(all.data()), std::streamsize(all.size() * sizeof(float)));
  }
  return 0;
}

}  // namespace tandem
