// downpour-time — Caffe's `time` command: per-layer forward/backward ms and images/s of a
// full training step for a model config and batch size.
//   downpour-time --model configs/models/alexnet.toml --batch 64 --iterations 10 --threads 2 --device cpu
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "client/engine/net.h"
#include "client/engine/net_timer.h"
#include "common/run_config.h"

namespace {

// "cpu" | "gpu" | "gpu:N" → device kind and GPU id.
downpour::Status ParseDevice(const std::string& device, downpour::engine::NetOptions* opt) {
  using downpour::engine::DeviceKind;
  if (device == "cpu") {
    opt->device = DeviceKind::kCpu;
    return downpour::Status::Ok();
  }
  if (device == "gpu" || device.rfind("gpu:", 0) == 0) {
    opt->device = DeviceKind::kGpu;
    opt->gpu_id = 0;
    if (device.size() > 4) {
      const std::string id = device.substr(4);
      if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos || id.size() > 6)
        return downpour::InvalidArgument("--device '{}': expected cpu, gpu or gpu:N with N a GPU index",
                                         device);
      opt->gpu_id = std::stoi(id);
    }
    return downpour::Status::Ok();
  }
  return downpour::InvalidArgument("--device '{}': expected cpu, gpu or gpu:N", device);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace downpour::engine;
  CLI::App app{"downpour-time: per-layer and full-step timing of a model"};
  std::string model;
  int batch = 64, iterations = 10, threads = 0, warmup = 1;
  std::string device = "cpu";
  bool reference = false;
  std::string tf32 = "on", conv_algo = "search";
  app.add_option("--model", model, "model config (TOML), e.g. configs/models/alexnet.toml")->required();
  app.add_option("--batch", batch, "batch size (default 64)")->check(CLI::Range(1, 1000000));
  app.add_option("--iterations", iterations, "timed iterations (default 10)")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed iterations first (default 1)")->check(CLI::Range(0, 1000000));
  app.add_option("--threads", threads, "CPU compute threads (default: library default)");
  app.add_option("--device", device, "cpu, gpu or gpu:N (default cpu)");
  app.add_flag("--reference", reference, "use the naive reference backend (CPU, slow)");
  app.add_option("--tf32", tf32, "GPU: TF32 tensor cores for fp32 conv/GEMM (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--conv-algo", conv_algo, "GPU: cuDNN convolution algorithm choice (default search)")
      ->check(CLI::IsMember(downpour::kConvAlgoNames));
  CLI11_PARSE(app, argc, argv);

  NetOptions opt;
  downpour::Status s = ParseDevice(device, &opt);
  if (!s.ok()) {
    std::fprintf(stderr, "downpour-time: %s\n", s.ToString().c_str());
    return 1;
  }
  NetSpec spec;
  s = ParseNetSpecFile(model, &spec);
  if (!s.ok()) {
    std::fprintf(stderr, "downpour-time: %s\n", s.ToString().c_str());
    return 1;
  }
  opt.reference = reference;
  opt.batch = batch;
  opt.threads = threads;
  opt.tf32 = tf32 == "on";
  opt.conv_algo = conv_algo;
  std::unique_ptr<Net> net;
  s = Net::Create(spec, opt, &net);
  if (!s.ok()) {
    std::fprintf(stderr, "downpour-time: %s\n", s.ToString().c_str());
    return 1;
  }
  net->InitParams(1);
  std::printf("model %s (%s), backend %s, batch %d, %lld parameters, threads %d\n",
              spec.name.c_str(), model.c_str(), net->backend().name().c_str(), batch,
              static_cast<long long>(net->params().size()), threads);
  const NetTiming t = TimeNet(*net, iterations, warmup);
  std::fputs(FormatTiming(t).c_str(), stdout);
  return 0;
}
