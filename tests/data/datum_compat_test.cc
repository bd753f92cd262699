// datum_compat_test.cc — Caffe Datum compatibility on bytes encoded independently of our
// writer: records are hand-assembled from protobuf wire-format tags (varints), as Caffe's
// C++ protobuf would serialize them, then read through ParseDatum and the Loader; and our
// writer's bytes are checked against the same hand-assembled bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/loader.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using testing::PutBytesField;
using testing::PutVarint;
using testing::PutVarintField;
using testing::TempDir;

// channels=1, height=2, width=3, data=4, label=5, float_data=6, encoded=7.
std::string HandDatum(int c, int h, int w, const std::string& data, int label, bool encoded) {
  std::string out;
  PutVarintField(&out, 1, c);
  PutVarintField(&out, 2, h);
  PutVarintField(&out, 3, w);
  PutBytesField(&out, 4, data);
  PutVarintField(&out, 5, label);
  if (encoded) PutVarintField(&out, 7, 1);
  return out;
}

std::string Pixels(int n, int salt) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + salt) & 0xff);
  return s;
}

TEST(DatumCompat, HandAssembledRawRecordParses) {
  const std::string pixels = Pixels(3 * 4 * 5, 1);
  caffe::Datum d;
  ASSERT_TRUE(ParseDatum(HandDatum(3, 4, 5, pixels, 7, false), "hand", &d).ok());
  EXPECT_EQ(d.channels(), 3);
  EXPECT_EQ(d.height(), 4);
  EXPECT_EQ(d.width(), 5);
  EXPECT_EQ(d.label(), 7);
  EXPECT_FALSE(d.encoded());
  EXPECT_EQ(d.data(), pixels);
}

TEST(DatumCompat, OurWriterProducesCaffeBytes) {
  // protobuf serializes known fields in field-number order, as the hand assembly does, so a
  // Caffe reader sees exactly what it would have written itself.
  const std::string pixels = Pixels(2 * 3 * 3, 5);
  EXPECT_EQ(MakeRawDatum(2, 3, 3, reinterpret_cast<const uint8_t*>(pixels.data()), 300),
            HandDatum(2, 3, 3, pixels, 300, false));
  const std::string jpeg_like = "\xff\xd8 not really";
  EXPECT_EQ(MakeEncodedDatum(jpeg_like, 3, 10, 12, 4), HandDatum(3, 10, 12, jpeg_like, 4, true));
}

TEST(DatumCompat, HandAssembledFloatDataRecordParses) {
  // float_data as Caffe writes it: repeated float, unpacked (proto2): tag 6 wire type 5 each.
  std::string out;
  PutVarintField(&out, 1, 1);
  PutVarintField(&out, 2, 1);
  PutVarintField(&out, 3, 2);
  for (float f : {1.5f, -2.25f}) {
    PutVarint(&out, (6u << 3) | 5);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  PutVarintField(&out, 5, 9);
  caffe::Datum d;
  ASSERT_TRUE(ParseDatum(out, "hand-float", &d).ok());
  ASSERT_EQ(d.float_data_size(), 2);
  EXPECT_EQ(d.float_data(0), 1.5f);
  EXPECT_EQ(d.float_data(1), -2.25f);
}

TEST(DatumCompat, LoaderReadsHandAssembledLmdbLikeConvertImageset) {
  // An LMDB as convert_imageset writes it: "%08d_<file>" keys, raw BGR planar records, and an
  // encoded JPEG record whose channels/height/width Caffe leaves at 0.
  TempDir dir;
  const std::string db = dir / "caffe_lmdb";
  Image img;
  img.c = 3;
  img.h = 6;
  img.w = 8;
  img.layout = Layout::kChw;
  const std::string raw = Pixels(3 * 6 * 8, 3);
  // A smooth image for the JPEG record (noise would not survive 4:2:0 chroma subsampling).
  img.pixels.resize(3 * 6 * 8);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 8; ++x) img.pixels[(c * 6 + y) * 8 + x] = static_cast<uint8_t>(40 + 60 * c + 5 * y + 4 * x);
  std::string jpeg;
  ASSERT_TRUE(EncodeJpeg(img, 95, &jpeg).ok());
  {
    std::unique_ptr<LmdbWriter> w;
    ASSERT_TRUE(LmdbWriter::Create(db, &w).ok());
    ASSERT_TRUE(w->Put("00000000_cat.jpg", HandDatum(3, 6, 8, raw, 0, false)).ok());
    std::string enc;  // Caffe's ReadFileToDatum: data + label + encoded, no dims
    PutBytesField(&enc, 4, jpeg);
    PutVarintField(&enc, 5, 1);
    PutVarintField(&enc, 7, 1);
    ASSERT_TRUE(w->Put("00000001_dog.jpg", enc).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  Loader loader(EvalOptions(db, 2, 0));
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  EXPECT_EQ(loader.channels(), 3);
  EXPECT_EQ(loader.height(), 6);
  EXPECT_EQ(loader.width(), 8);
  const Batch* b = loader.Next();
  ASSERT_NE(b, nullptr) << loader.status().ToString();
  ASSERT_EQ(b->n, 2);
  EXPECT_EQ(b->labels[0], 0);
  EXPECT_EQ(b->labels[1], 1);
  for (int i = 0; i < 3 * 6 * 8; ++i) {
    EXPECT_EQ(b->data[i], static_cast<float>(static_cast<uint8_t>(raw[i]))) << i;
    // JPEG is lossy: the decoded record stays close to the pixels it was made from.
    EXPECT_NEAR(b->data[3 * 6 * 8 + i], static_cast<float>(img.pixels[i]), 10.0f) << i;
  }
  EXPECT_EQ(b->skipped, 0);
  loader.Release(b);
  EXPECT_EQ(loader.Next(), nullptr);
  EXPECT_TRUE(loader.status().ok());
}

}  // namespace
}  // namespace downpour::data
