// sgd.h — the server's update rule: SGD with momentum and L2 weight decay, as a pipeline of
// pure functions over spans, in the order of Caffe's SGDSolver::ApplyUpdate:
//
//   clip       s_clip = ClipScale(||g||², clip_threshold)         (whole-gradient L2 norm)
//   normalise  g *= grad_scale  (grad_scale = s_clip × 1/n for n averaged gradients,
//                                 or any other scalar the consistency layer folds in)
//   regularise g += weight_decay × decay_mult × w                  (L2)
//   momentum   h  = momentum × h + lr × lr_mult × g
//   apply      w -= h
//
// SgdUpdate does all four element-wise steps in one pass (the hot path: 61M floats per
// AlexNet update) and is bit-identical to calling Scale, Regularize, MomentumStep and
// ApplyStep in turn (tested; the library is built with -ffp-contract=off for that).
//
// On a sharded server, clipping uses the norm the caller computes (normally the shard's
// slice of the gradient, SquaredNorm), folded into grad_scale. Spans are borrowed for the
// call only; w, g and history of one tensor must have equal lengths (checked) and must not
// alias each other.
//
// Thread-safety: pure functions; callers serialise updates to the same buffers.
#pragma once

#include <cstdint>
#include <span>

#include "common/config/solver.h"

namespace downpour {

// Scalars of one update of one tensor (or a slice of one).
struct UpdateParams {
  float lr = 0.0f;            // learning rate at this iteration (LearningRateAt)
  float momentum = 0.0f;      // SolverConfig::momentum
  float weight_decay = 0.0f;  // SolverConfig::weight_decay
  float lr_mult = 1.0f;       // the tensor's TensorSpec::lr_mult (Caffe biases: 2)
  float decay_mult = 1.0f;    // the tensor's TensorSpec::decay_mult (Caffe biases: 0)
  float grad_scale = 1.0f;    // clip × normalise factor applied to the raw gradient first
};

// What every rule takes from UpdateParams, the multipliers folded in: lr × lr_mult and
// weight_decay × decay_mult (the same products in every rule, so the rules round alike).
struct EffectiveParams {
  float lr;
  float decay;
  float grad_scale;
};
inline EffectiveParams Effective(const UpdateParams& p) {
  return {p.lr * p.lr_mult, p.weight_decay * p.decay_mult, p.grad_scale};
}

// Gathers the scalars for `iter` from the solver config and a tensor's multipliers.
UpdateParams MakeUpdateParams(const SolverConfig& solver, int64_t iter, float lr_mult,
                              float decay_mult, float grad_scale);

// Σ g², accumulated in double (a 37.7M-element fc6 slice loses digits in float).
double SquaredNorm(std::span<const float> g);

// Caffe's ClipGradients: clip_threshold / ||g|| when ||g|| > clip_threshold, else 1.
// A threshold <= 0 turns clipping off (returns 1).
float ClipScale(double grad_sq_norm, float clip_threshold);

// g *= s.
void Scale(std::span<float> g, float s);

// L2 regularisation: g += decay × w.
void Regularize(std::span<float> g, std::span<const float> w, float decay);

// history = momentum × history + lr × g.
void MomentumStep(std::span<float> history, std::span<const float> g, float momentum, float lr);

// w -= history.
void ApplyStep(std::span<float> w, std::span<const float> history);

// The whole pipeline, one pass, with effective lr = p.lr × p.lr_mult and decay =
// p.weight_decay × p.decay_mult:
//   g = grad × grad_scale;  g += decay × w;  history = momentum × history + lr_eff × g;
//   w -= history.
void SgdUpdate(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
               std::span<float> history);

}  // namespace downpour
