// rotation_test.cc — common/rotation.h: for several K (models) and W (workers), the pipeline
// visits every (model, partition) pair exactly `passes` times, keeps every worker busy in every
// stage, never gives a model two holders when K >= W, and its moves_before counts the move pushes
// the model took in earlier stages; with K < W a stage's holders train together (data-parallel)
// unless rotation.groups = "average", and the versions a stage starts and ends at chain from one
// stage of a model to its next in async and sync, the servers' sync rounds (HoldsModel) waiting
// for exactly the stage's holders; the baselines give every model the same images.
#include "common/rotation.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace downpour {
namespace {

TEST(RotationTest, PipelineVisitsEveryModelPartitionPairEqually) {
  for (RotationGroups groups : {RotationGroups::kDataParallel, RotationGroups::kAverage})
  for (int k = 1; k <= 7; ++k) {
    for (int w = 1; w <= 7; ++w) {
      for (int passes : {1, 3}) {
        SCOPED_TRACE(testing::Message() << "K=" << k << " W=" << w << " passes=" << passes << " groups="
                                        << RotationGroupsName(groups));
        std::map<std::pair<int, int>, int> visits;               // (model, partition) -> stages
        std::map<std::pair<int, int>, std::vector<int>> holders;  // (stage, model) -> workers
        std::vector<std::vector<StageTask>> all(static_cast<size_t>(w));
        for (int i = 0; i < w; ++i) {
          all[static_cast<size_t>(i)] = WorkerStages(RotationScheme::kPipeline, k, w, passes, i, groups);
          const auto& stages = all[static_cast<size_t>(i)];
          ASSERT_EQ(stages.size(), static_cast<size_t>(k * passes));  // busy in every stage
          for (size_t t = 0; t < stages.size(); ++t) {
            const StageTask& s = stages[t];
            EXPECT_EQ(s.partition, i);  // data stays
            EXPECT_EQ(s.model, (i + static_cast<int>(t)) % k);
            EXPECT_EQ(s.data_parallel, k < w && groups == RotationGroups::kDataParallel);
            EXPECT_TRUE(s.pull);
            ++visits[{s.model, s.partition}];
            holders[{static_cast<int>(t), s.model}].push_back(i);
          }
        }
        ASSERT_EQ(visits.size(), static_cast<size_t>(k * w));
        for (const auto& [pair, n] : visits) EXPECT_EQ(n, passes) << "model " << pair.first << " partition " << pair.second;
        // Group sizes agree with the holders, and K >= W never shares a model within a stage.
        std::map<int, int64_t> moves;   // per model, through the stages so far
        std::map<int, int64_t> trained;  // per model, stages with a holder so far
        for (int t = 0; t < k * passes; ++t) {
          for (int m = 0; m < k; ++m) {
            const auto it = holders.find({t, m});
            if (it == holders.end()) continue;
            if (k >= w) {
              EXPECT_EQ(it->second.size(), 1u);
            }
            for (int i : it->second) {
              const StageTask& s = all[static_cast<size_t>(i)][static_cast<size_t>(t)];
              EXPECT_EQ(s.group, static_cast<int>(it->second.size()));
              EXPECT_EQ(s.moves_before, moves[m]) << "stage " << t << " model " << m;
              EXPECT_EQ(s.stages_before, trained[m]) << "stage " << t << " model " << m;
            }
          }
          for (int m = 0; m < k; ++m) {
            const auto it = holders.find({t, m});
            if (it != holders.end()) moves[m] += static_cast<int64_t>(it->second.size());
            if (it != holders.end()) ++trained[m];
          }
        }
        const bool data_parallel = k < w && groups == RotationGroups::kDataParallel;
        for (int m = 0; m < k; ++m) {
          EXPECT_EQ(moves[m], int64_t{w} * passes);  // holder-stages: every worker holds every model `passes` times
          EXPECT_EQ(MovesPerModel(RotationScheme::kPipeline, k, w, passes, groups), data_parallel ? 0 : moves[m]);
        }
      }
    }
  }
}

// A model's stages chain: each starts at the version the one before it ended at (every holder's
// updates of the stage counted), in async and sync, for local and data-parallel stages; and in
// sync, round v of model m waits for exactly the workers holding m in stage v / stage_steps.
TEST(RotationTest, StageVersionsChainAndSyncRoundsWaitForTheStagesHolders) {
  const int64_t steps = 3;
  for (RotationGroups groups : {RotationGroups::kDataParallel, RotationGroups::kAverage})
  for (ConsistencyMode mode : {ConsistencyMode::kAsync, ConsistencyMode::kSync})
  for (int k = 1; k <= 5; ++k) {
    for (int w = 1; w <= 6; ++w) {
      const int passes = 2;
      SCOPED_TRACE(testing::Message() << "K=" << k << " W=" << w << " groups=" << RotationGroupsName(groups)
                                      << " sync=" << (mode == ConsistencyMode::kSync));
      // (stage, model) -> [before, after) as every holder computes it; holders must agree.
      std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> span;
      std::map<std::pair<int, int>, std::set<int>> holders;
      for (int i = 0; i < w; ++i) {
        const auto stages = WorkerStages(RotationScheme::kPipeline, k, w, passes, i, groups);
        for (size_t t = 0; t < stages.size(); ++t) {
          const StageTask& s = stages[t];
          const std::pair<int64_t, int64_t> v{VersionsBefore(s, mode, steps), VersionsAfter(s, mode, steps)};
          const auto [it, fresh] = span.emplace(std::pair{static_cast<int>(t), s.model}, v);
          if (!fresh) {
            EXPECT_EQ(it->second, v) << "stage " << t << " model " << s.model << " worker " << i;
          }
          holders[{static_cast<int>(t), s.model}].insert(i);
        }
      }
      for (int m = 0; m < k; ++m) {
        int64_t at = 0;  // the model's version so far
        for (int t = 0; t < k * passes; ++t) {
          const auto it = span.find({t, m});
          if (it == span.end()) continue;
          EXPECT_EQ(it->second.first, at) << "stage " << t << " model " << m;
          EXPECT_GT(it->second.second, at);
          at = it->second.second;
        }
        // The model's updates in all: one move per holder-stage, a gradient per holder and step
        // (async), one round per step of each stage (sync).
        const bool dp = k < w && groups == RotationGroups::kDataParallel;
        const int64_t total = !dp ? int64_t{w} * passes
                                  : (mode == ConsistencyMode::kSync ? int64_t{k} * passes * steps
                                                                    : int64_t{w} * passes * steps);
        EXPECT_EQ(at, total) << "model " << m;
        if (!dp || mode != ConsistencyMode::kSync) continue;
        for (int64_t v = 0; v < at + steps; ++v) {
          std::set<int> want;
          if (const auto h = holders.find({static_cast<int>(v / steps), m}); h != holders.end()) want = h->second;
          std::set<int> got;
          for (int i = 0; i < w + 2; ++i) {
            if (HoldsModel(i, m, v, steps, k, w, passes)) got.insert(i);
          }
          EXPECT_EQ(got, want) << "model " << m << " round " << v;
        }
      }
    }
  }
}

// A run can take a restarted worker back exactly when every stage of every worker is its own.
TEST(RotationTest, EveryStageHasOneHolderAgreesWithTheStages) {
  for (RotationScheme scheme : {RotationScheme::kPipeline, RotationScheme::kSequential, RotationScheme::kIndependent})
  for (RotationGroups groups : {RotationGroups::kDataParallel, RotationGroups::kAverage})
  for (int k = 1; k <= 5; ++k) {
    for (int w = 1; w <= 5; ++w) {
      bool own = true;
      for (int i = 0; i < w; ++i) {
        for (const StageTask& s : WorkerStages(scheme, k, w, 2, i, groups)) own = own && !s.data_parallel && s.group == 1;
      }
      EXPECT_EQ(EveryStageHasOneHolder(scheme, k, w), own)
          << RotationSchemeName(scheme) << " " << RotationGroupsName(groups) << " K=" << k << " W=" << w;
    }
  }
}

TEST(RotationTest, BaselinesGiveEveryModelTheSameImagesAsThePipeline) {
  for (int k = 1; k <= 5; ++k) {
    for (int w = 1; w <= 5; ++w) {
      SCOPED_TRACE(testing::Message() << "K=" << k << " W=" << w);
      const int passes = 2;
      // Units of one partition pass per model, summed over workers.
      std::map<int, int> pipeline, sequential, independent;
      std::map<int, std::set<int>> independent_workers;
      for (int i = 0; i < w; ++i) {
        for (const StageTask& s : WorkerStages(RotationScheme::kPipeline, k, w, passes, i)) pipeline[s.model] += s.units;
        for (const StageTask& s : WorkerStages(RotationScheme::kSequential, k, w, passes, i)) {
          EXPECT_TRUE(s.data_parallel);
          EXPECT_EQ(s.partition, i);
          sequential[s.model] += s.units;
        }
        int j = 0, last_model = -1;
        for (const StageTask& s : WorkerStages(RotationScheme::kIndependent, k, w, passes, i)) {
          independent[s.model] += s.units;
          independent_workers[s.model].insert(i);
          if (s.model != last_model) j = 0;
          EXPECT_EQ(s.partition, (i + j) % w);  // its own partition first, then the others'
          EXPECT_EQ(s.pull, j == 0);
          EXPECT_EQ(s.moves_before, j);
          last_model = s.model;
          ++j;
        }
      }
      for (int m = 0; m < k; ++m) {
        EXPECT_EQ(pipeline[m], w * passes) << "model " << m;
        EXPECT_EQ(sequential[m], w * passes) << "model " << m;
        EXPECT_EQ(independent[m], w * passes) << "model " << m;
        EXPECT_EQ(independent_workers[m], std::set<int>{m % w});  // one worker per job
      }
    }
  }
}

TEST(RotationTest, SequentialRunsTheModelsOneAfterAnother) {
  const auto stages = WorkerStages(RotationScheme::kSequential, 3, 2, 4, 1);
  ASSERT_EQ(stages.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(stages[static_cast<size_t>(k)].model, k);
    EXPECT_EQ(stages[static_cast<size_t>(k)].units, 4);
  }
  EXPECT_EQ(MovesPerModel(RotationScheme::kSequential, 3, 2, 4), 0);
}

TEST(RotationTest, OutOfRangeArgumentsGiveNoStages) {
  EXPECT_TRUE(WorkerStages(RotationScheme::kPipeline, 0, 4, 1, 0).empty());
  EXPECT_TRUE(WorkerStages(RotationScheme::kPipeline, 4, 4, 1, 4).empty());
  EXPECT_TRUE(WorkerStages(RotationScheme::kPipeline, 4, 4, 0, 0).empty());
}

}  // namespace
}  // namespace downpour
