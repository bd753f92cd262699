// downpour-worker — one training worker of a run (usually started by downpour-launch):
//   downpour-worker --id J --run-dir RUN [--config RUN/config.toml] [--quiet] [--local]
// Prints the final test accuracy (evaluating worker) and exits non-zero on any error.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "client/worker/worker_app.h"

int main(int argc, char** argv) {
  downpour::worker::WorkerArgs args;
  CLI::App app{"downpour worker: pull weights, compute gradients, push them"};
  app.add_option("--id", args.id, "worker id (0 .. cluster.workers-1); worker 0 evaluates")->check(CLI::NonNegativeNumber);
  app.add_option("--run-dir", args.run_dir, "run directory (metrics, model)");
  app.add_option("--config", args.config_path, "run config (default <run-dir>/config.toml)");
  app.add_flag("--quiet", args.quiet, "no progress line");
  app.add_flag("--local", args.local, "single-process reference run: no servers, local SGD");
  bool no_shuffle = false;
  app.add_flag("--no-shuffle", no_shuffle, "read the data shard in record order (reproducible runs)");
  app.add_option("--step-delay-ms", args.step_delay_ms,
                 "sleep this long after every step: emulates a straggler (consistency experiments)")
      ->check(CLI::Range(0, 600000));
  app.add_option("--steps", args.steps_override, "override worker.steps (smoke runs)")->check(CLI::PositiveNumber);
  std::string tensors_out;
  app.add_option("--write-tensors", tensors_out,
                 "write the model's tensor list (for downpour-server --tensors) to this file and exit");
  CLI11_PARSE(app, argc, argv);
  args.shuffle = !no_shuffle;
  if (!tensors_out.empty()) {
    const downpour::Status s = downpour::worker::WriteTensorList(args.config_path, tensors_out);
    if (!s.ok()) std::fprintf(stderr, "downpour-worker: %s\n", s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }

  downpour::worker::TrainResult result;
  const downpour::Status s = downpour::worker::RunWorker(args, &result);
  if (!s.ok()) {
    std::fprintf(stderr, "downpour-worker %d: %s\n", args.id, s.ToString().c_str());
    return 1;
  }
  if (result.has_eval) {
    std::printf("worker %d: final test accuracy %.2f%% (top-5 %.2f%%, loss %.4f) after %lld steps, %.0f img/s\n",
                args.id, 100 * result.final_eval.top1, 100 * result.final_eval.top5, result.final_eval.loss,
                static_cast<long long>(result.steps), result.images_per_s);
  } else {
    std::printf("worker %d: done, %lld steps, %.0f img/s\n", args.id, static_cast<long long>(result.steps),
                result.images_per_s);
  }
  return 0;
}
