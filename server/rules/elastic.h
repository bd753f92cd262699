// elastic.h — an elastic exchange (EASGD, Zhang, Choromanska, LeCun, NIPS 2015; local SGD): the
// worker trains its own copy and sends the difference it computed, α(x_worker − x_center) for
// EASGD or its progress for local SGD; the center adds it as it is (AddRule). An exchange stands
// for the batches the worker trained since its last one (ExchangeBatches): the center's place on
// the run's images-processed axis, which the evaluator reports and the lr schedule follows. Its
// staleness (center versions since the worker's last exchange) is counted as a gradient's is.
#pragma once

#include <algorithm>

#include "common/solver/lr_policy.h"
#include "server/rules/shard_rule.h"

namespace downpour {

class ElasticRule final : public ShardRule {
 public:
  explicit ElasticRule(int batches_per_exchange) : iters_(ScheduleIterations(1, batches_per_exchange)) {}
  std::string_view name() const override { return "elastic"; }
  void Apply(RuleShard& shard, const PushContext&, std::span<const PushChunk> chunks) override {
    ChunkStore& store = shard.store();
    for (const PushChunk& c : chunks) {
      shard.RecordStaleness(c.local, std::max<int64_t>(0, store.version(c.local) - c.version_from));
      store.Add(c.local, c.grad, iters_, c.keep);
    }
    shard.stats().chunk_updates += chunks.size();
  }

 private:
  const int64_t iters_;  // the lr schedule's step for one exchange
};

}  // namespace downpour
