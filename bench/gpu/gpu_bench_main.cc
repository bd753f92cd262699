// downpour-bench-gpu — AlexNet (or any model config) on the CUDA backend, timed three ways,
// with per-layer times and the cuDNN algorithm each convolution runs:
//   device_step   Net::ForwardLayer / BackwardLayer over every layer, one sync at the end: the
//                 engine's compute plus the per-tensor gradient downloads the layer contract
//                 makes BackwardLayer do (no input or parameter upload, no SGD). The closest the
//                 Net API gets to PyTorch's forward + backward.
//   engine_step   Net::ForwardBackward: + input upload, the per-step parameter upload (a pull
//                 lands in the host mirror) and every gradient download before its callback
//                 (a push): what a downpour worker pays per step, minus the network.
//   train_step    engine_step + the host SGD update (downpour-time's "full training step").
//   worker_step   the step a worker runs (net_timer.h's, as downpour-time reports it):
//                 Net::ForwardBackward with the input in page-locked
//                 memory (as the loader's ring is on a GPU worker), the weights uploaded layer by
//                 layer before each layer (the overlapped pull's path), and a grad-ready callback
//                 per tensor as its download lands (where the worker pushes); no SGD (the
//                 servers do it). Its peer is PyTorch's fwd + bwd + SGD with the input uploaded
//                 from page-locked memory every step (pytorch_alexnet.py's upload_step).
//   worker_bytes_step  worker_step with the input as a GPU worker's loader yields it
//                 (common/byte_batch.h): uint8 crop windows of 256×256 records in page-locked
//                 memory, mirrored at random, normalised on the device, each next batch uploaded
//                 during the step before; a quarter of the input bytes.
// Usage:
//   downpour-bench-gpu --model configs/models/alexnet.toml --batch 128 --batch 256
//                      --iterations 20 --conv-algo search --tf32 on --json out.json
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "client/engine/gpu/cuda_backend.h"
#include "client/engine/net.h"
#include "client/engine/net_timer.h"
#include "common/cli.h"

namespace {

using namespace downpour::engine;

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct BatchResult {
  int batch = 0;
  NetTiming timing;  // per layer + train_step (downpour-time's numbers)
  double device_step_ms = 0, engine_step_ms = 0, worker_step_ms = 0, worker_bytes_step_ms = 0;
  std::vector<ConvAlgoChoice> algos;
};

downpour::Status RunBatch(const NetSpec& spec, const CudaOptions& cuda, int batch, int iterations, int warmup,
                          BatchResult* out) {
  std::unique_ptr<Backend> backend;
  DP_RETURN_IF_ERROR(CreateCudaBackend(cuda, &backend));
  NetOptions opt;
  opt.worker.device = DeviceKind::kGpu;
  opt.worker.gpu_index = cuda.gpu_id;
  opt.batch = batch;
  std::unique_ptr<Net> net;
  DP_RETURN_IF_ERROR(Net::CreateWithBackend(spec, opt, std::move(backend), &net));
  net->InitParams(1);
  out->batch = batch;
  out->timing = TimeNet(*net, iterations, warmup);  // leaves inputs and blobs set up

  // device_step: every layer's forward then backward, no host traffic, one sync.
  for (int l = 0; l < net->num_layers(); ++l) net->ForwardLayer(l, Phase::kTrain);
  net->backend().Synchronize();
  double t0 = NowMs();
  for (int it = 0; it < iterations; ++it) {
    for (int l = 0; l < net->num_layers(); ++l) net->ForwardLayer(l, Phase::kTrain);
    for (int l = net->num_layers() - 1; l >= 0; --l) net->BackwardLayer(l);
  }
  net->backend().Synchronize();
  out->device_step_ms = (NowMs() - t0) / iterations;

  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> images(net->input_count());
  for (auto& v : images) v = g(rng);
  std::vector<int> labels(batch);
  for (auto& l : labels) l = std::uniform_int_distribution<int>(0, net->num_classes() - 1)(rng);
  net->ForwardBackward(images.data(), labels.data());
  t0 = NowMs();
  for (int it = 0; it < iterations; ++it) net->ForwardBackward(images.data(), labels.data());
  net->backend().Synchronize();
  out->engine_step_ms = (NowMs() - t0) / iterations;

  // worker_step and worker_bytes_step: the net timer's (net_timer.h), timed by TimeNet above.
  out->worker_step_ms = out->timing.worker_step_ms;
  out->worker_bytes_step_ms = out->timing.worker_bytes_step_ms;
  out->algos = CudaConvAlgorithms(net->backend());
  return downpour::Status::Ok();
}

std::string ToJson(const std::string& model, const std::string& device, const CudaOptions& cuda,
                   const std::vector<BatchResult>& results) {
  std::string j = fmt::format("{{\"model\": \"{}\", \"device\": \"{}\", \"tf32\": {}, \"conv_algo\": \"{}\", \"batches\": [",
                              model, device, cuda.tf32 ? "true" : "false", ConvAlgoModeName(cuda.conv_algo));
  for (size_t i = 0; i < results.size(); ++i) {
    const BatchResult& r = results[i];
    const bool bytes = r.worker_bytes_step_ms > 0;  // 0: the net takes no byte input (JSON null)
    j += fmt::format(
        "{}{{\"batch\": {}, \"device_step_ms\": {:.3f}, \"engine_step_ms\": {:.3f}, "
        "\"train_step_ms\": {:.3f}, \"worker_step_ms\": {:.3f}, \"worker_bytes_step_ms\": {}, "
        "\"device_images_per_s\": {:.1f}, \"engine_images_per_s\": {:.1f}, \"train_images_per_s\": {:.1f}, "
        "\"worker_images_per_s\": {:.1f}, \"worker_bytes_images_per_s\": {}, \"layers\": [",
        i ? ", " : "", r.batch, r.device_step_ms, r.engine_step_ms, r.timing.step_ms, r.worker_step_ms,
        bytes ? fmt::format("{:.3f}", r.worker_bytes_step_ms) : "null", 1000.0 * r.batch / r.device_step_ms,
        1000.0 * r.batch / r.engine_step_ms, r.timing.images_per_s, 1000.0 * r.batch / r.worker_step_ms,
        bytes ? fmt::format("{:.1f}", 1000.0 * r.batch / r.worker_bytes_step_ms) : "null");
    for (size_t l = 0; l < r.timing.layers.size(); ++l)
      j += fmt::format("{}{{\"name\": \"{}\", \"type\": \"{}\", \"forward_ms\": {:.4f}, \"backward_ms\": {:.4f}}}",
                       l ? ", " : "", r.timing.layers[l].name, r.timing.layers[l].type, r.timing.layers[l].forward_ms,
                       r.timing.layers[l].backward_ms);
    j += "], \"conv_algorithms\": [";
    for (size_t a = 0; a < r.algos.size(); ++a)
      j += fmt::format("{}{{\"layer\": \"{}\", \"forward\": \"{}\", \"backward_data\": \"{}\", "
                       "\"backward_filter\": \"{}\", \"workspace_bytes\": {}, \"how\": \"{}\"}}",
                       a ? ", " : "", r.algos[a].layer, r.algos[a].forward, r.algos[a].backward_data,
                       r.algos[a].backward_filter, r.algos[a].workspace_bytes, r.algos[a].how);
    j += "]}";
  }
  return j + "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"downpour-bench-gpu: CUDA backend timing with per-layer times and cuDNN algorithms"};
  downpour::cli::AddStandardFlags(&app, "downpour-bench-gpu");
  std::string model, json_path, tf32 = "on", algo = "search";
  std::vector<int> batches{128, 256};
  int iterations = 20, warmup = 3, gpu = 0;
  int64_t workspace_mb = 1024;
  app.add_option("--model", model, "model config (TOML)")->required();
  app.add_option("--batch", batches, "batch sizes (repeatable; default 128 256)");
  app.add_option("--iterations", iterations, "timed iterations (default 20)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations (default 3)")->check(CLI::NonNegativeNumber);
  app.add_option("--gpu", gpu, "CUDA device ordinal (default 0)")->check(CLI::NonNegativeNumber);
  app.add_option("--tf32", tf32, "on|off (default on)")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--conv-algo", algo, "search|heuristic|gemm|implicit_gemm|fft|winograd (default search)");
  app.add_option("--workspace-mb", workspace_mb, "cuDNN workspace limit in MiB (default 1024)");
  app.add_option("--json", json_path, "also write the results as JSON here");
  if (const auto code = downpour::cli::Parse(app, argc, argv)) return *code;

  CudaOptions cuda;
  cuda.gpu_id = gpu;
  cuda.tf32 = tf32 == "on";
  cuda.workspace_limit_mb = workspace_mb;
  downpour::Status s = ParseConvAlgoMode(algo, "--conv-algo", &cuda.conv_algo);
  NetSpec spec;
  if (s.ok()) s = ParseNetSpecFile(model, &spec);
  if (!s.ok()) {
    std::fprintf(stderr, "downpour-bench-gpu: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<BatchResult> results;
  std::string device;
  for (int batch : batches) {
    BatchResult r;
    s = RunBatch(spec, cuda, batch, iterations, warmup, &r);
    if (!s.ok()) {
      std::fprintf(stderr, "downpour-bench-gpu: batch %d: %s\n", batch, s.ToString().c_str());
      return 1;
    }
    if (device.empty()) {
      std::unique_ptr<Backend> b;
      if (CreateCudaBackend(cuda, &b).ok()) device = CudaDeviceDescription(*b);
      std::printf("%s\nmodel %s\n", device.c_str(), model.c_str());
    }
    std::printf("\n== batch %d ==\n%s", batch, FormatTiming(r.timing).c_str());
    std::printf("device step (all layers fwd+bwd incl. grad downloads, one sync): %.3f ms = %.1f images/s\n", r.device_step_ms,
                1000.0 * batch / r.device_step_ms);
    std::printf("engine step (Net::ForwardBackward, with uploads/downloads): %.3f ms = %.1f images/s\n",
                r.engine_step_ms, 1000.0 * batch / r.engine_step_ms);
    std::printf("%-8s %-22s %-18s %-18s %12s  %s\n", "layer", "forward", "backward-data", "backward-filter",
                "workspace", "chosen by");
    for (const auto& a : r.algos)
      std::printf("%-8s %-22s %-18s %-18s %10.1f M  %s\n", a.layer.c_str(), a.forward.c_str(),
                  a.backward_data.c_str(), a.backward_filter.c_str(), a.workspace_bytes / 1048576.0, a.how.c_str());
    results.push_back(std::move(r));
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << ToJson(model, device, cuda, results);
    if (!f) {
      std::fprintf(stderr, "downpour-bench-gpu: cannot write --json %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
