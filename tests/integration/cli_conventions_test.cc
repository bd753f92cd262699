// cli_conventions_test.cc — every downpour program follows the same command-line conventions
// (common/cli.h): --version / -V prints "<program> <version> (commit <sha>)" and exits 0,
// --help lists the exit codes and exits 0, an unknown flag is a usage error (exit 2) that names
// the program.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/version.h"
#include "downpour_config.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Program {
  const char* name;
  const char* path;  // in the build tree
};

std::vector<Program> Programs() {
  std::vector<Program> p = {
      {"downpour-launch", "server/downpour-launch"},
      {"downpour-server", "server/downpour-server"},
      {"downpour-coordinator", "server/downpour-coordinator"},
      {"downpour-keys", "server/downpour-keys"},
      {"downpour-worker", "client/worker/downpour-worker"},
      {"downpour-test", "client/worker/downpour-test"},
      {"downpour-time", "client/engine/downpour-time"},
      {"downpour-caffe", "client/caffe/downpour-caffe"},
      {"downpour-data", "data/downpour-data"},
      {"downpour-bench-data", "bench/data/downpour-bench-data"},
      {"downpour-bench-engine", "bench/engine/downpour-bench-engine"},
      {"downpour-bench-ps", "bench/ps/downpour-bench-ps"},
  };
  if (DOWNPOUR_HAVE_CUDA) p.push_back({"downpour-bench-gpu", "bench/gpu/downpour-bench-gpu"});
  return p;
}

TEST(CliConventions, EveryProgramHasVersionHelpAndUsageExitCodes) {
  for (const Program& p : Programs()) {
    const std::string bin = test::BuildDir() + "/" + p.path;
    std::string out;
    for (const char* flag : {"--version", "-V"}) {
      EXPECT_EQ(test::RunCommand({bin, flag}, &out), 0) << p.name << " " << flag << ": " << out;
      EXPECT_THAT(out, StartsWith(fmt::format("{} {} (commit ", p.name, Version()))) << p.name;
    }
    EXPECT_EQ(test::RunCommand({bin, "--help"}, &out), 0) << p.name << ": " << out;
    EXPECT_THAT(out, HasSubstr("Exit codes: 0 ok, 1 runtime failure, 2 usage or config error.")) << p.name;
    EXPECT_EQ(test::RunCommand({bin, "--no-such-flag"}, &out), 2) << p.name << ": " << out;
    EXPECT_THAT(out, StartsWith(std::string(p.name) + ": ")) << p.name;
  }
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

// `downpour-data convert-cifar --help` lists its batch files once (they were an option and a
// positional at the same time), and downpour-time says how many threads it used instead of
// "threads 0".
TEST(CliConventions, HelpAndReportsSayWhatIsTrue) {
  std::string out;
  ASSERT_EQ(test::RunCommand({test::Binary("downpour-data"), "convert-cifar", "--help"}, &out), 0) << out;
  size_t mentions = 0;
  for (size_t at = out.find("batch files"); at != std::string::npos; at = out.find("batch files", at + 1)) ++mentions;
  EXPECT_EQ(mentions, 1u) << out;
  EXPECT_THAT(out, Not(HasSubstr("--batch")));
  ASSERT_EQ(
      test::RunCommand({test::Binary("downpour-time"), "--model", test::SourcePath("configs/models/fmnist_small.toml"),
                        "--batch", "2", "--iterations", "1", "--warmup", "0"},
                       &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("(all cores)"));
  EXPECT_THAT(out, Not(HasSubstr("threads 0")));
  ASSERT_EQ(
      test::RunCommand({test::Binary("downpour-time"), "--model", test::SourcePath("configs/models/fmnist_small.toml"),
                        "--batch", "2", "--iterations", "1", "--warmup", "0", "--threads", "1"},
                       &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("threads 1\n"));
}

}  // namespace
}  // namespace downpour
