// gradient.h — a worker's gradient push (Downpour SGD, BSP, SSP): the consistency policy decides
// whether it may be taken and when it applies (server/consistency.h), and the solver's UpdateRule
// does the arithmetic on the chunk's lane (momentum SGD or AdaGrad, common/solver/update_rule.h).
// The rule of consistency.algorithm = "sgd", and the base of the rules that change a gradient
// before it is taken (DC-ASGD, dc_asgd.h).
#pragma once

#include "server/rules/shard_rule.h"

namespace downpour {

class GradientRule : public ShardRule {
 public:
  std::string_view name() const override { return "sgd"; }
  Status Check(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    return shard.CheckGradients(ctx, chunks);
  }
  void Apply(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    if (shard.TakeGradients(ctx, chunks) == PushOutcome::kDroppedLate) ++shard.stats().dropped_late;
  }
};

}  // namespace downpour
