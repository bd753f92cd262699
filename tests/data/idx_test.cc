// idx_test.cc — IDX reader: raw and gzipped round trips, bad magic, truncation, the real
// Fashion-MNIST test set when it is installed.
#include "data/idx.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "downpour_config.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using namespace testing;  // tests/data/test_util.h: temporary directories, IDX files

std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + 11) & 0xff);
  return v;
}

TEST(Idx, ReadsRawAndGzippedImagesAndLabels) {
  TempDir dir;
  const auto pixels = Ramp(5 * 4 * 3);
  const std::vector<uint8_t> labels = {3, 1, 4, 1, 5};
  for (bool gz : {false, true}) {
    const std::string img = dir / (gz ? "img.gz" : "img");
    const std::string lab = dir / (gz ? "lab.gz" : "lab");
    WriteBytes(img, IdxImageBytes(5, 4, 3, pixels), gz);
    WriteBytes(lab, IdxLabelBytes(labels), gz);
    IdxImages images;
    ASSERT_TRUE(ReadIdxImages(img, &images).ok());
    EXPECT_EQ(images.count, 5);
    EXPECT_EQ(images.rows, 4);
    EXPECT_EQ(images.cols, 3);
    EXPECT_EQ(images.pixels, pixels);
    std::vector<uint8_t> got;
    ASSERT_TRUE(ReadIdxLabels(lab, &got).ok());
    EXPECT_EQ(got, labels);
  }
}

TEST(Idx, MissingFileNamesThePath) {
  IdxImages images;
  const Status s = ReadIdxImages("/nonexistent/dir/train-images.gz", &images);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/dir/train-images.gz"), std::string::npos);
}

TEST(Idx, BadMagicIsCorrupt) {
  TempDir dir;
  // A label file given as images: magic 0x801 where 0x803 is expected.
  WriteBytes(dir / "lab", IdxLabelBytes({1, 2, 3}));
  IdxImages images;
  const Status s = ReadIdxImages(dir / "lab", &images);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("magic 0x00000801"), std::string::npos) << s.message();
  std::vector<uint8_t> labels;
  WriteBytes(dir / "img", IdxImageBytes(1, 2, 2, Ramp(4)));
  EXPECT_EQ(ReadIdxLabels(dir / "img", &labels).code(), StatusCode::kCorrupt);
}

TEST(Idx, TruncatedAndOversizedPayloadsAreCorrupt) {
  TempDir dir;
  auto bytes = IdxImageBytes(3, 4, 4, Ramp(3 * 16));
  bytes.resize(bytes.size() - 5);
  WriteBytes(dir / "short.gz", bytes, true);
  IdxImages images;
  Status s = ReadIdxImages(dir / "short.gz", &images);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("short.gz"), std::string::npos) << s.message();

  auto longer = IdxLabelBytes({1, 2});
  longer.push_back(9);
  WriteBytes(dir / "long", longer);
  std::vector<uint8_t> labels;
  s = ReadIdxLabels(dir / "long", &labels);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.message();
}

TEST(Idx, HeaderClaimingHugeCountsIsTruncatedNotAnAllocation) {
  TempDir dir;
  // 2^28 images of 65536 x 65536 (2^60 bytes) claimed, 16 pixels present.
  WriteBytes(dir / "huge", IdxImageBytes(1u << 28, 65536, 65536, Ramp(16)));
  IdxImages images;
  Status s = ReadIdxImages(dir / "huge", &images);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("IDX file " + (dir / "huge") +
                             ": truncated in pixels: expected "
                             "1152921504606846976 bytes, got 16"),
            std::string::npos)
      << s.message();
  std::vector<uint8_t> lab;
  testing::PutBigEndian32(&lab, 0x801);
  testing::PutBigEndian32(&lab, 1u << 28);
  lab.push_back(3);
  WriteBytes(dir / "huge_labels.gz", lab, true);
  std::vector<uint8_t> labels;
  s = ReadIdxLabels(dir / "huge_labels.gz", &labels);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated in labels: expected 268435456 bytes, got 1"), std::string::npos) << s.message();
}

TEST(Idx, ReadsInstalledFashionMnistTestSet) {
  const std::string root = DOWNPOUR_FASHION_MNIST_DIR;
  const std::string img = root + "/t10k-images-idx3-ubyte.gz";
  const std::string lab = root + "/t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(img) || !std::filesystem::exists(lab)) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed at " << root;
  }
  IdxImages images;
  ASSERT_TRUE(ReadIdxImages(img, &images).ok());
  EXPECT_EQ(images.count, 10000);
  EXPECT_EQ(images.rows, 28);
  EXPECT_EQ(images.cols, 28);
  std::vector<uint8_t> labels;
  ASSERT_TRUE(ReadIdxLabels(lab, &labels).ok());
  ASSERT_EQ(labels.size(), 10000u);
  std::array<int, 10> hist{};
  for (uint8_t l : labels) {
    ASSERT_LT(l, 10);
    ++hist[l];
  }
  for (int c : hist) EXPECT_EQ(c, 1000);  // the test set is balanced: 1000 per class
}

}  // namespace
}  // namespace downpour::data
