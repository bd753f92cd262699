// downpour-time — Caffe's `time` command: per-layer forward/backward ms and images/s of a
// full training step for a model config and batch size.
//   downpour-time --model configs/models/alexnet.toml --batch 64 --iterations 10 --threads 2 --device cpu
//   downpour-time ... --json     the same as one JSON object on stdout (for scripts and bench/):
//     {"model", "config", "backend", "device", "batch", "threads" (the count used; null on a GPU),
//      "iterations", "warmup", "params", "layers": [{"layer", "type", "forward_ms", "backward_ms"}],
//      "forward_ms", "backward_ms" (sums over layers), "step_ms" (forward + backward + SGD update),
//      "step_cpu_ms" (the process's CPU time per full step, all threads), "images_per_s",
//      "worker_step_ms" (the step a worker runs: no SGD, page-locked input on a GPU, weights uploaded
//      per layer, gradients handed over as they land), "worker_bytes_step_ms" (the same with a GPU
//      worker's byte input; null where the backend does not normalise input)}; times are means per
//      iteration in milliseconds.
#include <omp.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "client/engine/net.h"
#include "client/engine/net_timer.h"
#include "common/cli.h"
#include "common/run_config.h"

namespace {

// "cpu" | "gpu" | "gpu:N" → device kind and GPU id (worker.device's rule; "gpu" is gpu:0).
downpour::Status ParseDevice(const std::string& device, downpour::engine::NetOptions* opt) {
  if (!downpour::ParseDevice(device == "gpu" ? "gpu:0" : device, &opt->worker))
    return downpour::InvalidArgument("--device '{}': expected cpu, gpu or gpu:N with N a GPU index", device);
  return downpour::Status::Ok();
}

// A JSON string literal of `text` (quotes, backslashes and control characters escaped).
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string TimingJson(const downpour::engine::NetTiming& t, const std::string& model, const std::string& config,
                       const std::string& backend, const std::string& device, int threads, int warmup,
                       int64_t params) {
  std::string layers;
  for (const auto& l : t.layers) {
    if (!layers.empty()) layers += ", ";
    layers += fmt::format(R"({{"layer": {}, "type": {}, "forward_ms": {:.4f}, "backward_ms": {:.4f}}})",
                          JsonString(l.name), JsonString(l.type), l.forward_ms, l.backward_ms);
  }
  return fmt::format(
      R"({{"model": {}, "config": {}, "backend": {}, "device": {}, "batch": {}, "threads": {}, "iterations": {}, )"
      R"("warmup": {}, "params": {}, "layers": [{}], "forward_ms": {:.4f}, "backward_ms": {:.4f}, )"
      R"("step_ms": {:.4f}, "step_cpu_ms": {:.4f}, "images_per_s": {:.3f}, "worker_step_ms": {:.4f}, )"
      R"("worker_bytes_step_ms": {}}})"
      "\n",
      JsonString(model), JsonString(config), JsonString(backend), JsonString(device), t.batch,
      threads > 0 ? std::to_string(threads) : "null", t.iterations, warmup, params, layers, t.forward_ms, t.backward_ms,
      t.step_ms, t.step_cpu_ms, t.images_per_s, t.worker_step_ms,
      t.worker_bytes_step_ms > 0 ? fmt::format("{:.4f}", t.worker_bytes_step_ms) : "null");
}

// "2 (all cores)" for threads = 0, else the count asked for; GPU timings use no CPU threads.
std::string ThreadsText(const downpour::engine::NetOptions& opt) {
  if (opt.worker.device == downpour::DeviceKind::kGpu) return "n/a (GPU)";
  if (opt.worker.threads > 0) return std::to_string(opt.worker.threads);
  return fmt::format("{} (all cores)", omp_get_max_threads());
}

int Run(int argc, char** argv) {
  using namespace downpour::engine;
  namespace cli = downpour::cli;
  CLI::App app{"downpour-time: per-layer and full-step timing of a model"};
  cli::AddStandardFlags(&app, "downpour-time");
  std::string model;
  int batch = 64, iterations = 10, threads = 0, warmup = 1;
  std::string device = "cpu";
  bool reference = false;
  std::string tf32 = "on", conv_algo = "search";
  bool json = false;
  app.add_option("-m,--model", model, "model config (TOML), e.g. configs/models/alexnet.toml")->required();
  app.add_option("-b,--batch", batch, "batch size (default 64)")->check(cli::Between(1, 1000000));
  app.add_option("-n,--iterations", iterations, "timed iterations (default 10)")->check(cli::Between(1, 1000000));
  app.add_option("--warmup", warmup, "untimed iterations first (default 1)")->check(cli::Between(0, 1000000));
  app.add_option("-t,--threads", threads, "CPU compute threads (default 0: all cores)")->check(cli::Between(0, 4096));
  app.add_option("-d,--device", device, "cpu, gpu or gpu:N (default cpu)");
  app.add_flag("--reference", reference, "use the naive reference backend (CPU, slow)");
  app.add_option("--tf32", tf32, "GPU: TF32 tensor cores for fp32 conv/GEMM (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--conv-algo", conv_algo, "GPU: cuDNN convolution algorithm choice (default search)")
      ->check(CLI::IsMember(downpour::kConvAlgoNames));
  app.add_flag("--json", json, "print the timing as one JSON object instead of the table");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;

  NetOptions opt;
  downpour::Status s = ParseDevice(device, &opt);
  if (!s.ok()) return cli::Fail("downpour-time", s, cli::kExitUsage);
  NetSpec spec;
  s = ParseNetSpecFile(model, &spec);
  if (!s.ok()) return cli::Fail("downpour-time", s, cli::SetupExitCode(s));
  opt.reference = reference;
  opt.batch = batch;
  opt.worker.threads = threads;
  opt.worker.tf32 = tf32 == "on";
  opt.worker.conv_algo = conv_algo;
  std::unique_ptr<Net> net;
  s = Net::Create(spec, opt, &net);
  if (!s.ok()) return cli::Fail("downpour-time", s, cli::kExitFailure);
  net->InitParams(1);
  if (json) {
    const NetTiming t = TimeNet(*net, iterations, warmup);
    const int used_threads =
        opt.worker.device == downpour::DeviceKind::kGpu ? 0 : (threads > 0 ? threads : omp_get_max_threads());
    std::fputs(TimingJson(t, spec.name, model, net->backend().name(), device, used_threads, warmup,
                          static_cast<int64_t>(net->params().size()))
                   .c_str(),
               stdout);
    return cli::kExitOk;
  }
  std::printf("model %s (%s), backend %s, batch %d, %lld parameters, threads %s\n", spec.name.c_str(), model.c_str(),
              net->backend().name().c_str(), batch, static_cast<long long>(net->params().size()),
              ThreadsText(opt).c_str());
  const NetTiming t = TimeNet(*net, iterations, warmup);
  std::fputs(FormatTiming(t).c_str(), stdout);
  return cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return downpour::cli::Main("downpour-time", [&] { return Run(argc, argv); });
}
