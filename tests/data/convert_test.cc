// convert_test.cc — every converter round-trips small inputs the test makes itself (IDX raw
// and gzipped, CIFAR-10 binary, an image folder raw / resized / JPEG / PNG, N shards,
// shuffle); inspect and mean agree with the data; bad inputs give errors naming the file.
#include "data/convert.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/tensor_file.h"
#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/mean_file.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using testing::IdxImageBytes;
using testing::IdxLabelBytes;
using testing::TempDir;
using testing::WriteBytes;

struct Record {
  std::string key;
  caffe::Datum datum;
};

std::vector<Record> ReadAll(const std::string& path) {
  std::vector<Record> out;
  std::unique_ptr<LmdbEnv> env;
  EXPECT_TRUE(LmdbEnv::OpenReadOnly(path, &env).ok()) << path;
  if (!env) return out;
  std::unique_ptr<ReadTxn> txn;
  EXPECT_TRUE(ReadTxn::Begin(env.get(), &txn).ok());
  bool found = false;
  EXPECT_TRUE(txn->First(&found).ok());
  while (found) {
    Record r;
    r.key = std::string(txn->key());
    EXPECT_TRUE(ParseDatum(txn->value(), r.key, &r.datum).ok()) << r.key;
    out.push_back(std::move(r));
    EXPECT_TRUE(txn->Next(&found).ok());
  }
  return out;
}

// Synthetic 8-bit image n with a distinct pattern.
std::vector<uint8_t> Pattern(size_t bytes, int n) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>((i * 13 + n * 29) & 0xff);
  return v;
}

TEST(ConvertIdx, RoundTripsRawAndGzippedIntoShards) {
  TempDir dir;
  const int n = 11, rows = 5, cols = 4;
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    auto p = Pattern(rows * cols, i);
    pixels.insert(pixels.end(), p.begin(), p.end());
    labels.push_back(static_cast<uint8_t>(i % 10));
  }
  for (bool gz : {false, true}) {
    WriteBytes(dir / "img", IdxImageBytes(n, rows, cols, pixels), gz);
    WriteBytes(dir / "lab", IdxLabelBytes(labels), gz);
    for (int shards : {1, 3}) {
      ConvertOptions o;
      o.out = dir / fmt::format("out_{}_{}", gz, shards);
      o.shards = shards;
      ConvertReport r;
      ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", o, &r).ok());
      EXPECT_EQ(r.records, n);
      ASSERT_EQ(static_cast<int>(r.lmdbs.size()), shards);
      int total = 0;
      for (int s = 0; s < shards; ++s) {
        const auto recs = ReadAll(r.lmdbs[s]);
        for (size_t k = 0; k < recs.size(); ++k) {
          const int i = s + shards * static_cast<int>(k);  // round robin, key order kept
          EXPECT_EQ(recs[k].key, fmt::format("{:08d}_{}", i, i));
          const auto& d = recs[k].datum;
          EXPECT_EQ(d.channels(), 1);
          EXPECT_EQ(d.height(), rows);
          EXPECT_EQ(d.width(), cols);
          EXPECT_EQ(d.label(), labels[i]);
          EXPECT_EQ(d.data(), std::string(pixels.begin() + i * rows * cols,
                                          pixels.begin() + (i + 1) * rows * cols));
          ++total;
        }
      }
      EXPECT_EQ(total, n);
    }
  }
}

TEST(ConvertIdx, ShuffleIsASeededPermutation) {
  TempDir dir;
  const int n = 50;
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    pixels.push_back(static_cast<uint8_t>(i));
    labels.push_back(static_cast<uint8_t>(i));
  }
  WriteBytes(dir / "img", IdxImageBytes(n, 1, 1, pixels));
  WriteBytes(dir / "lab", IdxLabelBytes(labels));
  auto order = [&](const std::string& name, uint64_t seed) {
    ConvertOptions o;
    o.out = dir / name;
    o.shuffle = true;
    o.seed = seed;
    ConvertReport r;
    EXPECT_TRUE(ConvertIdx(dir / "img", dir / "lab", o, &r).ok());
    std::vector<int> labels_in_order;
    for (const auto& rec : ReadAll(o.out)) {
      EXPECT_EQ(static_cast<uint8_t>(rec.datum.data()[0]), rec.datum.label());
      labels_in_order.push_back(rec.datum.label());
    }
    return labels_in_order;
  };
  const auto a = order("a", 7), b = order("b", 7), c = order("c", 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::set<int> seen(a.begin(), a.end());
  EXPECT_EQ(seen.size(), size_t(n));
  std::vector<int> identity(n);
  for (int i = 0; i < n; ++i) identity[i] = i;
  EXPECT_NE(a, identity);
}

TEST(ConvertIdx, MismatchedCountsAndExistingOutputAreRefused) {
  TempDir dir;
  WriteBytes(dir / "img", IdxImageBytes(3, 2, 2, Pattern(12, 0)));
  WriteBytes(dir / "lab", IdxLabelBytes({1, 2}));
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  Status s = ConvertIdx(dir / "img", dir / "lab", o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3 images"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2 labels"), std::string::npos) << s.message();
  WriteBytes(dir / "lab", IdxLabelBytes({1, 2, 3}));
  ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", o, &r).ok());
  s = ConvertIdx(dir / "img", dir / "lab", o, &r);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(o.out), std::string::npos) << s.message();
}

TEST(ConvertCifar, RoundTripsBatchesAndRejectsBadSizes) {
  TempDir dir;
  std::vector<std::string> files;
  std::vector<std::vector<uint8_t>> images;
  for (int f = 0; f < 2; ++f) {
    std::vector<uint8_t> bytes;
    for (int k = 0; k < 3; ++k) {
      const int i = f * 3 + k;
      bytes.push_back(static_cast<uint8_t>(i % 10));
      images.push_back(Pattern(3072, i));
      bytes.insert(bytes.end(), images.back().begin(), images.back().end());
    }
    files.push_back(dir / fmt::format("data_batch_{}.bin", f + 1));
    WriteBytes(files.back(), bytes);
  }
  ConvertOptions o;
  o.out = dir / "cifar";
  ConvertReport r;
  ASSERT_TRUE(ConvertCifar(files, o, &r).ok());
  EXPECT_EQ(r.records, 6);
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(recs.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(recs[i].key, fmt::format("{:08d}_data_batch_{}_{}", i, i / 3 + 1, i % 3));
    EXPECT_EQ(recs[i].datum.channels(), 3);
    EXPECT_EQ(recs[i].datum.height(), 32);
    EXPECT_EQ(recs[i].datum.width(), 32);
    EXPECT_EQ(recs[i].datum.label(), i % 10);
    EXPECT_EQ(recs[i].datum.data(), std::string(images[i].begin(), images[i].end()));
  }
  WriteBytes(dir / "bad.bin", std::vector<uint8_t>(3073 + 5, 1));
  o.out = dir / "cifar2";
  const Status s = ConvertCifar({dir / "bad.bin"}, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.bin"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("3078"), std::string::npos) << s.message();
}

// Writes images i = 0..n-1 (size h x w, smooth BGR pattern) as PNG or JPEG files plus a list.
struct Folder {
  std::vector<Image> images;
  std::string list;
};
Folder MakeFolder(const TempDir& dir, int n, int h, int w, bool jpeg) {
  Folder f;
  std::filesystem::create_directories(dir.path() / "imgs" / "sub dir");
  std::ofstream list(dir / "list.txt");
  for (int i = 0; i < n; ++i) {
    Image img;
    img.c = 3;
    img.h = h;
    img.w = w;
    img.layout = Layout::kHwc;
    img.pixels.resize(size_t(3) * h * w);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c)
          img.pixels[(size_t(y) * w + x) * 3 + c] = static_cast<uint8_t>(20 + 30 * c + 3 * y + 2 * x + 5 * i);
    std::string bytes;
    EXPECT_TRUE((jpeg ? EncodeJpeg(img, 95, &bytes) : EncodePng(img, &bytes)).ok());
    const std::string rel = fmt::format("sub dir/img {}.{}", i, jpeg ? "jpg" : "png");
    std::ofstream(dir / ("imgs/" + rel), std::ios::binary) << bytes;
    list << rel << " " << (i % 4) << "\n";
    f.images.push_back(img);
  }
  f.list = dir / "list.txt";
  return f;
}

TEST(ConvertFolder, RawPngRoundTripIsExact) {
  TempDir dir;
  const Folder f = MakeFolder(dir, 5, 9, 7, /*jpeg=*/false);
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = f.list;
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  ASSERT_TRUE(ConvertFolder(fo, o, &r).ok());
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(recs.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(recs[i].key, fmt::format("{:08d}_sub dir/img {}.png", i, i));
    EXPECT_EQ(recs[i].datum.label(), i % 4);
    const Image chw = ToLayout(f.images[i], Layout::kChw);  // Caffe's raw layout: planar BGR
    EXPECT_EQ(recs[i].datum.data(), std::string(chw.pixels.begin(), chw.pixels.end()));
  }
}

TEST(ConvertFolder, ResizeEncodeShuffleAndShards) {
  TempDir dir;
  const Folder f = MakeFolder(dir, 6, 20, 30, /*jpeg=*/true);
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = f.list;
  fo.resize_h = fo.resize_w = 16;
  for (const std::string enc : {"", "jpg", "png"}) {
    fo.encoded = enc;
    ConvertOptions o;
    o.out = dir / ("out" + enc);
    o.shards = 2;
    o.shuffle = true;
    ConvertReport r;
    ASSERT_TRUE(ConvertFolder(fo, o, &r).ok());
    std::set<int> seen;
    for (const auto& path : r.lmdbs) {
      for (const auto& rec : ReadAll(path)) {
        EXPECT_EQ(rec.datum.encoded(), !enc.empty());
        Image scratch;
        ImageView v;
        ASSERT_TRUE(ViewDatum(rec.datum, 0, rec.key, &scratch, &v).ok());
        EXPECT_EQ(v.c, 3);
        EXPECT_EQ(v.h, 16);
        EXPECT_EQ(v.w, 16);
        // The key names the file; its pattern offset 5*i shows in the top-left pixel.
        const int i = std::stoi(rec.key.substr(rec.key.find("img ") + 4));
        seen.insert(i);
        EXPECT_EQ(rec.datum.label(), i % 4);
        const Image got = ViewToImage(v);
        EXPECT_NEAR(got.At(0, 0, 0), 20 + 5 * i, 8) << rec.key;
        EXPECT_NEAR(got.At(2, 0, 0), 80 + 5 * i, 8) << rec.key;
      }
    }
    EXPECT_EQ(seen.size(), 6u);
  }
}

TEST(ConvertFolder, MissingFileAndCorruptImageNameTheFile) {
  TempDir dir;
  MakeFolder(dir, 2, 8, 8, /*jpeg=*/true);
  {
    std::ofstream list(dir / "list.txt", std::ios::app);
    list << "sub dir/ghost.jpg 1\n";
  }
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = dir / "list.txt";
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  Status s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("ghost.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("line 3"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out)) << "nothing is written before the list checks out";

  // A JPEG cut in half: the decoder's error names the file.
  std::string bytes;
  ASSERT_TRUE(ReadFileBytes(dir / "imgs/sub dir/img 1.jpg", &bytes).ok());
  std::ofstream(dir / "imgs/sub dir/ghost.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("ghost.jpg"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out)) << "a failed conversion leaves no dataset behind";

  std::ofstream(dir / "bad_list.txt") << "sub dir/img 0.jpg notalabel\n";
  fo.list = dir / "bad_list.txt";
  o.out = dir / "out2";
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad_list.txt line 1"), std::string::npos) << s.message();
}

TEST(InspectAndMean, AgreeWithTheData) {
  TempDir dir;
  const int n = 6;
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < 4; ++p) pixels.push_back(static_cast<uint8_t>(10 * i + p));
    labels.push_back(static_cast<uint8_t>(i % 2));
  }
  WriteBytes(dir / "img", IdxImageBytes(n, 2, 2, pixels));
  WriteBytes(dir / "lab", IdxLabelBytes(labels));
  ConvertOptions o;
  o.out = dir / "db";
  ConvertReport r;
  ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", o, &r).ok());
  InspectReport ir;
  ASSERT_TRUE(InspectLmdb(o.out, dir / "sheet.png", 4, &ir).ok());
  EXPECT_EQ(ir.records, n);
  EXPECT_EQ(ir.bad, 0);
  EXPECT_EQ(ir.shapes, (std::map<std::string, int64_t>{{"1x2x2", n}}));
  EXPECT_EQ(ir.label_counts, (std::map<int, int64_t>{{0, 3}, {1, 3}}));
  std::string png;
  ASSERT_TRUE(ReadFileBytes(dir / "sheet.png", &png).ok());
  Image sheet;
  ASSERT_TRUE(DecodePng(png, 0, "sheet", &sheet).ok());
  EXPECT_EQ(sheet.w, 4 * (2 + 2) + 2);  // 4 cells of 2 px plus 2 px gaps
  EXPECT_EQ(sheet.h, 1 * (2 + 2) + 2);
  EXPECT_EQ(sheet.At(0, 2, 2 + 4 * 3 + 1), 31);  // image 3, pixel (0, 1)

  MeanImage m;
  ASSERT_TRUE(ComputeMean(o.out, &m).ok());
  ASSERT_EQ(m.values.size(), 4u);
  for (int p = 0; p < 4; ++p) EXPECT_FLOAT_EQ(m.values[p], 25.0f + p);  // mean of 10*i + p
  ASSERT_TRUE(WriteMeanFile(m, dir / "mean.tensor").ok());
  MeanImage back;
  ASSERT_TRUE(ReadMeanFile(dir / "mean.tensor", &back).ok());
  EXPECT_EQ(back.values, m.values);
  EXPECT_EQ(back.c, 1);
  EXPECT_EQ(back.records, n);
  EXPECT_EQ(back.source, o.out);
  // A tensor file that is not a mean image (e.g. weights) is refused, naming the kind.
  TensorFile weights;
  weights.meta["kind"] = "weights";
  weights.tensors.push_back(NamedTensor{"mean", {1, 2, 2}, {1, 2, 3, 4}});
  ASSERT_TRUE(WriteTensorFile(dir / "weights.tensor", weights).ok());
  const Status not_mean = ReadMeanFile(dir / "weights.tensor", &back);
  EXPECT_EQ(not_mean.code(), StatusCode::kCorrupt);
  EXPECT_NE(not_mean.message().find("kind is 'weights'"), std::string::npos) << not_mean.message();
  WriteBytes(dir / "junk.tensor", std::vector<uint8_t>(40, 7));
  const Status s = ReadMeanFile(dir / "junk.tensor", &back);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("junk.tensor"), std::string::npos);
}

}  // namespace
}  // namespace downpour::data
