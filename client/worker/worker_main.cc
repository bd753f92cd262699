// downpour-worker — one training worker of a run (usually started by downpour-launch):
//   downpour-worker [--id J] --run-dir RUN [--config RUN/config.toml] [--set K=V]... [--quiet] [--local]
//                   [--coordinator HOST:PORT] [--bind SOURCE_ADDRESS] [--no-overlap]
// Prints the final test accuracy (evaluating worker). Exit codes (common/cli.h): 0 ok, 1 a
// failure while training, 2 a bad flag, config or input found before training started.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "client/worker/worker_app.h"
#include "common/cli.h"

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  downpour::worker::WorkerArgs args;
  args.id = -1;  // no --id: the coordinator assigns one (a worker joining a running job); --local: 0
  CLI::App app{"downpour worker: pull weights, compute gradients, push them"};
  cli::AddStandardFlags(&app, "downpour-worker");
  app.add_option("-i,--id", args.id,
                 "worker id (0 .. cluster.workers-1; up to cluster.max_workers-1 to join a running job; -1 or "
                 "omitted: the coordinator assigns one); worker 0 evaluates")
      ->check(cli::AtLeast(-1));
  app.add_option("--run-dir", args.run_dir, "run directory (metrics, model)");
  app.add_option("-c,--config", args.config_path, "run config (default <run-dir>/config.toml)");
  cli::AddSetOption(&app, &args.sets);
  app.add_flag("-q,--quiet", args.quiet, "no progress line");
  app.add_flag("--local", args.local, "single-process reference run: no servers, local SGD");
  app.add_option("--coordinator", args.net.coordinator, "coordinator host:port (default cluster.coordinator)");
  app.add_option("--bind", args.net.bind,
                 "source address of this worker's connections (default: cluster.bind when it names one non-loopback "
                 "address, else any)");
  app.add_flag("--resume", args.resume,
               "continue from <run-dir>/state/worker-<id>.toml (downpour-launch --resume passes it)");
  bool no_shuffle = false;
  app.add_flag("--no-shuffle", no_shuffle, "read the data shard in record order (reproducible runs)");
  app.add_option("--step-delay-ms", args.step_delay_ms,
                 "sleep this long after every step: emulates a straggler (consistency experiments)")
      ->check(cli::Between(0, 600000));
  bool no_overlap = false;
  app.add_flag("--no-overlap", no_overlap,
               "async/ssp: pull all weights at the start of each step instead of layer by layer during the "
               "previous step's backward (for comparing the two)");
  app.add_option("--steps", args.steps_override, "override worker.steps (smoke runs)")->check(cli::AtLeast(1));
  std::string tensors_out;
  app.add_option("--write-tensors", tensors_out,
                 "write the model's tensor list (for downpour-server --tensors) to this file and exit");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  args.shuffle = !no_shuffle;
  args.overlap = !no_overlap;
  if (args.local && args.id < 0) args.id = 0;
  // A joining worker without --id learns its id from the coordinator (its log lines name it).
  const std::string program = args.id >= 0 ? fmt::format("downpour-worker {}", args.id) : "downpour-worker";
  const std::string who = args.id >= 0 ? fmt::format("worker {}", args.id) : "worker";
  return cli::Main(program, [&] {
    if (!tensors_out.empty()) {
      const downpour::Status s = downpour::worker::WriteTensorList(args.config_path, args.sets, tensors_out);
      return s.ok() ? cli::kExitOk : cli::Fail("downpour-worker", s, cli::SetupExitCode(s));
    }
    downpour::worker::TrainResult result;
    bool started = false;
    const downpour::Status s = downpour::worker::RunWorker(args, &result, &started);
    if (!s.ok()) return cli::Fail(program, s, started ? cli::kExitFailure : cli::SetupExitCode(s));
    if (result.has_eval) {
      std::printf("%s: final test accuracy %.2f%% (top-5 %.2f%%, loss %.4f) after %lld steps, %.0f img/s\n",
                  who.c_str(), 100 * result.final_eval.top1, 100 * result.final_eval.top5, result.final_eval.loss,
                  static_cast<long long>(result.steps), result.images_per_s);
    } else {
      std::printf("%s: done, %lld steps, %.0f img/s\n", who.c_str(), static_cast<long long>(result.steps),
                  result.images_per_s);
    }
    return cli::kExitOk;
  });
}
