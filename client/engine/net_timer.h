// net_timer.h — Caffe's `time` as a library: per-layer forward/backward milliseconds and the
// full training step (forward, backward, SGD update) in images/s, for a Net of any backend.
// Used by `downpour-time` and bench/engine.
//
// Thread-safety: drives the Net from the calling thread.
#pragma once

#include <string>
#include <vector>

#include "client/engine/net.h"

namespace downpour::engine {

struct LayerTiming {
  std::string name;
  std::string type;
  double forward_ms = 0.0;   // mean per iteration
  double backward_ms = 0.0;  // mean per iteration (0 for layers without backward)
};

struct NetTiming {
  std::vector<LayerTiming> layers;
  double forward_ms = 0.0;   // sum over layers
  double backward_ms = 0.0;  // sum over layers
  double step_ms = 0.0;      // mean full training step: ForwardBackward + SgdUpdate
  double step_cpu_ms = 0.0;  // the process's CPU time (all its threads, user + system) per full step:
  //                            above step_ms × threads when the cores are busy with other work
  //                            (bench/scaling/corun_transport.py compares the two)
  double images_per_s = 0.0; // batch / step time
  // The step a worker runs: ForwardBackward with the input in the device's host memory
  // (page-locked on a GPU), the weights uploaded layer by layer and a callback per gradient as
  // it lands; no SGD (the servers apply it).
  double worker_step_ms = 0.0;
  // The same with the input as a GPU worker's loader yields it (common/byte_batch.h): uint8 crop
  // windows of 256×256 records in the device's host memory, mirrored at random, normalised by the
  // backend, each next batch staged during the step before. 0 where the backend does not
  // normalise its input (Backend::normalizes_input: host backends).
  double worker_bytes_step_ms = 0.0;
  int iterations = 0;
  int batch = 0;
};

// Runs `warmup` untimed steps, then `iterations` timed ones (per layer, then whole steps).
// Inputs are random images and labels, fixed seed; parameters must be initialised.
NetTiming TimeNet(Net& net, int iterations, int warmup = 1);

// Only the full training step (ForwardBackward + SgdUpdate on random inputs): `warmup`
// untimed steps, then the mean milliseconds of `iterations` timed ones. Parameters must be
// initialised. For benchmarks that do not need the per-layer breakdown.
double TimeTrainingStepMs(Net& net, int iterations, int warmup = 1);

// A human-readable table in Caffe's style.
std::string FormatTiming(const NetTiming& t);

}  // namespace downpour::engine
