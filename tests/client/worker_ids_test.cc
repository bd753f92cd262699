// worker_ids_test.cc — which worker ids RunWorker takes (client/worker/worker_app.h): ids from
// cluster.workers up only when cluster.max_workers allows workers to join, the refusal naming
// both settings; -1 (no --id: the coordinator would assign one) runs a --local run as worker 0.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/worker/worker_app.h"
#include "tests/testing/harness.h"

namespace downpour::worker {
namespace {

namespace fs = std::filesystem;


class WorkerIdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("worker_ids");
    std::vector<uint8_t> pixels(32 * 28 * 28, 100), labels(32, 3);
    test::WriteFile(dir_ / "train-images-idx3-ubyte", test::IdxFile(0x803, {32, 28, 28}, pixels));
    test::WriteFile(dir_ / "train-labels-idx1-ubyte", test::IdxFile(0x801, {32}, labels));
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  WorkerArgs Args(int id, int workers, int max_workers) {
    const std::string path = (dir_ / "cfg.toml").string();
    test::WriteFile(path, fmt::format("[model]\nconfig = \"{}\"\n[worker]\nbatch_size = 8\nsteps = 2\nthreads = 1\n"
                                      "[data]\ntrain = \"{}\"\ntest = \"\"\n[eval]\nevery_steps = 0\n"
                                      "[cluster]\nworkers = {}\nmax_workers = {}\n",
                                      test::SourcePath("configs/models/fmnist_small.toml"),
                                      (dir_ / "train-images-idx3-ubyte").string(), workers, max_workers));
    WorkerArgs a;
    a.id = id;
    a.config_path = path;
    a.run_dir = (dir_ / "run").string();
    a.quiet = true;
    return a;
  }
  fs::path dir_;
};

TEST_F(WorkerIdsTest, IdAtOrAboveWorkersIsRefusedUnlessMaxWorkersLetsItJoin) {
  bool started = false;
  Status s = RunWorker(Args(2, 2, 0), nullptr, &started);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--id 2 is out of range"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cluster.max_workers = 0"), std::string::npos) << s.message();
  EXPECT_FALSE(started);
  s = RunWorker(Args(4, 2, 4), nullptr, &started);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cluster.max_workers = 4"), std::string::npos) << s.message();
}

TEST_F(WorkerIdsTest, NoIdInALocalRunIsWorkerZero) {
  WorkerArgs a = Args(-1, 1, 0);
  a.local = true;
  TrainResult r;
  ASSERT_TRUE(RunWorker(a, &r).ok());
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(fs::exists(fs::path(a.run_dir) / "metrics" / "worker-0.jsonl"));
}

}  // namespace
}  // namespace downpour::worker
