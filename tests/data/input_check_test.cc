// input_check_test.cc — the records-vs-model shape check (data/input_check.h): an AlexNet run
// (configs/models/alexnet.toml, 3x227x227 input, data.crop = 227) over a 28x28 LMDB is refused
// with one error naming the LMDB and both shapes — by the function and by downpour-launch,
// before any process starts; a fitting ImageNet-shaped LMDB passes; a mean file of the wrong
// shape, a crop that leaves the wrong size and every worker's own shard are checked too.
#include "data/input_check.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/run_config.h"
#include "data/convert.h"
#include "data/mean_file.h"
#include "tests/data/test_util.h"
#include "tests/testing/harness.h"

namespace downpour::data {
namespace {

using namespace testing;  // tests/data/test_util.h: temporary directories, IDX files

// An LMDB of n Fashion-like images: 1 x 28 x 28 raw, or with `idx` options.
std::string MakeLmdb(const TempDir& dir, const std::string& name, int n, const IdxOptions& idx = {}) {
  std::vector<uint8_t> pixels(size_t(n) * 28 * 28), labels;
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  for (int i = 0; i < n; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  WriteBytes(dir / (name + ".img"), IdxImageBytes(n, 28, 28, pixels));
  WriteBytes(dir / (name + ".lab"), IdxLabelBytes(labels));
  ConvertOptions o;
  o.out = dir / name;
  ConvertReport r;
  const Status s = ConvertIdx(dir / (name + ".img"), dir / (name + ".lab"), idx, o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return o.out;
}

IdxOptions ImageNetShaped() {
  IdxOptions idx;
  idx.resize = 256;
  idx.channels = 3;
  idx.encoded = "jpg";
  return idx;
}

RunConfig AlexNetRun(const std::string& train, const std::string& test) {
  RunConfig c;
  c.model.config = test::SourcePath("configs/models/alexnet.toml");
  c.data.train = train;
  c.data.test = test;
  c.data.crop = 227;
  return c;
}

TEST(InputCheck, ModelInputAndFirstRecordShapes) {
  InputShape model;
  ASSERT_TRUE(ReadModelInputShape(test::SourcePath("configs/models/alexnet.toml"), &model).ok());
  EXPECT_EQ(model, (InputShape{3, 227, 227}));
  ASSERT_TRUE(ReadModelInputShape(test::SourcePath("configs/models/fmnist_small.toml"), &model).ok());
  EXPECT_EQ(model, (InputShape{1, 28, 28}));
  TempDir dir;
  InputShape shape;
  std::string key;
  ASSERT_TRUE(FirstRecordShape(MakeLmdb(dir, "jpg", 2, ImageNetShaped()), &shape, &key).ok());
  EXPECT_EQ(shape.ToString(), "3x256x256");
  EXPECT_EQ(key, "00000000_0");
  const Status missing = ReadModelInputShape(dir / "nope.toml", &model);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("nope.toml"), std::string::npos) << missing.message();
}

TEST(InputCheck, AlexNetOver28x28LmdbIsRefusedNamingTheLmdbAndBothShapes) {
  TempDir dir;
  const std::string small = MakeLmdb(dir, "small28", 3);
  const std::string big = MakeLmdb(dir, "big", 2, ImageNetShaped());
  // The train LMDB is the wrong one.
  Status s = CheckRunDataFitsModel(AlexNetRun(small, big));
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const std::string& want : {std::string("data.train = ") + small, std::string("1x28x28"),
                                  std::string("3x227x227"), std::string("alexnet.toml")}) {
    EXPECT_NE(s.message().find(want), std::string::npos) << "missing '" << want << "' in: " << s.message();
  }
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
  // The test LMDB is the wrong one.
  s = CheckRunDataFitsModel(AlexNetRun(big, small));
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data.test = " + small), std::string::npos) << s.message();
  // Both fit: 3x256x256 records cropped to 227 are AlexNet's input.
  s = CheckRunDataFitsModel(AlexNetRun(big, big));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(InputCheck, CropAndChannelsMustGiveTheModelsInput) {
  TempDir dir;
  const std::string big = MakeLmdb(dir, "big", 2, ImageNetShaped());
  RunConfig c = AlexNetRun(big, "");
  c.data.crop = 0;  // 256 is not 227
  Status s = CheckRunDataFitsModel(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3x256x256 (no data.crop)"), std::string::npos) << s.message();
  c.data.crop = 224;
  s = CheckRunDataFitsModel(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3x224x224 after data.crop = 224"), std::string::npos) << s.message();
  // Grey 256x256 records: the crop fits, the channels do not.
  IdxOptions grey;
  grey.resize = 256;
  c = AlexNetRun(MakeLmdb(dir, "grey", 2, grey), "");
  s = CheckRunDataFitsModel(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1x256x256"), std::string::npos) << s.message();
  // The small net over 28x28 records, no crop: fits.
  RunConfig small;
  small.model.config = test::SourcePath("configs/models/fmnist_small.toml");
  small.data.train = small.data.test = MakeLmdb(dir, "small28", 2);
  s = CheckRunDataFitsModel(small);
  EXPECT_TRUE(s.ok()) << s.message();
  // An IDX file as data.train is not an LMDB: left to the IDX source.
  small.data.train = dir / "small28.img";
  s = CheckRunDataFitsModel(small);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(InputCheck, MeanFileAndOwnShardsAreChecked) {
  TempDir dir;
  const std::string big = MakeLmdb(dir, "big", 2, ImageNetShaped());
  RunConfig c = AlexNetRun(big, big);
  MeanImage mean;
  mean.c = 1, mean.h = 28, mean.w = 28;
  mean.values.assign(28 * 28, 100.0f);
  c.data.mean_file = dir / "mean28.tensor";
  ASSERT_TRUE(WriteMeanFile(mean, c.data.mean_file).ok());
  Status s = CheckRunDataFitsModel(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mean28.tensor"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1x28x28"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("3x256x256"), std::string::npos) << s.message();
  // sharding = "own": worker 1's shard is the 28x28 one.
  std::filesystem::create_directories(dir / "own");
  std::filesystem::rename(MakeLmdb(dir, "w0", 2, ImageNetShaped()), dir / "own/shard_0_of_2");
  std::filesystem::rename(MakeLmdb(dir, "w1", 2), dir / "own/shard_1_of_2");
  c = AlexNetRun(dir / "own", "");
  c.data.sharding = DataSharding::kOwn;
  c.cluster.workers = 2;
  s = CheckRunDataFitsModel(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("shard_1_of_2"), std::string::npos) << s.message();
}

// downpour-launch refuses the run with one line naming the LMDB path and both shapes, exit 2,
// before it starts any process or makes the run directory.
TEST(InputCheck, LauncherRefusesBeforeAnythingStarts) {
  const std::string launch = test::Binary("downpour-launch");
  ASSERT_TRUE(std::filesystem::exists(launch)) << launch << " not built (the test depends on it in CMake)";
  TempDir dir;
  const std::string small = MakeLmdb(dir, "small28", 3);
  test::WriteFile(dir.path() / "run.toml",
                  "[model]\nconfig = \"" + test::SourcePath("configs/models/alexnet.toml") +
                      "\"\n[cluster]\nservers = 2\nworkers = 2\n[data]\ntrain = \"" + small + "\"\ntest = \"" +
                      small + "\"\ncrop = 227\nmirror = true\nscale = 1.0\n");
  const std::string run_dir = dir / "run";
  std::string out;
  const int rc = test::RunShell(launch + " --config " + (dir / "run.toml") + " -o " + run_dir + " 2>&1", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("data.train = " + small), std::string::npos) << out;
  EXPECT_NE(out.find("1x28x28"), std::string::npos) << out;
  EXPECT_NE(out.find("3x227x227"), std::string::npos) << out;
  EXPECT_EQ(out.find("[launch] run"), std::string::npos) << "nothing may start: " << out;
  EXPECT_FALSE(std::filesystem::exists(run_dir)) << out;
}

}  // namespace
}  // namespace downpour::data
