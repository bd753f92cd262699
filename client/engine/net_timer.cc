// net_timer.cc — see net_timer.h.
#include "client/engine/net_timer.h"

#include <chrono>
#include <random>

#include <fmt/format.h>

namespace downpour::engine {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

NetTiming TimeNet(Net& net, int iterations, int warmup) {
  NetTiming t;
  t.iterations = iterations;
  t.batch = net.batch_size();
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> images(net.input_count());
  for (auto& v : images) v = g(rng);
  std::vector<int> labels(net.batch_size());
  for (auto& l : labels) l = std::uniform_int_distribution<int>(0, net.num_classes() - 1)(rng);
  std::vector<float> history(net.params().size(), 0.0f);
  const float lr = 1e-5f;  // tiny, so timing runs do not blow the weights up

  for (int i = 0; i < std::max(warmup, 1); ++i) {
    net.ForwardBackward(images.data(), labels.data());
    net.SgdUpdate(lr, 0.9f, 5e-4f, history);
  }
  t.layers.resize(net.num_layers());
  for (int l = 0; l < net.num_layers(); ++l) {
    t.layers[l].name = net.spec().layers[l].name;
    t.layers[l].type = LayerTypeName(net.spec().layers[l].type);
  }
  for (int it = 0; it < iterations; ++it) {
    for (int l = 0; l < net.num_layers(); ++l) {
      const double t0 = NowMs();
      net.ForwardLayer(l, Phase::kTrain);
      net.backend().Synchronize();
      t.layers[l].forward_ms += NowMs() - t0;
    }
    for (int l = net.num_layers() - 1; l >= 0; --l) {
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
  const double t0 = NowMs();
  for (int it = 0; it < iterations; ++it) {
    net.ForwardBackward(images.data(), labels.data());
    net.SgdUpdate(lr, 0.9f, 5e-4f, history);
  }
  net.backend().Synchronize();
  t.step_ms = (NowMs() - t0) / iterations;
  t.images_per_s = 1000.0 * t.batch / t.step_ms;
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
  return out;
}

}  // namespace downpour::engine
