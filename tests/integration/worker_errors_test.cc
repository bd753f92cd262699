// worker_errors_test.cc — bad input to a worker process ends in one clear error and a non-zero
// exit, never an abort: a record whose label is outside the model's classes (named by its LMDB
// key), and an exception escaping the engine (here std::bad_alloc from an absurd batch size),
// which used to end in std::terminate.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;


class WorkerErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::ScratchDir("worker_errors"); }
  // 64 Fashion-MNIST-shaped images; record `bad` has label `bad_label`, the others 3.
  std::string MakeLmdb(int bad, uint8_t bad_label) {
    std::vector<uint8_t> pixels(64 * 28 * 28, 100), labels(64, 3);
    labels[static_cast<size_t>(bad)] = bad_label;
    test::WriteFile(dir_ / "images-idx3-ubyte", test::IdxFile(0x803, {64, 28, 28}, pixels));
    test::WriteFile(dir_ / "labels-idx1-ubyte", test::IdxFile(0x801, {64}, labels));
    std::string out;
    EXPECT_EQ(test::RunCommand(
                  {test::Binary("downpour-data"), "convert-idx", "--images", (dir_ / "images-idx3-ubyte").string(),
                   "--labels", (dir_ / "labels-idx1-ubyte").string(), "--out", (dir_ / "lmdb").string()},
                  &out),
              0)
        << out;
    return (dir_ / "lmdb").string();
  }

  std::string Config(const std::string& train) {
    const std::string path = (dir_ / "cfg.toml").string();
    test::WriteFile(path, fmt::format("[model]\nconfig = \"{}\"\n[worker]\nbatch_size = 16\nsteps = 8\nthreads = 1\n"
                                      "[data]\ntrain = \"{}\"\ntest = \"\"\n[eval]\nevery_steps = 0\n",
                                      test::SourcePath("configs/models/fmnist_small.toml"), train));
    return path;
  }

  fs::path dir_;
};

TEST_F(WorkerErrorsTest, LabelOutsideTheClassesNamesTheRecordKeyAndLabel) {
  const std::string cfg = Config(MakeLmdb(17, 12));
  std::string out;
  const int code = test::RunCommand(
      {test::Binary("downpour-worker"), "--local", "--quiet", "--config", cfg, "--run-dir", (dir_ / "run").string()},
      &out);
  EXPECT_EQ(code, 1) << out;  // not 134 (a CHECK abort)
  EXPECT_THAT(out, HasSubstr("key 00000017_17: label 12 is outside the model's 10 classes (0..9)")) << out;
  EXPECT_THAT(out, Not(HasSubstr("CHECK failed")));
}

TEST_F(WorkerErrorsTest, AnExceptionEscapingTheEngineIsOneLineAndExitOne) {
  const std::string cfg = Config(MakeLmdb(0, 3));
  std::string out;
  const int code = test::RunCommand({test::Binary("downpour-worker"), "--local", "--quiet", "--config", cfg,
                                     "--run-dir", (dir_ / "run").string(), "--set", "worker.batch_size=100000000"},
                                    &out);
  EXPECT_EQ(code, 1) << out;  // not 134 (std::terminate)
  EXPECT_THAT(out, HasSubstr("downpour-worker 0: out of memory")) << out;
  EXPECT_THAT(out, Not(HasSubstr("terminate called")));
}

// --local is one process doing the whole job: with a run config of several workers it reads the
// whole training set, not worker 0's slice of it (64 records; 8 steps of 16 = 2 epochs, not 4).
TEST_F(WorkerErrorsTest, ALocalRunReadsTheWholeTrainingSet) {
  const std::string cfg = Config(MakeLmdb(0, 3));
  std::string out;
  ASSERT_EQ(test::RunCommand({test::Binary("downpour-worker"), "--local", "--quiet", "--config", cfg, "--run-dir",
                              (dir_ / "run").string(), "--set", "cluster.workers=2"},
                             &out),
            0)
      << out;
  const std::string metrics = test::ReadFile(dir_ / "run" / "metrics" / "worker-0.jsonl");
  const size_t last = metrics.rfind("\"event\":\"step\"");
  ASSERT_NE(last, std::string::npos) << metrics;
  EXPECT_THAT(metrics.substr(last), HasSubstr("\"step\":8,\"clock\":0,\"epoch\":2,")) << metrics.substr(last);
}

}  // namespace
}  // namespace downpour
