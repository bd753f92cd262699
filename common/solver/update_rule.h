// update_rule.h — the rule by which a gradient changes weights, with the per-weight state it
// keeps (momentum's history, AdaGrad's accumulated squares). The servers apply it to their
// chunks and a worker to its own copy in local steps, so one object holds the arithmetic for
// both. Rules are element-wise: a caller may split a tensor into blocks over threads and get
// the same floats.
//
// Adding a rule: its own file (a class deriving UpdateRule, as adagrad.h), one line in
// MakeUpdateRule, and its value of solver.update (common/run_config.h) with its keys. A test can
// hand a shard any rule (ShardOptions::update_rule) without any of that.
//
// Thread-safety: Apply is const and touches only the spans it is given.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "common/config/solver.h"
#include "common/solver/sgd.h"

namespace downpour {

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // Its name: solver.update's value, and what a checkpoint records (another rule's is refused).
  virtual std::string_view name() const = 0;
  // What each weight's state holds before the first update.
  virtual float initial_state() const { return 0.0f; }
  // One update of `w` (and its `state`) by `grad`, with the scalars of `p` (lr, multipliers,
  // grad_scale; the rule uses what it needs). Spans of equal length, not aliasing.
  virtual void Apply(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
                     std::span<float> state) const = 0;
};

// SGD with momentum and L2 weight decay (SgdUpdate, common/solver/sgd.h); state: the momentum.
class MomentumRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "momentum"; }
  void Apply(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
             std::span<float> state) const override {
    SgdUpdate(p, grad, w, state);
  }
};

// Adds the pushed change as it is, w += Δ, with no lr and no state: the center's side of an EASGD
// exchange (the worker sends α(x_i − x̃)) and a model's move in multi-model runs (its holder's
// change over a stage). The shard picks it by the push's flags, not by solver.update.
class AddRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "add"; }
  void Apply(const UpdateParams&, std::span<const float> delta, std::span<float> w,
             std::span<float>) const override {
    for (size_t i = 0; i < w.size(); ++i) w[i] += delta[i];
  }
};

// The rule solver.update names, with its keys from `solver` (validated by the run config).
std::unique_ptr<UpdateRule> MakeUpdateRule(const SolverConfig& solver);

}  // namespace downpour
