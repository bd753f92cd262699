// cli_test.cc — the downpour-data binary and scripts/get_fashion_mnist end to end: convert,
// inspect (with contact sheet), mean, and a bad path giving one clear error and exit 1.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/caffe.pb.h"
#include "data/image.h"
#include "data/mean_file.h"
#include "downpour_config.h"
#include "tests/data/test_util.h"
#include "tests/testing/harness.h"

namespace downpour::data {
namespace {

using namespace testing;  // tests/data/test_util.h: temporary directories, IDX files

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
  // The parent of a sharded dataset names its shards instead of "not an LMDB".
  EXPECT_EQ(RunCommand(Binary() + " inspect " + (dir / "db"), &out), 2);
  EXPECT_NE(out.find("LMDB " + (dir / "db") + ": a dataset of 2 shards (shard_0_of_2, shard_1_of_2), not one LMDB: "
                     "give one shard, e.g. " + (dir / "db/shard_0_of_2")),
            std::string::npos)
      << out;
  EXPECT_EQ(RunCommand(Binary() + " convert-idx --images " + (dir / "missing.gz") + " --labels " +
                    (dir / "lab.gz") + " --out " + (dir / "db2"), &out), 2);
  EXPECT_NE(out.find("missing.gz"), std::string::npos) << out;
}

// A dataset of n 1x3x3 IDX images converted by the binary into `db`.
void ConvertSmallIdx(const TempDir& dir, int n, const std::string& db) {
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < 9; ++p) pixels.push_back(static_cast<uint8_t>(i + p));
    labels.push_back(static_cast<uint8_t>(i % 10));
  }
  WriteBytes(dir / "many.gz", IdxImageBytes(n, 3, 3, pixels), true);
  WriteBytes(dir / "many_lab.gz", IdxLabelBytes(labels), true);
  std::string out;
  ASSERT_EQ(
      test::RunCommand(
          {Binary(), "convert-idx", "--images", dir / "many.gz", "--labels", dir / "many_lab.gz", "--out", db}, &out),
      0)
      << out;
}

TEST(DataCli, TruncatedLmdbIsOneErrorNeverASignal) {
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << Binary() << " not built";
  namespace fs = std::filesystem;
  TempDir dir;
  ConvertSmallIdx(dir, 3000, dir / "db");
  const uintmax_t full = fs::file_size(dir / "db/data.mdb");
  for (uintmax_t bytes : {uintmax_t{0}, uintmax_t{4096}, full / 2}) {
    const std::string db = dir / fmt::format("cut_{}", bytes);
    fs::create_directories(db);
    fs::copy_file(dir / "db/data.mdb", db + "/data.mdb");
    fs::resize_file(db + "/data.mdb", bytes);
    const std::string want =
        bytes == 0 ? "data.mdb is empty (0 bytes)" : fmt::format("data.mdb is {} bytes but the database needs", bytes);
    for (const char* command : {"inspect", "mean"}) {
      std::vector<std::string> argv{Binary(), command, db};
      if (std::string(command) == "mean") argv.insert(argv.end(), {"--out", dir / "m.tensor"});
      std::string out;
      // kCorrupt: a damaged dataset is a runtime failure (1), never a signal (128 + n).
      EXPECT_EQ(test::RunCommand(argv, &out), 1) << command << " " << bytes << ": " << out;
      EXPECT_NE(out.find("downpour-data: CORRUPT: LMDB " + db + ": " + want), std::string::npos) << out;
    }
  }
  EXPECT_FALSE(fs::exists(dir / "m.tensor"));
}

TEST(DataCli, MeanWritesCaffeBinaryprotoByExtension) {
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << Binary() << " not built";
  TempDir dir;
  ConvertSmallIdx(dir, 4, dir / "db");
  std::string out;
  ASSERT_EQ(test::RunCommand({Binary(), "mean", dir / "db", "--out", dir / "mean.binaryproto"}, &out), 0) << out;
  EXPECT_NE(out.find("(Caffe BlobProto)"), std::string::npos) << out;
  // Caffe's reader sees a BlobProto as compute_image_mean writes it.
  caffe::BlobProto blob;
  ASSERT_TRUE(blob.ParseFromString(test::ReadFile(dir / "mean.binaryproto")));
  EXPECT_EQ(blob.num(), 1);
  EXPECT_EQ(blob.channels(), 1);
  EXPECT_EQ(blob.height(), 3);
  EXPECT_EQ(blob.width(), 3);
  ASSERT_EQ(blob.data_size(), 9);
  EXPECT_FLOAT_EQ(blob.data(0), 1.5f);  // images i = 0..3, pixel 0 = i
  MeanImage m;
  ASSERT_TRUE(ReadMeanFile(dir / "mean.binaryproto", &m).ok());
  EXPECT_FLOAT_EQ(m.values[8], 9.5f);
}

TEST(DataCli, ConvertFolderSkipsUnreadableImagesUnlessStrict) {
  if (!std::filesystem::exists(Binary())) GTEST_SKIP() << Binary() << " not built";
  TempDir dir;
  std::filesystem::create_directories(dir / "imgs");
  Image img;
  img.c = 3;
  img.h = img.w = 4;
  img.pixels.assign(48, 100);
  ASSERT_TRUE(WritePngFile(img, dir / "imgs/a.png").ok());
  ASSERT_TRUE(WritePngFile(img, dir / "imgs/c.png").ok());
  test::WriteFile(dir / "imgs/b.png", "not a png");
  test::WriteFile(dir / "list.txt", "a.png 0\nb.png 1\nc.png 2\n");
  const std::vector<std::string> base{Binary(), "convert-folder", "--root", dir / "imgs",
                                      "--list", dir / "list.txt", "--out"};
  std::string out;
  auto argv = base;
  argv.push_back(dir / "db");
  ASSERT_EQ(test::RunCommand(argv, &out), 0) << out;
  EXPECT_NE(out.find("wrote 2 records"), std::string::npos) << out;
  EXPECT_NE(out.find("skipped 1 unreadable images:\n  " + (dir / "list.txt") + " line 2: " + (dir / "imgs/b.png")),
            std::string::npos)
      << out;
  // A negative --resize is a usage error, not silently "keep the size".
  argv = base;
  argv.insert(argv.end(), {dir / "neg", "--resize", "-5"});
  EXPECT_EQ(test::RunCommand(argv, &out), 2) << out;
  EXPECT_NE(out.find("--resize"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "neg"));
  argv = base;
  argv.insert(argv.end(), {dir / "strict", "--strict"});
  EXPECT_EQ(test::RunCommand(argv, &out), 1) << out;
  EXPECT_NE(out.find("list.txt line 2: " + (dir / "imgs/b.png")), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "strict"));
  EXPECT_FALSE(std::filesystem::exists(dir / "strict.incomplete"));
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
