// job_config_test.cc — the multi-process tests' job builder (tests/testing/job_config.h): what
// FashionJob says it is, read back by the parser the programs use, and what Set, SetList, Merge
// and Erase do to it.
#include "tests/testing/job_config.h"

#include <fmt/format.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <toml++/toml.h>

#include <filesystem>
#include <string>

#include "common/run_config.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;

RunConfig Parse(const test::JobConfig& job) {
  RunConfig parsed;
  const Status st = ParseRunConfig(job.Toml(), "job.toml", &parsed);
  EXPECT_TRUE(st.ok()) << st.message() << "\n" << job.Toml();
  return parsed;
}

TEST(JobConfig, FashionJobIsTheJobItsCommentDescribes) {
  const test::JobConfig job = test::FashionJob("fmnist_fast", 7, /*servers=*/3, /*workers=*/4);
  const RunConfig c = Parse(job);
  EXPECT_EQ(c.model.config, test::SourcePath("configs/models/fmnist_fast.toml"));
  EXPECT_TRUE(fs::exists(c.model.config));
  EXPECT_EQ(c.run.seed, 5);
  EXPECT_EQ(c.cluster.servers, 3);
  EXPECT_EQ(c.cluster.workers, 4);
  // The coordinator right below the servers' ports, all on loopback.
  EXPECT_EQ(c.cluster.coordinator, fmt::format("127.0.0.1:{}", c.cluster.base_port - 1));
  EXPECT_EQ(job.Int("cluster.base_port"), c.cluster.base_port);
  EXPECT_EQ(job.String("cluster.coordinator"), c.cluster.coordinator);
  EXPECT_EQ(c.cluster.heartbeat_ms, 200);
  EXPECT_EQ(c.cluster.heartbeat_timeout_ms, 2000);
  EXPECT_FLOAT_EQ(c.solver.base_lr, 0.01f);
  EXPECT_EQ(c.solver.lr_policy, LrPolicy::kFixed);
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kAsync);
  EXPECT_EQ(c.worker.batch_size, 32);
  EXPECT_EQ(c.worker.steps, 7);
  EXPECT_EQ(c.worker.threads, 1);
  EXPECT_EQ(c.data.train, fmt::format("{}/train-images-idx3-ubyte.gz", test::kFashionMnistDir));
  EXPECT_EQ(c.data.test, fmt::format("{}/t10k-images-idx3-ubyte.gz", test::kFashionMnistDir));
  EXPECT_EQ(c.eval.every_steps, 0);
  EXPECT_EQ(c.eval.test_batches, 0);
  EXPECT_EQ(c.checkpoint.every_updates, 0);
  // A model given as a path is taken as it is.
  EXPECT_EQ(Parse(test::FashionJob("/tmp/tiny.toml", 1)).model.config, "/tmp/tiny.toml");
}

TEST(JobConfig, SetReplacesOrAddsAndEraseGivesTheKeyBackItsDefault) {
  test::JobConfig job = test::FashionJob("fmnist_small", 10);
  job.Set("worker.batch_size", 64)
      .Set("consistency.mode", "sync")
      .Set("consistency.backup_workers", 1)
      .Set("eval.evaluator", false)
      .Set("solver.momentum", 0.5)
      .Set("run.name", std::string("named"))
      .Erase("eval.every_steps")
      .Erase("no_such_table.key");  // nothing to erase: no failure
  const RunConfig c = Parse(job);
  EXPECT_EQ(c.worker.batch_size, 64);
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kSync);
  EXPECT_EQ(c.consistency.backup_workers, 1);
  EXPECT_FALSE(c.eval.evaluator);
  EXPECT_FLOAT_EQ(c.solver.momentum, 0.5f);
  EXPECT_EQ(c.run.name, "named");
  EXPECT_EQ(c.eval.every_steps, EvalConfig{}.every_steps);
  EXPECT_EQ(c.cluster.servers, 2);  // the rest of [cluster] is untouched
}

TEST(JobConfig, ListsAndMergedFragmentsNestAsTomlSays) {
  test::JobConfig job = test::FashionJob("fmnist_small", 10);
  job.Erase("solver.base_lr");
  job.Set("rotation.scheme", "sequential").SetList("sweep.solver.base_lr", {0.005, 0.02});
  RunConfig c = Parse(job);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_FLOAT_EQ(c.models[0].solver.base_lr, 0.005f);
  EXPECT_FLOAT_EQ(c.models[1].solver.base_lr, 0.02f);

  // A fragment's tables merge into the job's (the other [cluster] keys stay); its arrays of
  // tables are added.
  job.Erase("sweep").Merge("[cluster]\nmax_workers = 6\n[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\n");
  c = Parse(job);
  EXPECT_EQ(c.cluster.max_workers, 6);
  EXPECT_EQ(c.cluster.servers, 2);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[1].name, "b");
}

// What Toml() writes parses back to the same values, floats written short (0.1, not
// 0.10000000000000001), strings escaped, a key that is not bare quoted, arrays of tables in order.
TEST(JobConfig, ItsTomlReadsBackToTheSameValues) {
  test::JobConfig job;
  const std::string odd = "a'b\"c\\d\ne";
  job.Set("x.f1", 0.1)
      .Set("x.f2", 1e-05)
      .Set("x.f3", 1.0)
      .Set("x.f4", 1e20)
      .Set("x.s", odd)
      .Set("x.odd key", 7)
      .Set("x.yes", true)
      .SetList("x.list", {0.5, 2.0})
      .Merge("[[m]]\nname = \"a\"\n[m.solver]\nbase_lr = 0.3\n[[m]]\nname = \"b\"\n");
  const std::string text = job.Toml();
  EXPECT_NE(text.find("f1 = 0.1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("f3 = 1.0\n"), std::string::npos) << text;
  toml::table t;
  try {
    t = toml::parse(text);
  } catch (const toml::parse_error& e) {
    FAIL() << e.description() << " in:\n" << text;
  }
  EXPECT_EQ(t["x"]["f1"].value<double>(), 0.1);
  EXPECT_EQ(t["x"]["f2"].value<double>(), 1e-05);
  EXPECT_EQ(t["x"]["f3"].value<double>(), 1.0);
  EXPECT_EQ(t["x"]["f4"].value<double>(), 1e20);
  EXPECT_EQ(t["x"]["s"].value<std::string>(), odd);
  EXPECT_EQ(t["x"]["odd key"].value<int64_t>(), 7);
  EXPECT_EQ(t["x"]["yes"].value<bool>(), true);
  EXPECT_EQ(t["x"]["list"][1].value<double>(), 2.0);
  EXPECT_EQ(t["m"][0]["name"].value<std::string>(), "a");
  EXPECT_EQ(t["m"][0]["solver"]["base_lr"].value<double>(), 0.3);
  EXPECT_EQ(t["m"][1]["name"].value<std::string>(), "b");
  EXPECT_EQ(t["m"][1]["solver"].as_table(), nullptr);
}

TEST(JobConfig, MistakesFailTheTestThatMadeThem) {
  test::JobConfig job;
  job.Set("run.seed", 1);
  EXPECT_NONFATAL_FAILURE(job.Merge("[unclosed"), "JobConfig::Merge");
  EXPECT_NONFATAL_FAILURE(job.Set("run.seed.deeper", 2), "a part of the path is a value");
  EXPECT_NONFATAL_FAILURE(job.Int("run.missing"), "no integer there");
  EXPECT_NONFATAL_FAILURE(job.String("run.seed"), "no string there");
  EXPECT_EQ(job.Int("run.seed"), 1);  // untouched by the failed calls
}

}  // namespace
}  // namespace downpour
