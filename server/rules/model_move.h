// model_move.h — a model moves on (multi-model runs, client/worker/multi_model.h): its holder's
// change over a stage, added as it is (AddRule); the push's clock is the batches the stage
// trained, the lr schedule's step for it.
#pragma once

#include "server/rules/shard_rule.h"

namespace downpour {

class ModelMoveRule final : public ShardRule {
 public:
  std::string_view name() const override { return "move"; }
  void Apply(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    for (const PushChunk& c : chunks) shard.store().Add(c.local, c.grad, ctx.clock, c.keep);
    shard.stats().chunk_updates += chunks.size();
  }
};

}  // namespace downpour
