// shard_rule.h — what a shard does with a push it takes, one rule per kind of push: a worker's
// gradient (through the consistency policy, by the solver's UpdateRule; DC-ASGD compensates it
// first), an elastic exchange (EASGD, local SGD: the center moves by the worker's difference) and
// a model's move (multi-model runs). The element-wise arithmetic is UpdateRule's
// (common/solver/update_rule.h: momentum, AdaGrad, plain addition); a ShardRule says which of it
// runs on what, and keeps whatever state of its own it needs beside the chunks (DC-ASGD's pulled
// copies and mean squares) through pulls, checkpoints and replay. docs/architecture.md, "Shard
// rules: what each kind of push does", has the rules and where they sit in the shard.
//
// For each push of its kind that passed the shard's checks (server/request_check.h), the shard
// calls, in this order:
//   Check    may refuse the push (the consistency policy's clock); nothing is logged or changed;
//   Prepare  may rewrite the gradients into buffers of the rule's own, valid until the next
//            Prepare (rewrites() true); they are what is logged and applied, so replay repeats
//            them without the rule;
//   Commit   the push is staged in the log (taken): what Prepare staged for it becomes the rule's;
//   Apply    the update, through RuleShard; also for each replayed log record, after Replay.
// A resent push already taken reaches none of them. OnPullServed follows every pull a worker (not
// the evaluator) was served; ChunkState / SetChunkState carry the rule's state in the shard's
// checkpoints.
//
// Adding a rule: its own file (a class deriving ShardRule, as elastic.h), one line in
// MakeShardRule (shard_rules.cc) and the config key that selects it. A test may hand a shard its
// own rule for gradient pushes (ShardOptions::gradient_rule) without any of that.
//
// Thread-safety: every call is on the shard's loop with its lock held.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/codec.h"
#include "common/config/consistency.h"
#include "common/status.h"
#include "server/chunk_store.h"
#include "server/consistency.h"
#include "server/shard_checkpoint.h"

namespace downpour {

// The kinds of push a shard updates by (an init push is not one: its first weights win).
enum class PushKind { kGradient, kElastic, kMove };
inline constexpr int kPushKinds = 3;
// By the push's flags (common/codec.h kFlagElastic, kFlagMove); not for init pushes.
PushKind PushKindOf(uint32_t flags);

// The shard as a rule sees it.
class RuleShard {
 public:
  virtual ~RuleShard() = default;
  // The chunks: versions and iterations now, weights after Drain, Add.
  virtual ChunkStore& store() = 0;
  virtual ShardStatsWire& stats() = 0;
  // A gradient push through the consistency policy: may it be taken (ConsistencyPolicy::CheckPush),
  // then taken (OnPush: applied now, summed for sync's round, or dropped as too late).
  virtual Status CheckGradients(const PushContext& ctx, std::span<const PushChunk> chunks) = 0;
  virtual PushOutcome TakeGradients(const PushContext& ctx, std::span<const PushChunk> chunks) = 0;
  // A measured staleness of chunk `local` (versions behind when taken): counted, and in the ack.
  virtual void RecordStaleness(int local, int64_t staleness) = 0;
};

class ShardRule {
 public:
  virtual ~ShardRule() = default;
  // For logs and tests: "sgd", "dc-asgd", "elastic", "move", ...
  virtual std::string_view name() const = 0;

  // `ctx.clock`: a gradient's iteration, an exchange's clock, a move's batches (CheckDensePush
  // bounds it).
  virtual Status Check(RuleShard&, const PushContext&, std::span<const PushChunk>) { return Status::Ok(); }
  // Whether Prepare rewrites gradients. Then the push is logged as rewritten (never as the wire
  // carried it), and Apply must be done with `grad` when it returns (the rule reuses its buffers).
  virtual bool rewrites() const { return false; }
  // Whether its log records also keep the gradients as pushed (for Replay; server/wal.h
  // kWalFlagRaw). Only a rule that rewrites needs them.
  virtual bool keeps_raw() const { return false; }
  virtual void Prepare(RuleShard&, int32_t /*worker*/, std::vector<PushChunk>* /*chunks*/) {}
  virtual void Commit(std::span<const PushChunk>) {}
  virtual void Apply(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) = 0;

  // A pull by `worker` was served chunks `locals` (at their versions now).
  virtual void OnPullServed(RuleShard&, int32_t /*worker*/, std::span<const int> /*locals*/) {}
  // Replaying a record that kept raw gradients: chunk `local`'s pushed gradient, before Apply.
  virtual void Replay(int /*local*/, const float* /*raw*/, int64_t /*count*/) {}

  // Its own per-weight state of each chunk, if it keeps one (DC-ASGD-a's mean squares): the
  // checkpoint holds it as tensor chunk<id>.<state_name()>; "" = none. ChunkState is chunk
  // `local`'s (count floats, or empty: none yet); SetChunkState adopts a checkpoint's (checked to
  // be count floats, or empty: start afresh).
  virtual std::string_view state_name() const { return {}; }
  virtual std::vector<float> ChunkState(int /*local*/) const { return {}; }
  virtual void SetChunkState(int /*local*/, std::vector<float> /*state*/) {}
};

struct ShardRuleOptions {
  ConsistencyConfig consistency;  // algorithm and its keys
  int max_workers = 1;            // worker ids 0..max_workers-1
  int chunks = 0;                 // the shard's own chunks
};

// The rule for pushes of `kind` on a shard of `o`; never null. Which kinds a shard takes live is
// the shard's checks' (server/request_check.h: exchanges only under "easgd" and "local-sgd",
// gradients only under the others, moves only on multi-model servers); a log record of any kind
// is replayed by its kind's rule, so what was acknowledged is applied again even by a server
// resumed with another algorithm.
std::unique_ptr<ShardRule> MakeShardRule(PushKind kind, const ShardRuleOptions& o);

}  // namespace downpour
