// net_timer.cc — see net_timer.h.
#include "client/engine/net_timer.h"

#include <time.h>

#include <chrono>
#include <random>

#include <fmt/format.h>

namespace downpour::engine {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The process's CPU time (every thread, user + system), ms.
double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

// Random images (N(0,1)) and labels with a fixed seed, and the SGD state of a timing run.
struct TimingInputs {
  std::vector<float> images;
  std::vector<int> labels;
  std::vector<float> history;
  explicit TimingInputs(Net& net) : images(net.input_count()), labels(net.batch_size()),
                                    history(net.params().size(), 0.0f) {
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : images) v = g(rng);
    for (auto& l : labels) l = std::uniform_int_distribution<int>(0, net.num_classes() - 1)(rng);
  }
  void Step(Net& net) {
    constexpr float kLr = 1e-5f;  // tiny, so timing runs do not blow the weights up
    net.ForwardBackward(images.data(), labels.data());
    net.SgdUpdate(kLr, 0.9f, 5e-4f, history);
  }
};

// Mean wall ms per step; the process's CPU ms per step into *cpu_ms when given.
double RunSteps(Net& net, TimingInputs& in, int iterations, double* cpu_ms = nullptr) {
  const double c0 = ProcessCpuMs();
  const double t0 = NowMs();
  for (int it = 0; it < iterations; ++it) in.Step(net);
  net.backend().Synchronize();
  const double wall = (NowMs() - t0) / iterations;
  if (cpu_ms != nullptr) *cpu_ms = (ProcessCpuMs() - c0) / iterations;
  return wall;
}

// The worker's step (NetTiming::worker_step_ms): page-locked input where the device has it, the
// weights uploaded before each layer, a callback per gradient; the net's callbacks are restored.
double WorkerStepMs(Net& net, const TimingInputs& in, int iterations) {
  const HostAllocator host = HostAllocatorFor(net.backend().device());
  const size_t bytes = in.images.size() * sizeof(float);
  float* images = host.allocate ? static_cast<float*>(host.allocate(bytes)) : nullptr;
  std::vector<float> plain;
  if (images == nullptr) {
    plain = in.images;
    images = plain.data();
  } else {
    std::copy(in.images.begin(), in.images.end(), images);
  }
  int handed = 0;
  net.SetBeforeLayerCallback([](int) {});
  net.SetGradReadyCallback([&handed](int) { ++handed; });
  net.ForwardBackward(images, in.labels.data());  // warm
  const double t0 = NowMs();
  for (int it = 0; it < std::max(iterations, 1); ++it) net.ForwardBackward(images, in.labels.data());
  net.backend().Synchronize();
  const double ms = (NowMs() - t0) / std::max(iterations, 1);
  net.SetBeforeLayerCallback({});
  net.SetGradReadyCallback({});
  if (plain.empty()) host.deallocate(images);
  return ms;
}

// NetTiming::worker_bytes_step_ms: two byte batches alternate, as the loader's ring holds them.
double WorkerBytesStepMs(Net& net, const TimingInputs& in, int iterations) {
  constexpr int kRecord = 256;
  InputNormalization norm;
  norm.channels = net.input_channels();
  norm.height = net.input_height();
  norm.width = net.input_width();
  if (norm.height > kRecord || norm.width > kRecord) return 0.0;
  norm.mean_values = norm.channels == 3 ? std::vector<float>{104.0f, 117.0f, 123.0f} : std::vector<float>{118.0f};
  norm.scale = 1.0f / 64;
  if (!net.SetInputNormalization(norm, "the timed byte input").ok()) return 0.0;  // a net of 2 or 4+ channels
  const HostAllocator host = HostAllocatorFor(net.backend().device());
  const int n = net.batch_size();
  const size_t pixel_bytes = static_cast<size_t>(n * norm.image_bytes()), window_bytes = n * sizeof(CropWindow);
  std::mt19937 rng(5);
  struct Held {
    std::vector<uint8_t> plain_pixels;
    std::vector<CropWindow> plain_windows;
    uint8_t* pixels = nullptr;
    CropWindow* windows = nullptr;
  } held[2];
  for (Held& h : held) {
    if (host.allocate) {
      h.pixels = static_cast<uint8_t*>(host.allocate(pixel_bytes));
      h.windows = static_cast<CropWindow*>(host.allocate(window_bytes));
    }
    if (h.pixels == nullptr || h.windows == nullptr) {  // not page-locked: still correct
      if (h.pixels != nullptr) host.deallocate(h.pixels);  // the one that was
      if (h.windows != nullptr) host.deallocate(h.windows);
      h.plain_pixels.resize(pixel_bytes);
      h.plain_windows.resize(static_cast<size_t>(n));
      h.pixels = h.plain_pixels.data();
      h.windows = h.plain_windows.data();
    }
    for (size_t i = 0; i < pixel_bytes; ++i) h.pixels[i] = static_cast<uint8_t>(rng());
    for (int i = 0; i < n; ++i) {
      const int y0 = static_cast<int>(rng() % static_cast<uint32_t>(kRecord - norm.height + 1));
      const int x0 = static_cast<int>(rng() % static_cast<uint32_t>(kRecord - norm.width + 1));
      h.windows[i] = CropWindow{y0, x0, kRecord, kRecord, static_cast<int32_t>(rng() & 1)};
    }
  }
  auto view = [&](int k) { return ByteBatch{held[k].pixels, held[k].windows, n}; };
  int handed = 0;
  net.SetBeforeLayerCallback([](int) {});
  net.SetGradReadyCallback([&handed](int) { ++handed; });
  ByteBatch next = view(1);
  net.ForwardBackward(view(0), in.labels.data(), &next);  // warm
  const int steps = std::max(iterations, 1);
  const double t0 = NowMs();
  for (int it = 1; it <= steps; ++it) {
    next = view((it + 1) % 2);
    net.ForwardBackward(view(it % 2), in.labels.data(), &next);
  }
  net.backend().Synchronize();
  const double ms = (NowMs() - t0) / steps;
  net.SetBeforeLayerCallback({});
  net.SetGradReadyCallback({});
  for (Held& h : held) {
    if (h.plain_pixels.empty()) host.deallocate(h.pixels);
    if (h.plain_windows.empty()) host.deallocate(h.windows);
  }
  return ms;
}

}  // namespace

double TimeTrainingStepMs(Net& net, int iterations, int warmup) {
  TimingInputs in(net);
  RunSteps(net, in, warmup);
  return RunSteps(net, in, std::max(iterations, 1));
}

NetTiming TimeNet(Net& net, int iterations, int warmup) {
  NetTiming t;
  t.iterations = iterations;
  t.batch = net.batch_size();
  TimingInputs in(net);
  RunSteps(net, in, std::max(warmup, 1));  // also sets up every blob for the per-layer runs
  t.layers.resize(net.num_layers());
  for (int l = 0; l < net.num_layers(); ++l) {
    t.layers[l].name = net.spec().layers[l].name;
    t.layers[l].type = TypeNameOf(net.spec().layers[l]);
  }
  for (int it = 0; it < iterations; ++it) {
    for (int l = 0; l < net.num_layers(); ++l) {
      const double t0 = NowMs();
      net.ForwardLayer(l, Phase::kTrain);
      net.backend().Synchronize();
      t.layers[l].forward_ms += NowMs() - t0;
    }
    for (int l = net.num_layers() - 1; l >= 0; --l) {
      if (!net.LayerHasBackward(l)) continue;
      const double t0 = NowMs();
      net.BackwardLayer(l);
      net.backend().Synchronize();
      t.layers[l].backward_ms += NowMs() - t0;
    }
  }
  for (auto& lt : t.layers) {
    lt.forward_ms /= iterations;
    lt.backward_ms /= iterations;
    t.forward_ms += lt.forward_ms;
    t.backward_ms += lt.backward_ms;
  }
  t.step_ms = RunSteps(net, in, iterations, &t.step_cpu_ms);
  t.images_per_s = 1000.0 * t.batch / t.step_ms;
  t.worker_step_ms = WorkerStepMs(net, in, iterations);
  if (net.backend().normalizes_input()) t.worker_bytes_step_ms = WorkerBytesStepMs(net, in, iterations);
  return t;
}

std::string FormatTiming(const NetTiming& t) {
  std::string out = fmt::format("{:<12} {:<16} {:>12} {:>12}\n", "layer", "type", "forward ms", "backward ms");
  for (const auto& l : t.layers)
    out += fmt::format("{:<12} {:<16} {:>12.3f} {:>12.3f}\n", l.name, l.type, l.forward_ms, l.backward_ms);
  out += fmt::format("Average Forward pass:          {:.3f} ms\n", t.forward_ms);
  out += fmt::format("Average Backward pass:         {:.3f} ms\n", t.backward_ms);
  out += fmt::format("Average Forward-Backward:      {:.3f} ms\n", t.forward_ms + t.backward_ms);
  out += fmt::format("Full training step (fwd+bwd+SGD update), batch {}: {:.3f} ms = {:.1f} images/s "
                     "({} iterations)\n", t.batch, t.step_ms, t.images_per_s, t.iterations);
  out += fmt::format("Worker step (fwd+bwd, weights uploaded per layer, gradients handed over as they land, "
                     "no SGD): {:.3f} ms = {:.1f} images/s\n", t.worker_step_ms, 1000.0 * t.batch / t.worker_step_ms);
  if (t.worker_bytes_step_ms > 0)
    out += fmt::format(
        "Worker step with byte input (uint8 crops normalised on the device, the next batch staged): "
        "{:.3f} ms = {:.1f} images/s\n",
        t.worker_bytes_step_ms, 1000.0 * t.batch / t.worker_bytes_step_ms);
  return out;
}

}  // namespace downpour::engine
