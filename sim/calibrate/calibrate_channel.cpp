#include "sim/calibrate/calibrate_channel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "backend/cpu/kernels.h"
#include "backend/transfer/channel_kind.h"
#include "core/error.h"
#include "sim/base/csv.h"
#include "sim/base/host_probe.h"
#include "sim/engine/inbox.h"
#include "sim/run/run_setup.h"
#include "sim/workload/workload_gen.h"

namespace tandem {

namespace {

// One transfer's time as the channel measures it: a synchronous channel says it; an
// asynchronous one posts its completion into the inbox.
Duration one_transfer(kv_channel_i& ch, Inbox& inbox, const KvTransfer& t) {
  const TransferStart s = ch.start(t);
  if (!s.ok) throw std::runtime_error(fmt::format("calibrate --channel: transfer failed: {}", s.error));
  if (!s.async) return s.elapsed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    if (!inbox.wait_until(deadline)) throw std::runtime_error("calibrate --channel: no answer from the worker in 60 s");
    Duration got = -1;
    std::string lost;
    inbox.drain([&](Event&& e) {
      if (const auto* d = std::get_if<TransferDone>(&e); d && d->ticket == t.ticket) got = d->ok ? d->elapsed : -2;
      if (const auto* p = std::get_if<PeerLost>(&e)) lost = p->reason;
    });
    if (!lost.empty()) throw std::runtime_error("calibrate --channel: " + lost);
    if (got == -2) throw std::runtime_error("calibrate --channel: the worker refused a transfer");
    if (got >= 0) return got;
  }
}

// `notes`: lines (each ending in a newline) for the file's header: the conditions it was measured
// under, and what marks it.
int write_channel_profile(const std::vector<std::pair<double, double>>& points, const std::string& kind,
                          const std::string& source, const std::string& out_path,
                          const std::vector<SizePoint>& table = {}, const std::string& notes = "") {
  // Least squares in relative terms (each point weighted by 1 / time^2), so that the small
  // transfers count as much as the large ones: seconds = a + bytes / bandwidth.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : points) {
    const double wt = 1.0 / (y * y);
    sw += wt;
    sx += wt * x;
    sy += wt * y;
    sxx += wt * x * x;
    sxy += wt * x * y;
  }
  const double den = sw * sxx - sx * sx;
  double slope = den > 0 ? (sw * sxy - sx * sy) / den : 0;
  double intercept = (sy - slope * sx) / sw;
  if (slope <= 0 || intercept < 0) {  // too few or too noisy points: bandwidth from the largest transfer
    slope = points.back().second / std::max(points.back().first, 1.0);
    intercept = std::max(0.0, intercept);
  }
  ChannelFit fit{intercept, 1.0 / slope, 0};
  for (auto [x, y] : points)
    fit.max_rel_error = std::max(fit.max_rel_error, std::abs(intercept + x * slope - y) / y);
  fmt::print("fit: latency {:.1f} us, bandwidth {:.3f} GB/s (largest error over the sizes {:.1f}%)\n",
             fit.latency_s * 1e6, fit.bandwidth_bytes_per_s / 1e9, 100 * fit.max_rel_error);
  std::ofstream out(out_path);
  out << fmt::format(
      "# KV channel profile: {}\n"
      "# {} sizes from {} to {} bytes; line fit error up to {:.1f}%\n"
      "# use: disaggregation.channel.profile: {}\n"
      "{}"
      "kind: {}\n",
      source, points.size(), int64_t(points.front().first), int64_t(points.back().first), 100 * fit.max_rel_error,
      out_path, notes, kind);
  if (table.empty()) {
    out << fmt::format("bandwidth_gbs: {:.6g}\nlatency_us: {:.6g}\n", fit.bandwidth_bytes_per_s / 1e9,
                       fit.latency_s * 1e6);
  } else {
    // The table prices a transfer (no line fits a real channel's sizes); the line is a comment.
    out << fmt::format("# the line fit, for reference: latency {:.6g} us, bandwidth {:.6g} GB/s\n", fit.latency_s * 1e6,
                       fit.bandwidth_bytes_per_s / 1e9);
    out << "# per size: [bytes, seconds (the medians made non-decreasing: adjacent violators pooled)]  # blocks, "
           "measured median, IQR / median\n"
           "table:\n";
    const std::vector<double> priced = non_decreasing(table);
    for (size_t i = 0; i < table.size(); ++i)
      out << fmt::format("  - [{:.0f}, {:.6g}]  # {} blocks, {:.6g} s, IQR {:.1f}%\n", table[i].bytes, priced[i],
                         table[i].blocks, table[i].median_s, 100 * table[i].spread);
  }
  if (!out) throw std::runtime_error(fmt::format("calibrate --channel: cannot write {}", out_path));
  fmt::print("wrote {}\n", out_path);
  return 0;
}

}  // namespace

// The medians made non-decreasing in size (a larger transfer does not take less time) by
// pooling adjacent violators: a run of sizes that decreases gets its mean, so one slow
// repetition's median does not lift every larger size, as a running maximum would.
std::vector<double> non_decreasing(const std::vector<SizePoint>& table) {
  struct Pool {
    double sum;
    size_t n;
  };
  std::vector<Pool> pools;
  for (const SizePoint& p : table) {
    pools.push_back({p.median_s, 1});
    while (pools.size() > 1 && pools[pools.size() - 2].sum / double(pools[pools.size() - 2].n) >
                                   pools.back().sum / double(pools.back().n)) {
      pools[pools.size() - 2].sum += pools.back().sum;
      pools[pools.size() - 2].n += pools.back().n;
      pools.pop_back();
    }
  }
  std::vector<double> out;
  for (const Pool& p : pools) out.insert(out.end(), p.n, p.sum / double(p.n));
  return out;
}

int calibrate_channel(const std::string& workload, const std::vector<Override>& sets, const std::string& backend,
                      const ExecutorFactory* cuda, int threads, int reps, const std::string& out_path,
                      bool accept_noisy) {
  std::vector<Override> overrides = sets;
  overrides.push_back({"disaggregation.enabled", "true"});
  Workload loaded = load_workload(workload, overrides);
  const std::string kind = loaded.disaggregation.channel.kind;
  if (backend == "sim" || !channel_kind(kind).moves_kv)
    throw InputError(
        fmt::format("calibrate --channel measures a real channel: --backend cpu or cuda, channel kind {}",
                    channel_kind_names([](const ChannelKind& k) { return k.moves_kv; }, " or ")));
  // Set up as a run (sim/run/run_setup.h), without an engine: the blocks are moved here, by hand.
  RunSetup setup(std::move(loaded), {.backend = backend, .threads = threads, .cuda = cuda});
  const Workload& w = setup.workload;
  RunExecutors& run = setup.exec;
  const std::vector<InstanceSpec>& specs = setup.specs;
  Inbox inbox;
  if (run.remote) run.remote->attach(inbox);
  // Sizes up to the workload's longest prompt (what its transfers move), within a quarter of the
  // smaller cache.
  int32_t longest = 1;
  for (const Request& r : generate_requests(w).requests) longest = std::max(longest, r.prompt_len);
  int32_t most = blocks_for(longest, w.engine.block_size);
  const kv_store_i* prefill_kv = nullptr;  // where the blocks are read: their size
  for (size_t i = 0; i < specs.size(); ++i) {
    most = std::min(most, specs[i].engine.resolved_kv_blocks / 4);
    if (specs[i].role == InstanceRole::Prefill) prefill_kv = run.executors[i]->kv_store();
  }
  most = std::max(1, most);
  const int32_t bs = w.engine.block_size;
  std::vector<int32_t> blocks(static_cast<size_t>(most));
  for (int32_t i = 0; i < most; ++i) blocks[size_t(i)] = i;
  std::vector<std::pair<double, double>> points;  // (bytes, seconds): the median of the repetitions per size
  std::vector<SizePoint> table;
  uint64_t ticket = 1;
  // Sizes 1, 2, 3, 4, 6, 8, 12, 16, ...: two a doubling, so that the table follows the bends
  // (caches) between them; the largest size too.
  std::vector<int32_t> sizes;
  for (int32_t p = 1; p <= most; p *= 2) {
    sizes.push_back(p);
    if (p >= 2 && p + p / 2 <= most) sizes.push_back(p + p / 2);
  }
  if (sizes.back() != most) sizes.push_back(most);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  fmt::print("calibrate --channel: {} over {}, block {} tokens, {} sizes of 1..{} blocks, {} repetitions each\n", kind,
             backend, bs, sizes.size(), most, reps);
  // The pair's threads: both instances' compute threads (a tcp worker is a child, counted as this
  // process's own), at least the loop's.
  const ConditionsProbe probe(backend == "cpu" ? 2 * std::max(1, cpu::threads()) : 2);
  fmt::print("{:>8} {:>14} {:>12} {:>10} {:>10}\n", "blocks", "bytes", "median ms", "GB/s", "IQR/med");
  for (const int32_t n : sizes) {
    const std::span<const int32_t> b(blocks.data(), size_t(n));
    std::vector<double> t;
    int64_t bytes = 0;
    for (int r = 0; r < reps + 1; ++r) {
      const KvTransfer x{ticket++, 0, n * bs, b, b, 0, 0};
      const Duration d = one_transfer(*run.channel, inbox, x);
      if (r > 0) t.push_back(to_seconds(d));  // the first of each size warms up (pages, buffers)
      bytes = int64_t(n) * (prefill_kv ? prefill_kv->block_bytes() : 0);
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    const double spread = med > 0 ? (t[t.size() * 3 / 4] - t[t.size() / 4]) / med : 0;
    points.push_back({double(bytes), med});
    table.push_back({n, double(bytes), med, spread});
    fmt::print("{:>8} {:>14} {:>12.4f} {:>10.3f} {:>9.1f}%\n", n, bytes, med * 1e3, double(bytes) / med / 1e9,
               100 * spread);
  }
  if (run.remote) run.remote->detach();
  const MeasureConditions cond = probe.finish();
  std::string notes = fmt::format("# measured under: {}\n", conditions_text(cond));
  fmt::print("measured under: {}\n", conditions_text(cond));
  if (const std::string warning = conditions_warning(cond, "the calibration"); !warning.empty()) {
    fmt::print(stderr, "tandem: warning: {}\n", warning);
    notes += fmt::format("# WARNING: {}\n", warning);
  }
  // The table is only as good as its repetitions agree: judged at the median size's spread.
  std::vector<double> spreads;
  for (const SizePoint& p : table) spreads.push_back(p.spread);
  std::sort(spreads.begin(), spreads.end());
  const double median_spread = spreads.empty() ? 0 : spreads[spreads.size() / 2];
  if (median_spread > kChannelSpreadMax) {
    const std::string why = fmt::format(
        "the sizes' repetitions spread {:.1f} % (IQR / median) at the median size (at most {:.0f} %; "
        "worst {:.1f} %)",
        100 * median_spread, 100 * kChannelSpreadMax, 100 * spreads.back());
    if (!accept_noisy) {
      fmt::print(stderr,
                 "tandem: calibrate --channel: the table was refused, profile not written: {}. Measure again when the "
                 "machine is quieter, with more --reps, or give --accept-noisy to write it anyway (marked so in the "
                 "file)\n",
                 why);
      return 3;
    }
    fmt::print(stderr, "calibrate --channel: written although noisy (--accept-noisy): {}\n", why);
    notes += fmt::format("# ACCEPTED NOISY (--accept-noisy): {}\n", why);
  }
  return write_channel_profile(points, kind,
                               fmt::format("tandem calibrate --channel --backend {} --workload {}; measured on an idle "
                                           "pair of instances, transfers of 1 to {} blocks",
                                           backend, workload, most),
                               out_path, table, notes);
}

int calibrate_channel_from_run(const std::string& run_dir, const std::string& out_path, bool accept_noisy) {
  // The transfers of a measured run (requests.csv): those that found the link idle (started
  // after the one before had ended), so that the fit learns a transfer's own time under the
  // run's load, and the simulator adds the queueing itself.
  CsvFile csv(run_dir + "/requests.csv");
  const size_t start = csv.column_index("transfer_start_s"), end = csv.column_index("transfer_end_s"),
               bytes = csv.column_index("transfer_bytes");
  if (start == CsvFile::npos || end == CsvFile::npos || bytes == CsvFile::npos)
    throw InputError(fmt::format("{}/requests.csv: no transfer columns (a run with disaggregation enabled?)", run_dir));
  struct T {
    double start, end, bytes;
  };
  std::vector<T> all;
  std::vector<std::string> row;
  while (csv.next(row))
    if (!row[start].empty() && !row[end].empty())
      all.push_back({csv.number(row, start, 0, 1e12), csv.number(row, end, 0, 1e12), csv.number(row, bytes, 0, 1e15)});
  std::sort(all.begin(), all.end(), [](const T& a, const T& b) { return a.start < b.start; });
  std::vector<std::pair<double, double>> points;
  double busy_until = -1;
  for (const T& t : all) {
    if (t.start >= busy_until && t.end > t.start && t.bytes > 0) points.push_back({t.bytes, t.end - t.start});
    busy_until = std::max(busy_until, t.end);
  }
  if (points.size() < 3)
    throw InputError(fmt::format("{}/requests.csv: {} transfers found the link idle; at least 3 are needed", run_dir,
                                 points.size()));
  std::sort(points.begin(), points.end());
  fmt::print("calibrate --channel --from-run: {} of {} transfers found the link idle\n", points.size(), all.size());
  std::ifstream in(run_dir + "/workload.resolved.yaml");
  std::string kind = "measured";
  for (std::string line; std::getline(in, line);)
    if (const size_t k = line.find("kind: "); k != std::string::npos) kind = line.substr(k + 6);
  // The run's own record of its conditions (a measured run's summary.json): a run that other work
  // slowed teaches the channel that contention.
  std::string notes;
  std::vector<std::string> warnings;
  {
    std::ifstream sj(run_dir + "/summary.json");
    const nlohmann::json j = nlohmann::json::parse(sj, nullptr, false);
    if (j.is_object() && j.contains("conditions") && j["conditions"].is_object()) {
      const nlohmann::json& c = j["conditions"];
      const auto share = [&](const char* k) {
        return c.contains(k) && c[k].is_number() ? fmt::format("{:.1f} %", 100 * c[k].get<double>()) : std::string("?");
      };
      notes += fmt::format("# the run was measured under: other work took {} of its cores' time (steal {})\n",
                           share("cores_taken_share"), share("steal_share"));
      if (j.contains("warnings") && j["warnings"].is_array())
        for (const auto& w : j["warnings"])
          if (w.is_string()) warnings.push_back(w.get<std::string>());
    }
  }
  if (!warnings.empty()) {
    if (!accept_noisy) {
      fmt::print(stderr,
                 "tandem: calibrate --channel --from-run: {}/summary.json warns that the run was measured under "
                 "contention, profile not written: {}. Give --accept-noisy to write it anyway (marked so in the "
                 "file)\n",
                 run_dir, warnings.front());
      return 3;
    }
    for (const std::string& w : warnings)
      notes += fmt::format("# ACCEPTED NOISY (--accept-noisy), the run warned: {}\n", w);
  }
  return write_channel_profile(
      points, kind,
      fmt::format("tandem calibrate --channel --from-run {}; {} transfers of a served run that "
                  "found the link idle",
                  run_dir, points.size()),
      out_path, {}, notes);
}

}  // namespace tandem