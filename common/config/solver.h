// config/solver.h — [solver]: the update rule and its learning-rate schedule.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/table.h"

namespace downpour {

// Learning-rate policies, exactly as Caffe's SGDSolver::GetLearningRate defines them
// (common/solver/lr_policy.h computes them).
enum class LrPolicy {
  kFixed,      // base_lr
  kStep,       // base_lr * gamma ^ floor(iter / stepsize)
  kMultistep,  // base_lr * gamma ^ (number of stepvalues <= iter)
  kPoly,       // base_lr * (1 - iter / max_iter) ^ power
  kInv,        // base_lr * (1 + gamma * iter) ^ (-power)
  kExp,        // base_lr * gamma ^ iter
};
inline constexpr std::string_view kLrPolicyNames[] = {"fixed", "step", "multistep", "poly", "inv", "exp"};
const char* LrPolicyName(LrPolicy policy);
// Parses "fixed" | "step" | "multistep" | "poly" | "inv" | "exp"; false if unknown.
bool ParseLrPolicy(std::string_view text, LrPolicy* out);

// solver.update: the rule a gradient changes the weights by (common/solver/update_rule.h).
enum class UpdateRuleKind {
  kMomentum,  // "momentum": SGD with momentum and L2 weight decay (Caffe's SGDSolver)
  kAdaGrad,   // "adagrad": lr / sqrt(Σ g² + epsilon) per element (Duchi et al.; DistBelief's servers)
};
inline constexpr std::string_view kUpdateRuleNames[] = {"momentum", "adagrad"};
const char* UpdateRuleName(UpdateRuleKind kind);
bool ParseUpdateRule(std::string_view text, UpdateRuleKind* out);  // false if unknown

// [solver] — the update rule and its learning-rate schedule, Caffe's semantics. The same rows
// read [[models]] entries' [models.solver].
struct SolverConfig {
  float base_lr = 0.01f;
  LrPolicy lr_policy = LrPolicy::kFixed;
  float gamma = 0.1f;
  float power = 1.0f;
  int64_t stepsize = 1000;
  std::vector<int64_t> stepvalues;
  int64_t max_iter = 10000;  // 0 = the run's planned worker batches (RunSolver)
  float momentum = 0.9f;
  float weight_decay = 0.0005f;
  float clip_gradients = -1.0f;
  UpdateRuleKind update = UpdateRuleKind::kMomentum;
  float adagrad_epsilon = 1e-10f;
  float adagrad_initial = 0.1f;
  int64_t warmup_iters = 0;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("base_lr", s.base_lr, FinitePositive<float>(), "learning rate at iteration 0");
    v.Named("lr_policy", s.lr_policy, Names{kLrPolicyNames}, "learning-rate schedule (Caffe's lr_policy)");
    v.Key("gamma", s.gamma, FinitePositive<float>(), "decay factor for step/multistep/exp; rate for inv");
    v.Key("power", s.power, FiniteNonNegative<float>(), "exponent for poly and inv");
    v.Key("stepsize", s.stepsize, Must<int64_t>([](int64_t x) { return x > 0; }, "must be > 0"),
          "iterations per step for \"step\"");
    v.Key("stepvalues", s.stepvalues,
          Must<std::vector<int64_t>>(
              [](const std::vector<int64_t>& x) {
                for (size_t i = 0; i < x.size(); ++i) {
                  if (x[i] <= 0 || (i > 0 && x[i] <= x[i - 1])) return false;
                }
                return true;
              },
              "must be positive and strictly increasing"),
          "iterations at which \"multistep\" decays");
    v.Key("max_iter", s.max_iter, AtLeast<int64_t>(0, "0 = the run's planned worker batches"),
          "horizon of \"poly\": lr reaches 0 at iter = max_iter; 0 = the run's planned worker batches");
    v.Key("momentum", s.momentum, Must<float>([](float x) { return x >= 0 && x < 1; }, "must be in [0, 1)"),
          "momentum of the update");
    v.Key("weight_decay", s.weight_decay, FiniteNonNegative<float>(), "L2 coefficient, times each tensor's decay_mult");
    v.Key("clip_gradients", s.clip_gradients,
          Must<float>([](float x) { return !std::isnan(x); }, "must be a number (<= 0 turns clipping off)"),
          "global L2-norm threshold each worker clips its gradient to before pushing; <= 0 = off");
    v.Named("update", s.update, Names{kUpdateRuleNames}, "the rule a gradient changes the weights by");
    v.Key("adagrad_epsilon", s.adagrad_epsilon, FinitePositive<float>("AdaGrad divides by sqrt(acc + epsilon)"),
          "AdaGrad: lr / sqrt(acc + epsilon)");
    v.Key("adagrad_initial", s.adagrad_initial, FiniteNonNegative<float>("an accumulator of squares"),
          "AdaGrad: each accumulator's start");
    v.Key("warmup_iters", s.warmup_iters, AtLeast<int64_t>(0, "0 = no warm-up"),
          "linear warm-up: the rate at iter < n is the schedule's times (iter + 1) / n; 0 = off");
  }
  bool operator==(const SolverConfig&) const = default;
};

}  // namespace downpour
