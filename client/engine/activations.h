// activations.h — the elementwise activation layers, one row each. A row is all the engine and
// the importers need to know about one activation: its name (the TOML and Caffe type), its one
// parameter (TOML key, default, rule, and where a Caffe prototxt keeps it), and y = f(x) with
// dy/dx — the reference kernel, which the CPU and GPU backends are checked against. A layer of
// such a type is LayerType::kActivation with LayerSpec::activation naming the row.
//
// A new activation is: its ActivationKind and row here; its oneDNN algorithm
// (onednn_backend.cc ActivationAlgorithm) and cuDNN mode (gpu/cuda_layers.cc); one gradient case
// (gradient_cases.cc); and, if Caffe keeps its parameter in a message the bundled caffe.proto
// lacks, that message (data/caffe.proto). Shape inference, the TOML reader, the prototxt importer
// and the weights exporter read the rows.
//
// Thread-safety: constant data and pure functions.
#pragma once

#include <cmath>
#include <span>
#include <string_view>

#include "common/status.h"

namespace downpour::engine {

enum class ActivationKind {
  kReLU,  // max(0, x) (Caffe's ReLU with negative_slope 0)
  kELU,   // x if x > 0, else alpha (e^x - 1) (Clevert et al. 2016; Caffe's ELU)
};

struct ActivationRow {
  ActivationKind kind;
  const char* name;         // the TOML `type` and the Caffe layer type
  const char* alpha_key;    // TOML key of its parameter; "" = none (alpha is alpha_default)
  float alpha_default;      // Caffe's default
  const char* alpha_rule;   // what alpha must be, for errors ("" = any finite value)
  bool (*alpha_ok)(float alpha);
  // Where a Caffe prototxt keeps alpha: LayerParameter.<caffe_message>.<caffe_field>. With no
  // alpha_key, a prototxt value other than alpha_default is refused.
  const char* caffe_message;
  const char* caffe_field;
  float (*forward)(float x, float alpha);
  // dy/dx at x, given y = forward(x, alpha).
  float (*derivative)(float x, float y, float alpha);
};

inline constexpr ActivationRow kActivations[] = {
    {ActivationKind::kReLU, "ReLU", "", 0.0f, "", [](float) { return true; }, "relu_param", "negative_slope",
     [](float x, float) { return x > 0.0f ? x : 0.0f; },
     [](float x, float, float) { return x > 0.0f ? 1.0f : 0.0f; }},
    {ActivationKind::kELU, "ELU", "alpha", 1.0f, "finite and >= 0",
     [](float a) { return std::isfinite(a) && a >= 0.0f; }, "elu_param", "alpha",
     [](float x, float alpha) { return x > 0.0f ? x : alpha * std::expm1(x); },
     [](float x, float y, float alpha) { return x > 0.0f ? 1.0f : y + alpha; }},
};

// The row of `kind`. A kind without a row is a programming error (the backends' switches also
// warn at compile time on a kind they lack).
inline const ActivationRow& ActivationOf(ActivationKind kind) {
  for (const ActivationRow& row : kActivations) {
    if (row.kind == kind) return row;
  }
  DP_CHECK(false && "an ActivationKind without a row in kActivations");
  return kActivations[0];
}

// The row named `name` (a TOML or Caffe type), or null.
inline const ActivationRow* FindActivation(std::string_view name) {
  for (const ActivationRow& row : kActivations) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

}  // namespace downpour::engine
