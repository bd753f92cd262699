// history_main.cc — downpour-history: checks a finished run's history (server/history_check.h).
//
//   downpour-history RUN_DIR [--tensors FILE | --model NAME] [--json FILE]
//
// The run must have kept its history (checkpoint.history = true in RUN_DIR/config.toml). The
// layout comes from the launcher's RUN_DIR/tensors.txt (or, for a job launched by role across
// hosts, tensors-coordinator.txt or tensors-server-0.txt) unless --tensors or --model names it.
// Prints a line per server and per worker, then the verdict; --json writes the same as one
// object (tools and the fault table read it).
//
// Exit codes (common/cli.h): 0 the history holds: every acknowledged push applied exactly once,
// none applied twice, every server's last checkpoint equal to the replay of its log; 1 it does
// not, or part of it could not be checked (each named); 2 usage or input (no history kept, a
// missing or corrupt log or ack file).
#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/file_io.h"
#include "common/metrics.h"
#include "common/run_config.h"
#include "server/history_check.h"
#include "server/model_host.h"

namespace downpour {
namespace {

constexpr std::string_view kProgram = "downpour-history";

std::string Json(const HistoryReport& r) {
  std::string out = fmt::format("{{\"valid\": {}, \"servers\": [", r.valid() ? "true" : "false");
  for (size_t i = 0; i < r.servers.size(); ++i) {
    const ServerHistory& h = r.servers[i];
    out += fmt::format("{}{{\"server\": {}, \"segments\": {}, \"records\": {}, \"last_seq\": {}, \"pushes\": {}, "
                       "\"torn_tail\": {}, \"checkpoint\": {}, \"checkpoint_seq\": {}, \"equal\": {}, "
                       "\"floats_compared\": {}, \"difference\": {}}}",
                       i ? ", " : "", h.server, h.segments, h.records, h.last_seq, h.pushes, h.torn_tail,
                       h.checkpoint, h.checkpoint_seq, h.equal, h.floats_compared, JsonQuote(h.difference));
  }
  out += "], \"workers\": [";
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const WorkerHistory& w = r.workers[i];
    out += fmt::format("{}{{\"worker\": {}, \"has_acks\": {}, \"acked\": {}, \"lost\": {}, \"acked_twice\": {}, "
                       "\"applied\": {}, \"applied_twice\": {}, \"applied_unacked\": {}, \"partial_lines\": {}}}",
                       i ? ", " : "", w.worker, w.has_acks, w.acked, w.lost, w.acked_twice, w.applied,
                       w.applied_twice, w.applied_unacked, w.partial_lines);
  }
  const auto list = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + JsonQuote(v[i]);
    return s + "]";
  };
  return out + fmt::format("], \"violations\": {}, \"unknowns\": {}}}\n", list(r.violations), list(r.unknowns));
}

void Print(const std::string& run_dir, const HistoryReport& r) {
  fmt::print("{}: {}\n", kProgram, run_dir);
  uint64_t lost = 0, twice = 0, equal = 0;
  for (const ServerHistory& h : r.servers) {
    std::string replay = !h.checkpoint ? "no checkpoint to compare the replay with"
                         : h.equal     ? fmt::format("the replay to seq {} equals its last checkpoint ({} floats, bit for "
                                                     "bit, and every chunk's state and version)",
                                                     h.checkpoint_seq, h.floats_compared)
                                       : fmt::format("the replay to seq {} DIFFERS from its last checkpoint: {}",
                                                     h.checkpoint_seq, h.difference);
    equal += h.equal ? 1 : 0;
    fmt::print("  server {}: {} records in {} file{} (seq 1..{}{}), {} pushes; {}\n", h.server, h.records, h.segments,
               h.segments == 1 ? "" : "s", h.last_seq, h.torn_tail ? ", then a torn record" : "", h.pushes, replay);
  }
  for (const WorkerHistory& w : r.workers) {
    lost += w.lost;
    twice += w.applied_twice;
    if (!w.has_acks) {
      fmt::print("  worker {}: {} pushes logged, no acknowledgement history\n", w.worker, w.applied);
      continue;
    }
    fmt::print("  worker {}: {} acknowledged pushes: {} lost, {} applied twice; {} applied without a recorded "
               "acknowledgement{}\n",
               w.worker, w.acked, w.lost, w.applied_twice, w.applied_unacked,
               w.partial_lines ? " (its ack file ends in a partial line)" : "");
  }
  for (const std::string& v : r.violations) fmt::print("  VIOLATION: {}\n", v);
  for (const std::string& u : r.unknowns) fmt::print("  not checked: {}\n", u);
  fmt::print("history: {}: {} acknowledged pushes lost, {} applied twice, the replay equals the last checkpoint on {} "
             "of {} servers\n",
             !r.violations.empty() ? "VIOLATED" : r.valid() ? "valid" : "unknown", lost, twice, equal,
             r.servers.size());
}

int Run(const std::string& run_dir, const std::string& tensors, const std::string& model, const std::string& json) {
  spdlog::set_level(spdlog::level::warn);  // the shards' own lines (restored, replayed) are not the report
  const std::string config_path = (std::filesystem::path(run_dir) / "config.toml").string();
  RunConfig cfg;
  Status s = LoadRunConfig(config_path, &cfg);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitUsage);
  // The launcher's tensor list: D/tensors.txt for a whole job, D/tensors-<role>.txt for a task of
  // a job across hosts (every process of a single-model run has the same list).
  std::string list = tensors;
  if (list.empty() && model.empty()) {
    for (const char* name : {"tensors.txt", "tensors-coordinator.txt", "tensors-server-0.txt"}) {
      list = (std::filesystem::path(run_dir) / name).string();
      if (std::filesystem::exists(list)) break;
    }
  }
  std::vector<ParamLayout> layouts;
  s = LoadRunLayouts(cfg, config_path, list, model, run_dir, &layouts);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitUsage);
  HistoryReport report;
  s = CheckRunHistory(run_dir, cfg, layouts[0], &report);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitUsage);
  Print(run_dir, report);
  if (!json.empty()) {
    s = WriteFileAtomic(json, Json(report));
    if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitFailure);
  }
  return report.valid() ? cli::kExitOk : cli::kExitFailure;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  std::string run_dir, tensors, model, json;
  CLI::App app{"downpour-history: check that every acknowledged push of a run was applied exactly once and that "
               "each server's last checkpoint equals a replay of its log (needs checkpoint.history = true)"};
  cli::AddStandardFlags(&app, "downpour-history");
  app.add_option("run_dir", run_dir, "the run directory")->required();
  auto* t = app.add_option("--tensors", tensors, "the tensor list (default RUN_DIR/tensors.txt)");
  auto* m = app.add_option("--model", model, "a built-in tensor list instead (alexnet-shapes)");
  t->excludes(m);
  app.add_option("--json", json, "also write the report to this file as JSON");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  return cli::Main("downpour-history", [&] { return downpour::Run(run_dir, tensors, model, json); });
}
