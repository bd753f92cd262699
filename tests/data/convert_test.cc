// convert_test.cc — every converter round-trips small inputs the test makes itself (IDX raw
// and gzipped, CIFAR-10 binary, an image folder raw / resized / JPEG / PNG, N shards,
// shuffle); inspect and mean agree with the data; bad inputs give errors naming the file.
#include "data/convert.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/tensor_file.h"
#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/loader.h"
#include "data/mean_file.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using namespace testing;  // tests/data/test_util.h: temporary directories, IDX files

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

// Writes n IDX images of rows x cols with Pattern(i) and labels (i * 3) % 10 into dir.
void WriteIdxPair(const TempDir& dir, int n, int rows, int cols, std::vector<uint8_t>* pixels,
                  std::vector<uint8_t>* labels) {
  pixels->clear();
  labels->clear();
  for (int i = 0; i < n; ++i) {
    auto p = Pattern(size_t(rows) * cols, i);
    pixels->insert(pixels->end(), p.begin(), p.end());
    labels->push_back(static_cast<uint8_t>((i * 3) % 10));
  }
  WriteBytes(dir / "img", IdxImageBytes(n, rows, cols, *pixels), true);
  WriteBytes(dir / "lab", IdxLabelBytes(*labels), true);
}

// The ImageNet-shaped variant: --resize 256 --channels 3 gives 3 x 256 x 256 raw records whose
// three planes are the bilinear resize of the grey image, with the label kept.
TEST(ConvertIdx, ResizeAndThreeChannelsReplicateTheResizedGreyPlane) {
  TempDir dir;
  const int n = 4, rows = 28, cols = 28, side = 256;
  std::vector<uint8_t> pixels, labels;
  WriteIdxPair(dir, n, rows, cols, &pixels, &labels);
  IdxOptions idx;
  idx.resize = side;
  idx.channels = 3;
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", idx, o, &r).ok());
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(static_cast<int>(recs.size()), n);
  for (int i = 0; i < n; ++i) {
    const caffe::Datum& d = recs[i].datum;
    ASSERT_EQ(d.channels(), 3);
    ASSERT_EQ(d.height(), side);
    ASSERT_EQ(d.width(), side);
    EXPECT_FALSE(d.encoded());
    EXPECT_EQ(d.label(), labels[i]);
    Image grey{1, rows, cols, Layout::kChw, {}};
    grey.pixels.assign(pixels.begin() + i * rows * cols, pixels.begin() + (i + 1) * rows * cols);
    const Image want = ResizeBilinear(grey, side, side);
    const std::string& data = d.data();
    ASSERT_EQ(data.size(), size_t(3) * side * side);
    for (int ch = 0; ch < 3; ++ch) {
      ASSERT_EQ(0, std::memcmp(data.data() + size_t(ch) * side * side, want.pixels.data(), want.pixels.size()))
          << "record " << i << " channel " << ch;
    }
  }
  // Without options the records stay 1 x rows x cols, bytes as stored.
  ConvertOptions plain;
  plain.out = dir / "plain";
  ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", plain, &r).ok());
  const auto raw = ReadAll(plain.out);
  ASSERT_EQ(static_cast<int>(raw.size()), n);
  EXPECT_EQ(raw[1].datum.channels(), 1);
  EXPECT_EQ(raw[1].datum.data(), std::string(pixels.begin() + rows * cols, pixels.begin() + 2 * rows * cols));
}

// JPEG records (what scripts/get_fashion_mnist --alexnet writes) decode to 3 x 256 x 256 with
// equal planes, their headers say so, labels are kept, and --limit takes the first images.
TEST(ConvertIdx, JpegRecordsDecodeToReplicatedChannelsAndLimitCounts) {
  TempDir dir;
  const int n = 6, rows = 28, cols = 28, side = 256;
  std::vector<uint8_t> pixels, labels;
  WriteIdxPair(dir, n, rows, cols, &pixels, &labels);
  IdxOptions idx;
  idx.resize = side;
  idx.channels = 3;
  idx.encoded = "jpg";
  idx.limit = 4;
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  ASSERT_TRUE(ConvertIdx(dir / "img", dir / "lab", idx, o, &r).ok());
  EXPECT_EQ(r.records, 4);
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(recs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const caffe::Datum& d = recs[i].datum;
    EXPECT_TRUE(d.encoded());
    EXPECT_EQ(d.label(), labels[i]);
    EXPECT_EQ(recs[i].key, fmt::format("{:08d}_{}", i, i));
    Image img;
    ASSERT_TRUE(DecodeImage(d.data(), 0, recs[i].key, &img).ok());
    ASSERT_EQ(img.c, 3);
    ASSERT_EQ(img.h, side);
    ASSERT_EQ(img.w, side);
    EXPECT_EQ(d.channels(), 3);
    EXPECT_EQ(d.height(), side);
    int worst = 0;  // B, G and R of a grey JPEG differ by rounding at most
    for (int y = 0; y < side; ++y)
      for (int x = 0; x < side; ++x) {
        worst = std::max(worst, std::abs(img.At(0, y, x) - img.At(1, y, x)));
        worst = std::max(worst, std::abs(img.At(2, y, x) - img.At(1, y, x)));
      }
    EXPECT_LE(worst, 2) << recs[i].key;
  }
  InspectReport ir;
  ASSERT_TRUE(InspectLmdb(o.out, "", 0, &ir).ok());
  EXPECT_EQ(ir.bad, 0);
  EXPECT_EQ(ir.encoded, 4);
  EXPECT_EQ(ir.shapes["3x256x256"], 4);
}

TEST(ConvertIdx, BadShapeOptionsAreRefusedNamingTheFlagAndWriteNothing) {
  TempDir dir;
  std::vector<uint8_t> pixels, labels;
  WriteIdxPair(dir, 2, 5, 4, &pixels, &labels);
  struct Case {
    IdxOptions idx;
    std::string flag;
  };
  std::vector<Case> cases(6);
  cases[0].idx.resize = -1, cases[0].flag = "--resize is -1";
  cases[1].idx.resize = 5000, cases[1].flag = "--resize is 5000";
  cases[2].idx.channels = 2, cases[2].flag = "--channels is 2";
  cases[3].idx.encoded = "gif", cases[3].flag = "--encoded is 'gif'";
  cases[4].idx.encoded = "jpg", cases[4].idx.jpeg_quality = 0, cases[4].flag = "--quality is 0";
  cases[5].idx.limit = -3, cases[5].flag = "--limit is -3";
  for (const Case& c : cases) {
    ConvertOptions o;
    o.out = dir / "out";
    ConvertReport r;
    const Status s = ConvertIdx(dir / "img", dir / "lab", c.idx, o, &r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(s.message().find(c.flag), std::string::npos) << s.message();
    EXPECT_FALSE(std::filesystem::exists(o.out)) << c.flag;
    EXPECT_FALSE(std::filesystem::exists(o.out + ".incomplete")) << c.flag;
  }
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
  // A directory given as a batch file is named as one (it used to be read as a file of
  // "size" 2^63, an out-of-memory abort).
  std::filesystem::create_directories(dir / "a_dir");
  Status d = ConvertCifar({dir / "a_dir"}, o, &r);
  EXPECT_EQ(d.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.message().find(dir / "a_dir" + ": is a directory, not a file"), std::string::npos) << d.message();
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
  // Without --strict a listed file that is missing is skipped, naming it, as convert_imageset does.
  Status s = ConvertFolder(fo, o, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.records, 2);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("list.txt line 3: "), std::string::npos) << r.skipped[0];
  EXPECT_NE(r.skipped[0].find("ghost.jpg"), std::string::npos) << r.skipped[0];

  // --strict: the missing file fails the conversion before anything is written.
  fo.strict = true;
  o.out = dir / "out_strict";
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("ghost.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("line 3"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out)) << "nothing is written before the list checks out";
  fo.strict = false;
  o.out = dir / "out_cut";

  // A JPEG cut in half, --strict: the decoder's error names the file and the list line, and
  // the records already written are removed with their staging directory.
  std::string bytes;
  ASSERT_TRUE(ReadFileBytes(dir / "imgs/sub dir/img 1.jpg", &bytes).ok());
  std::ofstream(dir / "imgs/sub dir/ghost.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  fo.strict = true;
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("list.txt line 3: " + (dir / "imgs/sub dir/ghost.jpg")), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out)) << "a failed conversion leaves no dataset behind";
  EXPECT_FALSE(std::filesystem::exists(o.out + ".incomplete")) << "nor its staging directory";
  fo.strict = false;

  std::ofstream(dir / "bad_list.txt") << "sub dir/img 0.jpg notalabel\n";
  fo.list = dir / "bad_list.txt";
  o.out = dir / "out2";
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad_list.txt line 1"), std::string::npos) << s.message();
}

// A CMYK JPEG (TurboJPEG writes CMYK input as an Adobe YCCK JPEG), 16x12: the left half
// C,M,Y,K = 200,100,50,255, the right half 255,255,255,128. In Adobe's inverted convention
// (255 = no ink) that is R,G,B = 200,100,50 and 128,128,128.
std::string CmykJpeg() {
  const int w = 16, h = 12;
  std::vector<uint8_t> cmyk(size_t(4) * w * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &cmyk[(size_t(y) * w + x) * 4];
      const bool left = x < w / 2;
      p[0] = left ? 200 : 255;
      p[1] = left ? 100 : 255;
      p[2] = left ? 50 : 255;
      p[3] = left ? 255 : 128;
    }
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, cmyk.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_444, 100, 0);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::string out(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

TEST(Image, CmykJpegDecodesToBgrWithAdobesInvertedConvention) {
  const std::string jpeg = CmykJpeg();
  tjhandle tj = tjInitDecompress();
  int w = 0, h = 0, subsamp = 0, colorspace = -1;
  ASSERT_EQ(tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size(), &w, &h, &subsamp,
                                &colorspace),
            0);
  tjDestroy(tj);
  EXPECT_EQ(colorspace, TJCS_YCCK) << "the test image is a CMYK-family JPEG";
  Image img;
  const Status s = DecodeJpeg(jpeg, 0, "cmyk.jpg", &img);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(img.c, 3);
  ASSERT_EQ(img.h, 12);
  ASSERT_EQ(img.w, 16);
  int channels = 0;
  ASSERT_TRUE(EncodedChannels(jpeg, "cmyk.jpg", &channels).ok());
  EXPECT_EQ(channels, 3);
  for (int y = 0; y < 12; ++y) {
    // BGR; away from the edge between the halves, where the DCT rings.
    EXPECT_NEAR(img.At(0, y, 2), 50, 3) << y;
    EXPECT_NEAR(img.At(1, y, 2), 100, 3) << y;
    EXPECT_NEAR(img.At(2, y, 2), 200, 3) << y;
    for (int ch = 0; ch < 3; ++ch) EXPECT_NEAR(img.At(ch, y, 13), 128, 3) << y;
  }
  Image grey;
  ASSERT_TRUE(DecodeJpeg(jpeg, 1, "cmyk.jpg", &grey).ok());
  ASSERT_EQ(grey.c, 1);
  EXPECT_NEAR(grey.At(0, 5, 2), 0.299 * 200 + 0.587 * 100 + 0.114 * 50, 3);
  EXPECT_NEAR(grey.At(0, 5, 13), 128, 3);
}

// A folder of the usual smooth JPEGs plus `extra` files (name -> bytes) appended to the list.
Folder MakeFolderWith(const TempDir& dir, int n, const std::vector<std::pair<std::string, std::string>>& extra) {
  Folder f = MakeFolder(dir, n, 8, 8, /*jpeg=*/true);
  std::ofstream list(f.list, std::ios::app);
  for (const auto& [name, bytes] : extra) {
    std::ofstream(dir / ("imgs/" + name), std::ios::binary) << bytes;
    list << name << " 7\n";
  }
  return f;
}

TEST(ConvertFolder, CmykJpegIsConvertedNotFatal) {
  TempDir dir;
  const Folder f = MakeFolderWith(dir, 2, {{"cmyk.jpg", CmykJpeg()}});
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = f.list;
  fo.strict = true;  // the CMYK file must convert, not be skipped
  ConvertOptions o;
  o.out = dir / "out";
  ConvertReport r;
  const Status s = ConvertFolder(fo, o, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.records, 3);
  EXPECT_TRUE(r.skipped.empty());
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[2].key, "00000002_cmyk.jpg");
  EXPECT_EQ(recs[2].datum.channels(), 3);
  EXPECT_EQ(recs[2].datum.label(), 7);
  Image scratch;
  ImageView v;
  ASSERT_TRUE(ViewDatum(recs[2].datum, 0, recs[2].key, &scratch, &v).ok());
  const Image got = ViewToImage(v);
  EXPECT_NEAR(got.At(2, 6, 1), 200, 3);  // R of the left half
  EXPECT_NEAR(got.At(0, 6, 1), 50, 3);   // B
}

TEST(ConvertFolder, UndecodableImagesAreSkippedNamedAndCounted) {
  TempDir dir;
  std::string good;
  {
    Image img;
    img.c = 3;
    img.h = img.w = 8;
    img.pixels.assign(3 * 8 * 8, 90);
    ASSERT_TRUE(EncodeJpeg(img, 90, &good).ok());
  }
  // Lines 1..3 good JPEGs, 4 a text file named .jpg, 5 a JPEG cut short, 6 an empty file.
  const Folder f = MakeFolderWith(
      dir, 3,
      {{"notes.jpg", "this is not an image\n"}, {"cut.jpg", good.substr(0, good.size() / 3)}, {"empty.png", ""}});
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = f.list;
  ConvertOptions o;
  o.out = dir / "out";
  o.shards = 2;
  ConvertReport r;
  const Status s = ConvertFolder(fo, o, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.records, 3);
  ASSERT_EQ(r.skipped.size(), 3u);
  const std::vector<std::pair<int, std::string>> want = {
      {4, "notes.jpg: encoded image is neither JPEG nor PNG"},
      {5, "cut.jpg: "},
      {6, "empty.png: encoded image is neither JPEG nor PNG (0 bytes)"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NE(r.skipped[i].find(fmt::format("list.txt line {}: {}", want[i].first, dir / "imgs/")), std::string::npos)
        << r.skipped[i];
    EXPECT_NE(r.skipped[i].find(want[i].second), std::string::npos) << r.skipped[i];
  }
  EXPECT_EQ(r.label_counts, (std::map<int, int64_t>{{0, 1}, {1, 1}, {2, 1}}));
  // Keys stay dense and dealt round robin over the written records.
  EXPECT_EQ(ReadAll(r.lmdbs[0]).size(), 2u);
  EXPECT_EQ(ReadAll(r.lmdbs[1]).size(), 1u);
  EXPECT_EQ(ReadAll(r.lmdbs[1])[0].key, "00000001_sub dir/img 1.jpg");

  // --strict: the first one fails the conversion, naming file and line; nothing is left.
  fo.strict = true;
  o.out = dir / "strict";
  const Status strict = ConvertFolder(fo, o, &r);
  EXPECT_EQ(strict.code(), StatusCode::kCorrupt);
  EXPECT_NE(strict.message().find("list.txt line 4: " + (dir / "imgs/notes.jpg")), std::string::npos)
      << strict.message();
  EXPECT_FALSE(std::filesystem::exists(o.out));
  EXPECT_FALSE(std::filesystem::exists(o.out + ".incomplete"));
}

TEST(ConvertFolder, FailedConversionsLeaveNoIncompleteDirectory) {
  TempDir dir;
  // Every image unreadable: an error after the writer opened.
  std::filesystem::create_directories(dir / "imgs");
  std::ofstream(dir / "imgs/a.jpg") << "junk";
  std::ofstream(dir / "imgs/b.jpg") << "junk";
  std::ofstream(dir / "list.txt") << "a.jpg 0\nb.jpg 1\n";
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = dir / "list.txt";
  ConvertOptions o;
  o.out = dir / "out";
  o.shards = 3;
  ConvertReport r;
  Status s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("none of the 2 images of " + (dir / "list.txt") + " could be read"), std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out));
  EXPECT_FALSE(std::filesystem::exists(o.out + ".incomplete"));

  // An output that cannot be created (its parent is a file): no output, no staging.
  std::ofstream(dir / "plain_file") << "x";
  o.out = dir / "plain_file/out";
  s = ConvertFolder(fo, o, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir / "plain_file/out"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir / "plain_file/out.incomplete"));
}

TEST(ConvertFolder, ListLinesAreCheckedBeforeWriting) {
  TempDir dir;
  MakeFolder(dir, 2, 8, 8, /*jpeg=*/true);
  FolderOptions fo;
  fo.root = dir / "imgs";
  ConvertOptions o;
  ConvertReport r;
  // Trailing blanks and CRLF line ends are fine.
  std::ofstream(dir / "crlf.txt") << "sub dir/img 0.jpg 3  \r\nsub dir/img 1.jpg\t2\r\n";
  fo.list = dir / "crlf.txt";
  o.out = dir / "out";
  ASSERT_TRUE(ConvertFolder(fo, o, &r).ok());
  EXPECT_EQ(r.label_counts, (std::map<int, int64_t>{{2, 1}, {3, 1}}));
  fo.jpeg_quality = 0;
  o.out = dir / "out_q";
  EXPECT_NE(ConvertFolder(fo, o, &r).message().find("--quality is 0, must be in [1, 100]"), std::string::npos);
  fo.jpeg_quality = 90;
  // A directory given as the list is named as one (it used to be "label list ... is empty").
  fo.list = dir / "imgs";
  o.out = dir / "out_dir";
  EXPECT_NE(ConvertFolder(fo, o, &r).message().find("label list " + (dir / "imgs") + " is a directory"),
            std::string::npos);
  // A label with trailing junk is refused, not read as its leading digits.
  std::ofstream(dir / "junk.txt") << "sub dir/img 0.jpg 3x\n";
  fo.list = dir / "junk.txt";
  o.out = dir / "out2";
  Status s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("junk.txt line 1: expected '<path> <integer label>', got "
                             "'sub dir/img 0.jpg 3x'"),
            std::string::npos)
      << s.message();
  // A path too long for an LMDB key is refused up front, naming the line and the limit.
  const std::string deep = std::string(200, 'a') + "/" + std::string(200, 'b') + "/" + std::string(120, 'c');
  std::filesystem::create_directories(dir / ("imgs/" + deep.substr(0, deep.rfind('/'))));
  std::filesystem::copy_file(dir / "imgs/sub dir/img 0.jpg", dir / ("imgs/" + deep + ".jpg"));
  std::ofstream(dir / "long.txt") << "sub dir/img 0.jpg 1\n" << deep << ".jpg 1\n";
  fo.list = dir / "long.txt";
  o.out = dir / "out3";
  s = ConvertFolder(fo, o, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("long.txt line 2: the path is 526 bytes; with the record number its LMDB key would be 535 "
                             "bytes, over LMDB's limit of 511"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(o.out));
  EXPECT_FALSE(std::filesystem::exists(o.out + ".incomplete"));
}

// Every record's header channels/height/width equal what decoding it as stored gives.
void ExpectHeadersTellTheTruth(const std::string& db, int want_c) {
  for (const auto& rec : ReadAll(db)) {
    Image scratch;
    ImageView v;
    ASSERT_TRUE(ViewDatum(rec.datum, 0, rec.key, &scratch, &v).ok());
    EXPECT_EQ(rec.datum.channels(), v.c) << rec.key;
    EXPECT_EQ(rec.datum.height(), v.h) << rec.key;
    EXPECT_EQ(rec.datum.width(), v.w) << rec.key;
    EXPECT_EQ(v.c, want_c) << rec.key;
  }
}

TEST(ConvertFolder, EncodedRecordsHeadersMatchTheStoredImage) {
  TempDir dir;
  MakeFolder(dir, 3, 10, 12, /*jpeg=*/true);  // colour JPEGs
  FolderOptions fo;
  fo.root = dir / "imgs";
  fo.list = dir / "list.txt";
  fo.channels = 1;
  ConvertReport r;
  for (const std::string enc : {"jpg", "png"}) {
    // --gray --encoded: colour files are re-encoded as greyscale.
    fo.encoded = enc;
    ConvertOptions o;
    o.out = dir / ("gray_" + enc);
    ASSERT_TRUE(ConvertFolder(fo, o, &r).ok());
    ExpectHeadersTellTheTruth(o.out, 1);
  }

  // Greyscale JPEGs without --gray: kept byte for byte, recorded as 1 channel; the loader
  // decodes them as the run asks.
  std::filesystem::create_directories(dir / "grey");
  std::ofstream list(dir / "grey_list.txt");
  std::vector<std::string> files;
  for (int i = 0; i < 2; ++i) {
    Image g;
    g.c = 1;
    g.h = 6;
    g.w = 5;
    g.pixels.assign(30, static_cast<uint8_t>(60 + 40 * i));
    std::string bytes;
    ASSERT_TRUE(EncodeJpeg(g, 95, &bytes).ok());
    std::ofstream(dir / fmt::format("grey/g{}.jpg", i), std::ios::binary) << bytes;
    list << fmt::format("g{}.jpg {}\n", i, i);
    files.push_back(bytes);
  }
  list.close();
  fo.root = dir / "grey";
  fo.list = dir / "grey_list.txt";
  fo.channels = 3;
  fo.encoded = "jpg";
  ConvertOptions o;
  o.out = dir / "grey_db";
  ASSERT_TRUE(ConvertFolder(fo, o, &r).ok());
  ExpectHeadersTellTheTruth(o.out, 1);
  const auto recs = ReadAll(o.out);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].datum.data(), files[0]);
  EXPECT_EQ(recs[1].datum.data(), files[1]);
  LoaderOptions lo = EvalOptions(o.out, 2, 0);
  lo.channels = 3;
  Loader loader(lo);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  EXPECT_EQ(loader.channels(), 3);
  const Batch* b = loader.Next();
  ASSERT_NE(b, nullptr) << loader.status().ToString();
  for (int ch = 0; ch < 3; ++ch) EXPECT_NEAR(b->data[ch * 30], 60, 2) << ch;
  loader.Release(b);
}

TEST(Inspect, EncodedRecordWhoseHeaderLiesIsBad) {
  TempDir dir;
  Image img;
  img.c = 3;
  img.h = 6;
  img.w = 5;
  img.pixels.assign(90, 77);
  std::string jpeg;
  ASSERT_TRUE(EncodeJpeg(img, 90, &jpeg).ok());
  {
    std::unique_ptr<LmdbWriter> w;
    ASSERT_TRUE(LmdbWriter::Create(dir / "db", &w).ok());
    ASSERT_TRUE(w->Put("00000000_ok", MakeEncodedDatum(jpeg, 3, 6, 5, 0)).ok());
    caffe::Datum caffe_style;  // Caffe leaves the dims of an encoded record unset: fine
    caffe_style.set_data(jpeg);
    caffe_style.set_encoded(true);
    ASSERT_TRUE(w->Put("00000001_caffe", caffe_style.SerializeAsString()).ok());
    // What convert-folder --gray --encoded jpg used to write for a colour file.
    ASSERT_TRUE(w->Put("00000002_liar", MakeEncodedDatum(jpeg, 1, 6, 5, 0)).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  InspectReport r;
  ASSERT_TRUE(InspectLmdb(dir / "db", "", 0, &r).ok());
  EXPECT_EQ(r.records, 3);
  EXPECT_EQ(r.bad, 1);
  EXPECT_NE(r.first_bad.find("key 00000002_liar: the header says channels x height x width = 1x6x5 but the stored "
                             "image decodes to 3x6x5"),
            std::string::npos)
      << r.first_bad;
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
