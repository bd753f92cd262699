// mean_file_test.cc — mean images in both formats: Caffe .binaryproto files whose bytes the
// test assembles by hand from the protobuf wire format (the shape form and the legacy
// num/channels/height/width form, packed and unpacked data) are read with the right shape
// and values; bad ones are refused naming the path and the bad values; our writer
// round-trips both formats (chosen by the extension) and writes the bytes compute_image_mean
// writes; the loader subtracts a .binaryproto mean.
#include "data/mean_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/tensor_file.h"
#include "data/datum.h"
#include "data/lmdb_io.h"
#include "data/loader.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using testing::PutBytesField;
using testing::PutTag;
using testing::PutVarint;
using testing::PutVarintField;
using testing::TempDir;

std::string FloatBytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());  // little-endian host (the build checks)
  return s;
}

// caffe.BlobProto: num=1 channels=2 height=3 width=4 data=5 (packed) shape=7;
// caffe.BlobShape: dim=1 (packed int64).
std::string ShapeFormBlob(const std::vector<int64_t>& dims, const std::vector<float>& data) {
  std::string shape_dims;
  for (int64_t d : dims) PutVarint(&shape_dims, static_cast<uint64_t>(d));
  std::string shape;
  PutBytesField(&shape, 1, shape_dims);
  std::string out;
  PutBytesField(&out, 5, FloatBytes(data));
  PutBytesField(&out, 7, shape);
  return out;
}
std::string LegacyBlob(int num, int c, int h, int w, const std::vector<float>& data, bool packed = true) {
  std::string out;
  PutVarintField(&out, 1, num);
  PutVarintField(&out, 2, c);
  PutVarintField(&out, 3, h);
  PutVarintField(&out, 4, w);
  if (packed) {
    PutBytesField(&out, 5, FloatBytes(data));
  } else {
    for (float f : data) {
      PutTag(&out, 5, 5);
      out.append(FloatBytes({f}));
    }
  }
  return out;
}

void WriteString(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

std::vector<float> Ramp(int n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i) - 7.25f;
  return v;
}

TEST(MeanFile, ReadsCaffeBinaryprotoInTheShapeForm) {
  TempDir dir;
  const int h = 5, w = 4;
  const auto values = Ramp(3 * h * w, 1.5f);
  WriteString(dir / "mean.binaryproto", ShapeFormBlob({1, 3, h, w}, values));
  MeanImage m;
  const Status s = ReadMeanFile(dir / "mean.binaryproto", &m);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(m.c, 3);
  EXPECT_EQ(m.h, h);
  EXPECT_EQ(m.w, w);
  EXPECT_EQ(m.values, values);
  EXPECT_EQ(m.source, "");
  EXPECT_EQ(m.records, 0);
  // Blob::ToProto of a 3-axis blob writes [c, h, w]; the extension does not matter.
  WriteString(dir / "mean3.bin", ShapeFormBlob({3, h, w}, values));
  ASSERT_TRUE(ReadMeanFile(dir / "mean3.bin", &m).ok());
  EXPECT_EQ(m.c, 3);
  EXPECT_EQ(m.values, values);
}

TEST(MeanFile, ReadsCaffeBinaryprotoInTheLegacyForm) {
  TempDir dir;
  const auto values = Ramp(1 * 6 * 7, 0.5f);
  for (bool packed : {true, false}) {
    WriteString(dir / "legacy.binaryproto", LegacyBlob(1, 1, 6, 7, values, packed));
    MeanImage m;
    const Status s = ReadMeanFile(dir / "legacy.binaryproto", &m);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(m.c, 1);
    EXPECT_EQ(m.h, 6);
    EXPECT_EQ(m.w, 7);
    EXPECT_EQ(m.values, values) << (packed ? "packed" : "unpacked");
  }
}

TEST(MeanFile, BadBinaryprotoNamesThePathAndTheValues) {
  TempDir dir;
  struct Case {
    std::string name, bytes, want;
    StatusCode code = StatusCode::kCorrupt;
  };
  std::string bad_tag;  // field 0 does not exist in protobuf: a parse failure
  bad_tag.push_back('\x07');
  bad_tag += "garbage";
  const std::vector<Case> cases = {
      {"num2.binaryproto", LegacyBlob(2, 1, 2, 3, Ramp(12, 1)), "has num 2 (shape 2x1x2x3); a mean image has num 1"},
      {"short.binaryproto", LegacyBlob(1, 1, 2, 3, Ramp(5, 1)),
       "holds 5 data values but channels x height x width = 1x2x3 = 6"},
      {"dims.binaryproto", ShapeFormBlob({6, 1}, Ramp(6, 1)), "shape has 2 dims [6, 1]"},
      {"zero.binaryproto", LegacyBlob(1, 0, 2, 3, {}), "channels 0, height 2, width 3"},
      {"noshape.binaryproto",
       [] {
         std::string s;
         PutBytesField(&s, 5, FloatBytes({1, 2}));
         return s;
       }(),
       "has no shape"},
      {"junk.binaryproto", bad_tag, "neither a downpour tensor file (no \"DPTF\" magic) nor a Caffe BlobProto"},
      {"text.binaryproto", "104.0 117.0 123.0\n", "neither a downpour tensor file"},
      {"empty.binaryproto", "", "empty (0 bytes)"},
  };
  for (const Case& c : cases) {
    WriteString(dir / c.name, c.bytes);
    MeanImage m;
    const Status s = ReadMeanFile(dir / c.name, &m);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find("mean file " + (dir / c.name) + ": "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << c.name << ": " << s.message();
  }
  MeanImage m;
  const Status missing = ReadMeanFile(dir / "nope.binaryproto", &m);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("nope.binaryproto: no such file"), std::string::npos) << missing.message();
}

TEST(MeanFile, WriterRoundTripsBothFormatsChosenByExtension) {
  TempDir dir;
  MeanImage mean;
  mean.c = 3;
  mean.h = 2;
  mean.w = 5;
  mean.values = Ramp(30, 3.0f);
  mean.source = "some/lmdb";
  mean.records = 12;
  ASSERT_TRUE(WriteMeanFile(mean, dir / "m.binaryproto").ok());
  // Exactly the bytes compute_image_mean writes: legacy dims, packed float data.
  std::string bytes;
  ASSERT_TRUE(ReadFileBytes(dir / "m.binaryproto", &bytes).ok());
  EXPECT_EQ(bytes, LegacyBlob(1, 3, 2, 5, mean.values));
  MeanImage back;
  ASSERT_TRUE(ReadMeanFile(dir / "m.binaryproto", &back).ok());
  EXPECT_EQ(back.c, 3);
  EXPECT_EQ(back.h, 2);
  EXPECT_EQ(back.w, 5);
  EXPECT_EQ(back.values, mean.values);

  // Any other extension: our tensor file, metadata kept.
  ASSERT_TRUE(WriteMeanFile(mean, dir / "m.tensor").ok());
  ASSERT_TRUE(ReadFileBytes(dir / "m.tensor", &bytes).ok());
  ASSERT_GE(bytes.size(), 4u);
  EXPECT_EQ(bytes.substr(0, 4), "DPTF");
  ASSERT_TRUE(ReadMeanFile(dir / "m.tensor", &back).ok());
  EXPECT_EQ(back.values, mean.values);
  EXPECT_EQ(back.source, "some/lmdb");
  EXPECT_EQ(back.records, 12);
  // No temporary files are left beside the outputs.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

TEST(MeanFile, LoaderSubtractsABinaryprotoMean) {
  TempDir dir;
  // Raw 2x4x6 records, pixel = 10 * index + 1 + (p % 7); a Caffe mean with fractional values.
  {
    std::unique_ptr<LmdbWriter> writer;
    ASSERT_TRUE(LmdbWriter::Create(dir / "db", &writer).ok());
    std::vector<uint8_t> px(2 * 4 * 6);
    for (int i = 0; i < 3; ++i) {
      for (size_t p = 0; p < px.size(); ++p) px[p] = static_cast<uint8_t>(10 * i + 1 + p % 7);
      ASSERT_TRUE(writer->Put(RecordKey(i, "r"), MakeRawDatum(2, 4, 6, px.data(), i)).ok());
    }
    ASSERT_TRUE(writer->Finish().ok());
  }
  const auto mean = Ramp(2 * 4 * 6, 0.25f);
  WriteString(dir / "mean.binaryproto", ShapeFormBlob({1, 2, 4, 6}, mean));
  LoaderOptions o = EvalOptions(dir / "db", 3, 0);
  o.mean_file = dir / "mean.binaryproto";
  o.scale = 0.5f;
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  const Batch* b = loader.Next();
  ASSERT_NE(b, nullptr) << loader.status().ToString();
  ASSERT_EQ(b->n, 3);
  for (int i = 0; i < 3; ++i)
    for (int p = 0; p < 48; ++p) {
      const float src = static_cast<float>(10 * i + 1 + p % 7);
      EXPECT_FLOAT_EQ(b->data[i * 48 + p], (src - mean[p]) * 0.5f) << i << " " << p;
    }
  loader.Release(b);

  // A mean of another size is refused naming both shapes.
  WriteString(dir / "small.binaryproto", ShapeFormBlob({1, 2, 3, 3}, Ramp(18, 1)));
  o.mean_file = dir / "small.binaryproto";
  Loader mismatch(o);
  const Status s = mismatch.Open();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shape 2x3x3 differs from the records"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace downpour::data
