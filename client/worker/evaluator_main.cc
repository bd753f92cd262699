// downpour-evaluator — the run's evaluator (client/worker/evaluator.h; started by
// downpour-launch, one per distributed run with eval.evaluator = true and a test set):
//   downpour-evaluator --run-dir RUN [--config RUN/config.toml] [--set K=V]... [--quiet]
//                      [--coordinator HOST:PORT] [--bind SOURCE_ADDRESS] [--probe-ms 50]
// Evaluates snapshots of the servers' weights on eval.every_updates / every_seconds, and the
// final weights once every worker has finished (saved as RUN/model_final.dpt); prints the final
// test accuracy. Exit codes (common/cli.h): 0 ok, 1 a failure after it started, 2 a bad flag,
// config or input found before it started.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "client/worker/evaluator.h"
#include "common/cli.h"

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  downpour::worker::EvaluatorArgs args;
  CLI::App app{"downpour evaluator: evaluate the servers' weights on a schedule and at the end of the run"};
  cli::AddStandardFlags(&app, "downpour-evaluator");
  app.add_option("--run-dir", args.run_dir, "run directory (metrics, model_final.dpt)");
  app.add_option("-c,--config", args.config_path, "run config (default <run-dir>/config.toml)");
  cli::AddSetOption(&app, &args.sets);
  app.add_flag("-q,--quiet", args.quiet, "no line per evaluation");
  app.add_option("--coordinator", args.net.coordinator, "coordinator host:port (default cluster.coordinator)");
  app.add_option("--bind", args.net.bind,
                 "source address of the evaluator's connections (default: cluster.bind when it names one "
                 "non-loopback address, else any)");
  app.add_option("--probe-ms", args.probe_ms, "how often to ask the servers how far training is (ms)")
      ->check(cli::Between(1, 60000));
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  return cli::Main("downpour-evaluator", [&] {
    downpour::worker::EvaluatorResult result;
    bool started = false;
    const downpour::Status s = downpour::worker::RunEvaluator(args, &result, &started);
    if (!s.ok()) return cli::Fail("downpour-evaluator", s, started ? cli::kExitFailure : cli::SetupExitCode(s));
    if (result.has_final) {
      std::printf("evaluator: final test accuracy %.2f%% (top-5 %.2f%%, loss %.4f); %d evaluations, %d points skipped\n",
                  100 * result.final_eval.top1, 100 * result.final_eval.top5, result.final_eval.loss,
                  result.evaluations, result.skipped);
    } else {
      std::printf("evaluator: the run ended before every worker finished: no final evaluation (%d evaluations)\n",
                  result.evaluations);
    }
    return cli::kExitOk;
  });
}
