// shard_rules_test.cc — which rule a shard gets for each kind of push (server/rules/shard_rule.h).
// What each rule does to the weights is tested through a shard (shard_test.cc: DC-ASGD, EASGD,
// local SGD, model moves, and a rule defined in the test alone).
#include <gtest/gtest.h>

#include "common/codec.h"
#include "server/rules/shard_rule.h"

namespace downpour {
namespace {

ShardRuleOptions For(Algorithm a) {
  ShardRuleOptions o;
  o.consistency.algorithm = a;
  o.max_workers = 2;
  o.chunks = 3;
  return o;
}

std::string NameOf(PushKind kind, const ShardRuleOptions& o) {
  std::unique_ptr<ShardRule> rule = MakeShardRule(kind, o);
  return rule == nullptr ? "none" : std::string(rule->name());
}

// Every kind gets a rule under every algorithm: which kinds a shard takes live is its checks'
// (request_check.h), and a log record of any kind is replayed by its kind's rule.
TEST(ShardRules, EachKindOfPushGetsTheRuleItsAlgorithmNames) {
  EXPECT_EQ(NameOf(PushKind::kGradient, For(Algorithm::kSgd)), "sgd");
  EXPECT_EQ(NameOf(PushKind::kGradient, For(Algorithm::kDcAsgd)), "dc-asgd");
  EXPECT_EQ(NameOf(PushKind::kGradient, For(Algorithm::kDcAsgdAdaptive)), "dc-asgd-a");
  EXPECT_EQ(NameOf(PushKind::kGradient, For(Algorithm::kEasgd)), "sgd");
  for (Algorithm a : {Algorithm::kSgd, Algorithm::kDcAsgd, Algorithm::kEasgd, Algorithm::kLocalSgd}) {
    EXPECT_EQ(NameOf(PushKind::kElastic, For(a)), "elastic");
    EXPECT_EQ(NameOf(PushKind::kMove, For(a)), "move");
  }
}

TEST(ShardRules, OnlyDcAsgdARewritesKeepsRawGradientsAndCheckpointsAState) {
  for (Algorithm a : {Algorithm::kSgd, Algorithm::kDcAsgd, Algorithm::kDcAsgdAdaptive}) {
    SCOPED_TRACE(static_cast<int>(a));
    const std::unique_ptr<ShardRule> rule = MakeShardRule(PushKind::kGradient, For(a));
    ASSERT_NE(rule, nullptr);
    EXPECT_EQ(rule->rewrites(), a != Algorithm::kSgd);
    EXPECT_EQ(rule->keeps_raw(), a == Algorithm::kDcAsgdAdaptive);
    EXPECT_EQ(rule->state_name(), a == Algorithm::kDcAsgdAdaptive ? "dc_mean_square" : "");
  }
  for (PushKind k : {PushKind::kElastic, PushKind::kMove}) {
    const std::unique_ptr<ShardRule> rule = MakeShardRule(k, For(Algorithm::kEasgd));
    ASSERT_NE(rule, nullptr);
    EXPECT_FALSE(rule->rewrites());
    EXPECT_FALSE(rule->keeps_raw());
    EXPECT_TRUE(rule->state_name().empty());
  }
}

// DC-ASGD-a's state is a chunk's mean square, handed over as a checkpoint restores it.
TEST(ShardRules, DcAsgdAHoldsTheMeanSquareACheckpointHandsIt) {
  const std::unique_ptr<ShardRule> rule = MakeShardRule(PushKind::kGradient, For(Algorithm::kDcAsgdAdaptive));
  EXPECT_TRUE(rule->ChunkState(1).empty()) << "no gradient yet";
  rule->SetChunkState(1, {0.5f, 2.0f});
  EXPECT_EQ(rule->ChunkState(1), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_TRUE(rule->ChunkState(0).empty());
  EXPECT_TRUE(rule->ChunkState(3).empty()) << "outside the shard's chunks";
  rule->Replay(1, std::vector<float>{2.0f, 0.0f}.data(), 2);  // m = 0.95: 0.95 · ms + 0.05 · g²
  EXPECT_FLOAT_EQ(rule->ChunkState(1)[0], 0.95f * 0.5f + 0.05f * 4.0f);
  EXPECT_FLOAT_EQ(rule->ChunkState(1)[1], 0.95f * 2.0f);
}

TEST(ShardRules, APushsKindIsInItsFlags) {
  EXPECT_EQ(PushKindOf(0), PushKind::kGradient);
  EXPECT_EQ(PushKindOf(kFlagElastic), PushKind::kElastic);
  EXPECT_EQ(PushKindOf(kFlagMove), PushKind::kMove);
  EXPECT_EQ(PushKindOf(kFlagShm), PushKind::kGradient);
}

}  // namespace
}  // namespace downpour
