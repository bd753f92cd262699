// downpour-test — Caffe's `caffe test`: a saved model evaluated on a test set, printing top-1,
// top-5 and the mean loss. A thin main over worker_app.h TestSavedModel.
//
//   downpour-test --run-dir RUN                      RUN/config.toml + RUN/model_final.dpt on data.test
//   downpour-test -c run.toml -w model.dpt|net.caffemodel [--data LMDB] [--set K=V]...
//                 [--batch 100] [--batches N] [--json]
//
// The test set is preprocessed as the run config says (data.crop as a centre crop, mean, scale).
// Exit codes (common/cli.h): 0 ok, 1 a failure while evaluating, 2 bad flags, config or files.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "client/worker/worker_app.h"
#include "common/cli.h"
#include "common/metrics.h"

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  namespace fs = std::filesystem;
  downpour::worker::TestArgs args;
  std::string run_dir;
  bool json = false;
  CLI::App app{"downpour-test: evaluate a saved model on a test set (top-1, top-5, loss), like `caffe test`"};
  cli::AddStandardFlags(&app, "downpour-test");
  app.add_option("--run-dir", run_dir, "a run directory: its config.toml and model_final.dpt (each overridable)");
  app.add_option("-c,--config", args.config_path, "run config: the model, the test set and its preprocessing");
  cli::AddSetOption(&app, &args.sets);
  app.add_option("-w,--weights", args.weights, "saved weights: a tensor file (model_final.dpt) or a .caffemodel");
  app.add_option("-d,--data", args.data, "test LMDB (or IDX images file) instead of the config's data.test");
  app.add_option("-b,--batch", args.batch, "images per forward pass (default 100)")->check(cli::Between(1, 65536));
  app.add_option("-n,--batches", args.max_batches, "evaluate only this many batches (default 0: the whole set)")
      ->check(cli::AtLeast(0));
  app.add_flag("--json", json, "print the result as one JSON line");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  if (!run_dir.empty()) {
    if (args.config_path.empty()) args.config_path = (fs::path(run_dir) / "config.toml").string();
    if (args.weights.empty()) args.weights = (fs::path(run_dir) / "model_final.dpt").string();
  }
  if (args.config_path.empty()) {
    std::fprintf(stderr, "downpour-test: give --run-dir RUN, or --config FILE with --weights FILE\n");
    return cli::kExitUsage;
  }
  return cli::Main("downpour-test", [&] {
    downpour::worker::TestResult r;
    const downpour::Status s = downpour::worker::TestSavedModel(args, &r);
    if (!s.ok()) return cli::Fail("downpour-test", s, cli::SetupExitCode(s));
    if (json) {
      std::printf("{\"model\":%s,\"data\":%s,\"images\":%lld,\"top1\":%.6f,\"top5\":%.6f,\"loss\":%.6f}\n",
                  downpour::JsonQuote(r.model).c_str(), downpour::JsonQuote(r.data).c_str(),
                  static_cast<long long>(r.eval.images), r.eval.top1, r.eval.top5, r.eval.loss);
    } else {
      std::printf("%s\n  on %s: %lld images\n  top-1 %.2f%%  top-5 %.2f%%  loss %.4f\n", r.model.c_str(),
                  r.data.c_str(), static_cast<long long>(r.eval.images), 100 * r.eval.top1, 100 * r.eval.top5,
                  r.eval.loss);
    }
    return cli::kExitOk;
  });
}
