// shard_rules.cc — the shard rules' factory (shard_rule.h), and the push kinds.
#include "common/codec.h"
#include "server/rules/dc_asgd.h"
#include "server/rules/elastic.h"
#include "server/rules/gradient.h"
#include "server/rules/model_move.h"
#include "server/rules/shard_rule.h"

namespace downpour {

PushKind PushKindOf(uint32_t flags) {
  if ((flags & kFlagMove) != 0) return PushKind::kMove;
  if ((flags & kFlagElastic) != 0) return PushKind::kElastic;
  return PushKind::kGradient;
}

std::unique_ptr<ShardRule> MakeShardRule(PushKind kind, const ShardRuleOptions& o) {
  switch (kind) {
    case PushKind::kGradient:  // consistency.algorithm
      if (DelayCompensated(o.consistency.algorithm)) {
        return std::make_unique<DcAsgdRule>(o.consistency, o.max_workers, o.chunks);
      }
      return std::make_unique<GradientRule>();
    case PushKind::kElastic:  // consistency.algorithm = "easgd" or "local-sgd" (their keys)
      return std::make_unique<ElasticRule>(ExchangeBatches(o.consistency));
    case PushKind::kMove:  // a multi-model run ([[models]])
      return std::make_unique<ModelMoveRule>();
  }
  return nullptr;
}

}  // namespace downpour
