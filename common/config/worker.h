// config/worker.h — [worker]: the training loop of one worker, and the compute it runs on.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/table.h"
#include "common/device.h"

namespace downpour {

inline constexpr int kMaxOutstandingSteps = 16;  // worker.outstanding_steps

// worker.conv_algo's values: "search" (timed per layer), "heuristic", or one forced algorithm.
inline const std::vector<std::string> kConvAlgoNames = {"search",        "heuristic", "gemm",
                                                        "implicit_gemm", "fft",       "winograd"};

struct WorkerConfig;
std::string DeviceString(const WorkerConfig& w);           // "cpu" or "gpu:N"
bool ParseDevice(std::string_view text, WorkerConfig* w);  // "cpu" | "gpu:N" into device and gpu_index

// [worker] — the training loop of one worker.
struct WorkerConfig {
  int batch_size = 64;
  int64_t steps = 1000;
  int epochs = 0;
  int pull_every = 1;
  int push_every = 1;
  int outstanding_steps = 1;
  DeviceKind device = DeviceKind::kCpu;
  int gpu_index = 0;  // N of "gpu:N"
  int threads = 0;
  int straggler = -1;
  int straggler_delay_ms = 0;
  std::vector<float> emulate_ms;
  bool tf32 = true;
  std::string conv_algo = "search";

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("batch_size", s.batch_size, AtLeast(1), "images per step");
    v.Key("steps", s.steps, AtLeast<int64_t>(1), "steps per worker; epochs > 0 takes precedence");
    v.Key("epochs", s.epochs, AtLeast(0, "0 = use steps"), "passes over this worker's shard; 0 = use steps");
    v.Key("pull_every", s.pull_every, AtLeast(1), "n_fetch: pull weights every n steps");
    v.Key("push_every", s.push_every, AtLeast(1), "n_push: push accumulated gradients every n steps");
    // 1 = the last step's, whose pulls its forward waits for layer by layer; in async runs k > 1
    // lets a step's weights lack its own pushes of the k - 1 steps before
    // (client/worker/pull_ahead.h). Sync and ssp keep their servers' guarantees.
    v.Key("outstanding_steps", s.outstanding_steps,
          InRange(1, kMaxOutstandingSteps, "steps of pushes a step may start with unacknowledged"),
          "steps of this worker's pushes that may be outstanding when a step starts");
    v.Text("device", s, DeviceString, ParseDevice, "expected \"cpu\" or \"gpu:N\"", "\"cpu\" | \"gpu:N\"",
           "where the worker computes");
    v.Key("threads", s.threads, AtLeast(0, "0 = all cores"), "CPU compute threads; 0 = all cores");
    v.Key("straggler", s.straggler, "emulated straggler: this worker sleeps after each step; -1 = none");
    v.Key("straggler_delay_ms", s.straggler_delay_ms, InRange(0, 60000), "the straggler's sleep per step");
    v.Key("emulate_ms", s.emulate_ms,
          Must<std::vector<float>>(
              [](const std::vector<float>& ms) {
                for (float m : ms) {
                  if (!(std::isfinite(m) && m >= 0 && m <= 60000)) return false;
                }
                return true;
              },
              "every value must be in 0..60000 ms"),
          "emulated compute (docs/scaling.md): forward and backward ms per layer; empty = off");
    v.Key("tf32", s.tf32, "GPU: TF32 tensor cores for fp32 convolutions/GEMMs (off = exact fp32)");
    v.Key("conv_algo", s.conv_algo,
          Must<std::string>(
              [](const std::string& a) {
                return std::find(kConvAlgoNames.begin(), kConvAlgoNames.end(), a) != kConvAlgoNames.end();
              },
              "expected search, heuristic, gemm, implicit_gemm, fft or winograd"),
          "GPU: how cuDNN picks convolution algorithms");
  }
  bool operator==(const WorkerConfig&) const = default;
};

}  // namespace downpour
