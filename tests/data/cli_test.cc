// cli_test.cc — the downpour-data binary and scripts/get_fashion_mnist end to end: convert,
// inspect (with contact sheet), mean, and a bad path giving one clear error and exit 1.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/mean_file.h"
#include "downpour_config.h"
#include "tests/data/test_util.h"
#include "tests/testing/harness.h"

namespace downpour::data {
namespace {

using testing::IdxImageBytes;
using testing::IdxLabelBytes;
using testing::TempDir;
using testing::WriteBytes;

std::string Binary() { return test::Binary("downpour-data"); }

// Runs a shell command; returns its exit status and stdout+stderr.
int RunCommand(const std::string& cmd, std::string* output) { return test::RunShell(cmd, output); }

TEST(DataCli, ConvertInspectMean) {
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << Binary() << " not built";
  TempDir dir;
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < 20; ++i) {
    for (int p = 0; p < 9; ++p) pixels.push_back(static_cast<uint8_t>(i * 10 + p));
    labels.push_back(static_cast<uint8_t>(i % 5));
  }
  WriteBytes(dir / "img.gz", IdxImageBytes(20, 3, 3, pixels), true);
  WriteBytes(dir / "lab.gz", IdxLabelBytes(labels), true);
  std::string out;
  ASSERT_EQ(RunCommand(Binary() + " convert-idx --images " + (dir / "img.gz") + " --labels " +
                    (dir / "lab.gz") + " --out " + (dir / "db") + " --shards 2", &out), 0) << out;
  EXPECT_NE(out.find("wrote 20 records into 2 LMDB(s)"), std::string::npos) << out;
  ASSERT_EQ(RunCommand(Binary() + " inspect " + (dir / "db/shard_1_of_2") + " --sheet " + (dir / "s.png"), &out), 0) << out;
  EXPECT_NE(out.find("10 records (0 encoded, 0 bad)"), std::string::npos) << out;
  EXPECT_NE(out.find("shape 1x3x3: 10"), std::string::npos) << out;
  EXPECT_NE(out.find("labels: 0:2 1:2 2:2 3:2 4:2"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::file_size(dir / "s.png") > 0);
  ASSERT_EQ(RunCommand(Binary() + " mean " + (dir / "db/shard_0_of_2") + " --out " + (dir / "m.tensor"), &out), 0) << out;
  MeanImage m;
  ASSERT_TRUE(ReadMeanFile(dir / "m.tensor", &m).ok());
  ASSERT_EQ(m.values.size(), 9u);
  EXPECT_FLOAT_EQ(m.values[0], 90.0f);  // shard 0 holds images 0, 2, ..., 18: mean 10*9

  EXPECT_EQ(RunCommand(Binary() + " inspect " + (dir / "nope"), &out), 2);  // bad input: exit 2
  EXPECT_NE(out.find("LMDB " + (dir / "nope") + ": no such directory"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(Binary() + " convert-idx --images " + (dir / "missing.gz") + " --labels " +
                    (dir / "lab.gz") + " --out " + (dir / "db2"), &out), 2);
  EXPECT_NE(out.find("missing.gz"), std::string::npos) << out;
}

TEST(DataCli, GetFashionMnistIsIdempotent) {
  const std::string script = std::string(DOWNPOUR_SOURCE_DIR) + "/scripts/get_fashion_mnist";
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << Binary() << " not built";
  if (!std::filesystem::exists(std::string(DOWNPOUR_FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed; the script would apt-get it";
  }
  TempDir dir;
  std::string out;
  const std::string cmd = "DOWNPOUR_DATA_BIN=" + Binary() + " " + script + " " + dir.path().string();
  ASSERT_EQ(RunCommand(cmd, &out), 0) << out;
  EXPECT_NE(out.find("train_lmdb (60000)"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir / "fashion-mnist/.complete"));
  ASSERT_EQ(RunCommand(cmd, &out), 0) << out;
  EXPECT_NE(out.find("nothing to do"), std::string::npos) << out;
  // An interrupted run (no marker) is redone from scratch.
  std::filesystem::remove(dir / "fashion-mnist/.complete");
  ASSERT_EQ(RunCommand(cmd, &out), 0) << out;
  EXPECT_NE(out.find("test_lmdb (10000)"), std::string::npos) << out;
}

}  // namespace
}  // namespace downpour::data
