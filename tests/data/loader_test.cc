// loader_test.cc — shard slices partition the records exactly; epoch order and
// augmentation are deterministic for a seed (whatever the thread count); crops stay inside
// the image; mean/scale/mirror are Caffe's; bad records follow the documented policy.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <set>

#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/mean_file.h"
#include "data/shard.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

using testing::TempDir;

// Raw records c x h x w, label = index, pixel values depending on (index, position).
void WriteRawDb(const std::string& path, int n, int c, int h, int w) {
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(path, &writer).ok());
  std::vector<uint8_t> px(size_t(c) * h * w);
  for (int i = 0; i < n; ++i) {
    for (size_t p = 0; p < px.size(); ++p) px[p] = static_cast<uint8_t>((i * 31 + p * 7) & 0xff);
    ASSERT_TRUE(writer->Put(RecordKey(i, "r"), MakeRawDatum(c, h, w, px.data(), i)).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
}

// float_data records 1 x h x w whose value at (y, x) is 1000*index + 32*y + x, so any output
// pixel tells where in which image it came from.
void WriteCoordinateDb(const std::string& path, int n, int h, int w) {
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(path, &writer).ok());
  for (int i = 0; i < n; ++i) {
    caffe::Datum d;
    d.set_channels(1);
    d.set_height(h);
    d.set_width(w);
    d.set_label(i);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) d.add_float_data(static_cast<float>(1000 * i + 32 * y + x));
    ASSERT_TRUE(writer->Put(RecordKey(i, "coord"), d.SerializeAsString()).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
}

std::vector<int> LabelsOfOnePass(LoaderOptions o) {
  Loader loader(std::move(o));
  EXPECT_TRUE(loader.Open().ok()) << loader.status().ToString();
  std::vector<int> labels;
  while (const Batch* b = loader.Next()) {
    labels.insert(labels.end(), b->labels, b->labels + b->n);
    loader.Release(b);
  }
  EXPECT_TRUE(loader.status().ok()) << loader.status().ToString();
  return labels;
}

TEST(Shard, SlicesPartitionEveryRecordExactlyOnce) {
  for (int64_t n : {1, 7, 100, 1001}) {
    for (int w = 1; w <= 9; ++w) {
      if (w > n) continue;
      int64_t expect_begin = 0;
      for (int i = 0; i < w; ++i) {
        const SliceRange r = SliceOf(n, i, w);
        EXPECT_EQ(r.begin, expect_begin) << n << " " << i << "/" << w;
        EXPECT_GE(r.size(), n / w);
        EXPECT_LE(r.size(), n / w + 1);
        expect_begin = r.end;
      }
      EXPECT_EQ(expect_begin, n);
    }
  }
}

TEST(Shard, EpochOrderIsASeededPermutation) {
  for (int64_t buffer : {0, 1, 8, 1000}) {
    const auto a = EpochOrder(257, buffer, 42, 3);
    std::vector<int64_t> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 257; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_EQ(a, EpochOrder(257, buffer, 42, 3));
    if (buffer > 1) {
      EXPECT_NE(a, EpochOrder(257, buffer, 42, 4)) << "epochs differ";
      EXPECT_NE(a, EpochOrder(257, buffer, 43, 3)) << "seeds differ";
      EXPECT_NE(a, sorted);
    } else {
      EXPECT_EQ(a, sorted);
    }
  }
  // A window of 8 never moves a record earlier than 7 places before its key position.
  const auto w = EpochOrder(500, 8, 1, 0);
  for (size_t p = 0; p < w.size(); ++p) EXPECT_LE(w[p], static_cast<int64_t>(p) + 7);
}

TEST(Loader, WorkersSlicesOfASharedLmdbCoverItExactly) {
  TempDir dir;
  const int n = 103;
  WriteRawDb(dir / "db", n, 1, 2, 2);
  for (int workers : {1, 2, 3, 7}) {
    std::vector<int> all;
    for (int i = 0; i < workers; ++i) {
      LoaderOptions o = EvalOptions(dir / "db", 10, 0);
      o.shard_index = i;
      o.shard_count = workers;
      o.shuffle_buffer = 16;  // order within a slice may change, membership may not
      o.threads = 2;
      const auto labels = LabelsOfOnePass(o);
      const SliceRange r = SliceOf(n, i, workers);
      EXPECT_EQ(static_cast<int64_t>(labels.size()), r.size());
      for (int l : labels) {
        EXPECT_GE(l, r.begin);
        EXPECT_LT(l, r.end);
      }
      all.insert(all.end(), labels.begin(), labels.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), size_t(n)) << workers << " workers";
    for (int i = 0; i < n; ++i) EXPECT_EQ(all[i], i) << "missed or doubled with " << workers;
  }
}

TEST(Loader, EpochsRepeatTheSliceAndTheLastBatchIsPartial) {
  TempDir dir;
  WriteRawDb(dir / "db", 10, 1, 2, 2);
  LoaderOptions o = EvalOptions(dir / "db", 4, 0);
  o.epochs = 3;
  o.shuffle_buffer = 10;
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok());
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  std::vector<int> sizes, epochs, labels;
  while (const Batch* b = loader.Next()) {
    sizes.push_back(b->n);
    epochs.push_back(static_cast<int>(b->epoch));
    labels.insert(labels.end(), b->labels, b->labels + b->n);
    loader.Release(b);
  }
  EXPECT_EQ(sizes, (std::vector<int>{4, 4, 4, 4, 4, 4, 4, 2}));  // 30 images
  EXPECT_EQ(epochs, (std::vector<int>{0, 0, 0, 1, 1, 2, 2, 2}));
  for (int e = 0; e < 3; ++e) {
    std::vector<int> one(labels.begin() + 10 * e, labels.begin() + 10 * (e + 1));
    std::sort(one.begin(), one.end());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(one[i], i) << "epoch " << e;
  }
  EXPECT_EQ(loader.stats().images, 30);
}

// All data and labels of `batches` batches, released as they come. Byte batches
// (o.byte_batches) are normalised on the host (common/byte_batch.h) and must carry no floats.
std::vector<float> Stream(LoaderOptions o, int batches, std::vector<int>* labels) {
  Loader loader(std::move(o));
  EXPECT_TRUE(loader.Open().ok()) << loader.status().ToString();
  const InputNormalization norm = loader.normalization();
  std::vector<float> out;
  for (int k = 0; k < batches; ++k) {
    const Batch* b = loader.Next();
    EXPECT_NE(b, nullptr) << loader.status().ToString();
    if (!b) break;
    EXPECT_EQ(b->index, k);
    const size_t at = out.size();
    out.resize(at + size_t(b->n) * b->c * b->h * b->w);
    if (b->bytes != nullptr) {
      EXPECT_EQ(b->data, nullptr);
      NormalizeByteBatch(norm, ByteBatch{b->bytes, b->windows, b->n}, out.data() + at);
    } else {
      std::copy(b->data, b->data + (out.size() - at), out.begin() + static_cast<std::ptrdiff_t>(at));
    }
    labels->insert(labels->end(), b->labels, b->labels + b->n);
    loader.Release(b);
  }
  return out;
}

// 37 raw 3×12×10 records in dir/db, read 5 a batch with every augmentation: a 7×7 random crop,
// mirrors, a 16-record shuffle and per-channel means, seeded with `seed`. An epoch is 7.4 batches,
// so a stream of 20 batches crosses two epoch boundaries inside a batch.
LoaderOptions AugmentedStream(const TempDir& dir, uint64_t seed) {
  WriteRawDb(dir / "db", 37, 3, 12, 10);
  LoaderOptions o;
  o.db_path = dir / "db";
  o.batch_size = 5;
  o.crop = 7;
  o.mirror = true;
  o.shuffle_buffer = 16;
  o.seed = seed;
  o.mean_values = {10, 20, 30};
  return o;
}

TEST(Loader, AugmentationIsDeterministicForASeedWhateverTheThreads) {
  TempDir dir;
  LoaderOptions o = AugmentedStream(dir, 99);
  o.scale = 0.5f;
  std::vector<int> l1, l3, l_other;
  o.threads = 1;
  const auto a = Stream(o, 20, &l1);  // 100 images: crosses two epoch boundaries
  o.threads = 3;
  o.queue_depth = 3;
  const auto b = Stream(o, 20, &l3);
  EXPECT_EQ(a, b);
  EXPECT_EQ(l1, l3);
  o.seed = 100;
  const auto c = Stream(o, 20, &l_other);
  EXPECT_NE(a, c);
  EXPECT_NE(l1, l_other);
}

// Every augmentation the loader does, as bytes and then normalised, gives the float batches bit
// for bit: random crops with mirrors and per-channel means, padded moves, a mean image with a
// padded mirrored crop, and decoded (interleaved) JPEGs.
TEST(Loader, ByteBatchesNormaliseToTheFloatBatchesBitForBit) {
  TempDir dir;
  auto expect_same = [](const LoaderOptions& o, int batches, const char* what) {
    std::vector<int> lf, lb;
    const auto floats = Stream(o, batches, &lf);
    LoaderOptions b = o;
    b.byte_batches = true;
    const auto bytes = Stream(b, batches, &lb);
    ASSERT_EQ(floats.size(), bytes.size()) << what;
    EXPECT_EQ(lf, lb) << what;
    for (size_t i = 0; i < floats.size(); ++i) {
      // Bit for bit, not approximately: the GPU kernel and the host share this arithmetic.
      ASSERT_EQ(std::bit_cast<uint32_t>(floats[i]), std::bit_cast<uint32_t>(bytes[i])) << what << " at " << i;
    }
  };
  LoaderOptions o = AugmentedStream(dir, 7);
  o.scale = 0.5f;
  expect_same(o, 20, "crop, mirror, mean values");
  o.mean_values = {3};
  o.crop = 0;
  o.pad = 3;
  expect_same(o, 20, "padding, one mean value");
  MeanImage mean;
  mean.c = 3;
  mean.h = 12;
  mean.w = 10;
  for (int p = 0; p < 3 * 12 * 10; ++p) mean.values.push_back(0.37f * static_cast<float>(p % 13));
  ASSERT_TRUE(WriteMeanFile(mean, dir / "mean.tensor").ok());
  o.mean_values.clear();
  o.mean_file = dir / "mean.tensor";
  o.crop = 9;
  o.pad = 2;
  o.scale = 0.00390625f;
  expect_same(o, 20, "mean image, padded mirrored crop");
  o.train = false;
  expect_same(o, 7, "evaluation's centre crop");

  // Decoded JPEGs are interleaved: the byte crop gathers them into planes.
  {
    std::unique_ptr<LmdbWriter> w;
    ASSERT_TRUE(LmdbWriter::Create(dir / "jpeg", &w).ok());
    for (int i = 0; i < 12; ++i) {
      Image im;
      im.c = 3;
      im.h = 10;
      im.w = 11;
      for (int p = 0; p < 3 * 110; ++p) im.pixels.push_back(static_cast<uint8_t>((p * 13 + i * 29) & 0xff));
      std::string jpeg;
      ASSERT_TRUE(EncodeJpeg(im, 90, &jpeg).ok());
      ASSERT_TRUE(w->Put(RecordKey(i, "j"), MakeEncodedDatum(jpeg, 3, 10, 11, i)).ok());
    }
    ASSERT_TRUE(w->Finish().ok());
  }
  LoaderOptions j;
  j.db_path = dir / "jpeg";
  j.batch_size = 4;
  j.crop = 8;
  j.mirror = true;
  j.pad = 1;
  j.mean_values = {100, 110, 120};
  expect_same(j, 6, "JPEG");

  // Float records cannot be bytes: one error naming the LMDB, at Open.
  WriteCoordinateDb(dir / "floats", 4, 6, 6);
  LoaderOptions f = EvalOptions(dir / "floats", 2, 0);
  f.byte_batches = true;
  Loader refused(f);
  const Status s = refused.Open();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("LMDB " + std::string(dir / "floats") + " holds float records; byte batches need uint8"),
            std::string::npos)
      << s.message();
}

TEST(Loader, CropsStayInsideTheImageAndMirrorAsCaffe) {
  TempDir dir;
  const int h = 20, w = 24, crop = 11;
  WriteCoordinateDb(dir / "db", 40, h, w);
  LoaderOptions o;
  o.db_path = dir / "db";
  o.batch_size = 8;
  o.crop = crop;
  o.mirror = true;
  o.seed = 5;
  o.epochs = 5;
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  std::set<std::pair<int, int>> offsets;
  int mirrored = 0, images = 0;
  while (const Batch* b = loader.Next()) {
    for (int i = 0; i < b->n; ++i) {
      const float* img = b->data + size_t(i) * crop * crop;
      const int index = b->labels[i];
      // Recover the crop origin from the corner pixels, then check every pixel.
      const bool mirror = img[1] < img[0];
      const int v0 = static_cast<int>(img[mirror ? crop - 1 : 0]) - 1000 * index;
      const int y0 = v0 / 32, x0 = v0 % 32;
      ASSERT_GE(y0, 0);
      ASSERT_GE(x0, 0);
      ASSERT_LE(y0 + crop, h) << "crop leaves the image";
      ASSERT_LE(x0 + crop, w) << "crop leaves the image";
      for (int y = 0; y < crop; ++y)
        for (int x = 0; x < crop; ++x) {
          const int sx = x0 + (mirror ? crop - 1 - x : x);
          ASSERT_EQ(img[y * crop + x], static_cast<float>(1000 * index + 32 * (y0 + y) + sx));
        }
      offsets.insert({y0, x0});
      mirrored += mirror;
      ++images;
    }
    loader.Release(b);
  }
  ASSERT_EQ(images, 200);
  EXPECT_GT(offsets.size(), 40u) << "random crops cover many offsets";
  EXPECT_GT(mirrored, 60);
  EXPECT_LT(mirrored, 140);
}

// data.pad: raw (uint8, the Fashion-MNIST path) 8 x 8 records whose pixel (y, x) is 1 + 8y + x;
// with pad 2 and no crop every training image is the record moved by (dy, dx) in [-2, 2]^2,
// uncovered pixels 0; all 25 moves occur; evaluation (and pad 0) leave the record as it is.
TEST(Loader, PaddedCropsShiftTheImageAndFillWithZeros) {
  TempDir dir;
  constexpr int kSide = 8, kPad = 2;
  {
    std::unique_ptr<LmdbWriter> writer;
    ASSERT_TRUE(LmdbWriter::Create(dir / "db", &writer).ok());
    std::vector<uint8_t> px(kSide * kSide);
    for (int p = 0; p < kSide * kSide; ++p) px[static_cast<size_t>(p)] = static_cast<uint8_t>(1 + p);
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(writer->Put(RecordKey(i, "r"), MakeRawDatum(1, kSide, kSide, px.data(), i)).ok());
    ASSERT_TRUE(writer->Finish().ok());
  }
  auto expected = [](int y, int x, int dy, int dx) {
    const int sy = y + dy, sx = x + dx;
    return sy < 0 || sx < 0 || sy >= kSide || sx >= kSide ? 0.0f : static_cast<float>(1 + kSide * sy + sx);
  };
  LoaderOptions o;
  o.db_path = dir / "db";
  o.batch_size = 10;
  o.pad = kPad;
  o.seed = 9;
  o.epochs = 6;
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  std::set<std::pair<int, int>> moves;
  int images = 0;
  while (const Batch* b = loader.Next()) {
    for (int i = 0; i < b->n; ++i) {
      const float* img = b->data + size_t(i) * kSide * kSide;
      // The move: the one (dy, dx) that explains the centre pixel (never padding with pad 2).
      const int centre = static_cast<int>(img[4 * kSide + 4]) - 1;
      const int dy = centre / kSide - 4, dx = centre % kSide - 4;
      ASSERT_LE(std::abs(dy), kPad);
      ASSERT_LE(std::abs(dx), kPad);
      for (int y = 0; y < kSide; ++y)
        for (int x = 0; x < kSide; ++x) ASSERT_EQ(img[y * kSide + x], expected(y, x, dy, dx)) << y << "," << x;
      moves.insert({dy, dx});
      ++images;
    }
    loader.Release(b);
  }
  EXPECT_EQ(images, 300);
  EXPECT_EQ(moves.size(), 25u) << "every move of up to 2 pixels each way";
  // Evaluation takes the record as it is, padded or not.
  LoaderOptions e = EvalOptions(dir / "db", 10, 0);
  e.pad = kPad;
  Loader eval(e);
  ASSERT_TRUE(eval.Open().ok()) << eval.status().ToString();
  const Batch* b = eval.Next();
  ASSERT_NE(b, nullptr);
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x) EXPECT_EQ(b->data[y * kSide + x], expected(y, x, 0, 0));
  eval.Release(b);
  LoaderOptions bad = o;
  bad.pad = -1;
  Loader refused(bad);
  EXPECT_NE(refused.Open().message().find("pad is -1"), std::string::npos);
}

TEST(Loader, EvalIsCentreCropInKeyOrderWithMeanImageAndScale) {
  TempDir dir;
  WriteCoordinateDb(dir / "db", 3, 9, 8);
  MeanImage mean;
  mean.c = 1;
  mean.h = 9;
  mean.w = 8;
  for (int p = 0; p < 72; ++p) mean.values.push_back(static_cast<float>(p % 5));
  ASSERT_TRUE(WriteMeanFile(mean, dir / "mean.tensor").ok());
  LoaderOptions o = EvalOptions(dir / "db", 2, 5);
  o.mean_file = dir / "mean.tensor";
  o.scale = 0.25f;
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  int seen = 0;
  while (const Batch* b = loader.Next()) {
    for (int i = 0; i < b->n; ++i, ++seen) {
      EXPECT_EQ(b->labels[i], seen);
      const int y0 = (9 - 5) / 2, x0 = (8 - 5) / 2;
      for (int y = 0; y < 5; ++y)
        for (int x = 0; x < 5; ++x) {
          const float src = static_cast<float>(1000 * seen + 32 * (y0 + y) + x0 + x);
          const float m = mean.values[(y0 + y) * 8 + x0 + x];
          EXPECT_FLOAT_EQ(b->data[(i * 5 + y) * 5 + x], (src - m) * 0.25f);
        }
    }
    loader.Release(b);
  }
  EXPECT_EQ(seen, 3);
}

TEST(Loader, MissingLmdbAndBadOptionsNameTheCulprit) {
  Loader missing(EvalOptions("/nonexistent/train_lmdb", 4, 0));
  Status s = missing.Open();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/train_lmdb"), std::string::npos) << s.message();

  TempDir dir;
  WriteRawDb(dir / "db", 4, 1, 6, 6);
  LoaderOptions o = EvalOptions(dir / "db", 2, 7);
  Loader too_big(o);
  s = too_big.Open();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("crop 7"), std::string::npos) << s.message();
  o.crop = 0;
  o.shard_index = 3;
  o.shard_count = 3;
  Loader bad_shard(o);
  s = bad_shard.Open();
  EXPECT_NE(s.message().find("shard_index 3"), std::string::npos) << s.message();
  o.shard_index = 0;
  o.mean_values = {1, 2};
  Loader bad_mean(o);
  s = bad_mean.Open();
  EXPECT_NE(s.message().find("2 mean_values"), std::string::npos) << s.message();
}

// An LMDB of 12 raw 3x8x8 records (pixels = label = index) with `bad` records swapped in.
void WriteDbWithBadRecords(const std::string& path, int n,
                           const std::map<int, std::string>& bad) {
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(path, &writer).ok());
  std::vector<uint8_t> px(3 * 8 * 8);
  for (int i = 0; i < n; ++i) {
    std::fill(px.begin(), px.end(), static_cast<uint8_t>(i));
    auto it = bad.find(i);
    ASSERT_TRUE(writer->Put(RecordKey(i, "x"), it != bad.end() ? it->second
                                                               : MakeRawDatum(3, 8, 8, px.data(), i)).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
}

// Record 3: not a Datum; 6: data length disagrees with c*h*w; 9: a corrupt JPEG.
std::map<int, std::string> BadRecords() {
  Image img;
  img.c = 3;
  img.h = 8;
  img.w = 8;
  img.pixels.assign(3 * 8 * 8, 128);
  std::string jpeg;
  EXPECT_TRUE(EncodeJpeg(img, 90, &jpeg).ok());
  std::string corrupt_jpeg = jpeg.substr(0, jpeg.size() / 2);
  caffe::Datum short_data;  // claims 3x8x8 = 192 bytes, carries 100
  short_data.set_channels(3);
  short_data.set_height(8);
  short_data.set_width(8);
  short_data.set_data(std::string(100, '\1'));
  short_data.set_label(6);
  return {
      {3, "this is not a protobuf Datum, just some text bytes"},
      {6, short_data.SerializeAsString()},
      {9, MakeEncodedDatum(corrupt_jpeg, 3, 8, 8, 9)},
  };
}

TEST(Loader, BadRecordsMidEpochAreSkippedAndCounted) {
  TempDir dir;
  const auto bad = BadRecords();
  WriteDbWithBadRecords(dir / "db", 12, bad);
  LoaderOptions o = EvalOptions(dir / "db", 4, 0);
  Loader loader(o);
  ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
  std::vector<int> labels;
  int skipped = 0;
  while (const Batch* b = loader.Next()) {
    EXPECT_EQ(b->n, 4) << "batches keep their shape";
    skipped += b->skipped;
    for (int i = 0; i < b->n; ++i) {
      labels.push_back(b->labels[i]);
      // A replaced slot holds a copy of a good image of the batch: its pixels match its label.
      EXPECT_EQ(b->data[size_t(i) * 3 * 8 * 8], static_cast<float>(b->labels[i]));
    }
    loader.Release(b);
  }
  EXPECT_TRUE(loader.status().ok()) << loader.status().ToString();
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(loader.stats().skipped_records, 3);
  std::set<int> good(labels.begin(), labels.end());
  EXPECT_EQ(good, (std::set<int>{0, 1, 2, 4, 5, 7, 8, 10, 11}));
}

TEST(Loader, FailPolicyStopsAtTheFirstBadRecordNamingIt) {
  struct Case {
    int index;
    std::string want;
  };
  auto bad = BadRecords();
  for (const Case& c : {Case{3, "not a Caffe Datum"}, Case{6, "100 bytes but channels x height x width = 3x8x8 = 192"},
                        Case{9, "JPEG"}}) {
    TempDir dir;
    WriteDbWithBadRecords(dir / "db", 12, {{c.index, bad[c.index]}});
    LoaderOptions o = EvalOptions(dir / "db", 4, 0);
    o.on_bad_record = BadRecordPolicy::kFail;
    Loader loader(o);
    ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
    int batches = 0;
    while (const Batch* b = loader.Next()) {
      ++batches;
      loader.Release(b);
    }
    const Status s = loader.status();
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << c.index;
    EXPECT_NE(s.message().find(fmt::format("key {:08d}_x", c.index)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(dir / "db"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.message();
    EXPECT_LT(batches, 3) << "the batch holding the bad record is never handed out";
  }
}

// One handed-out batch, copied.
struct BatchCopy {
  int64_t index = 0, epoch = 0;
  int n = 0, c = 0, h = 0, w = 0;
  std::vector<float> data;
  std::vector<int> labels;
  bool operator==(const BatchCopy&) const = default;
};

// Every batch a loader hands out (at most `limit`), and its status at the end.
std::vector<BatchCopy> Batches(const LoaderOptions& o, int limit, Status* status) {
  Loader loader(o);
  *status = loader.Open();
  std::vector<BatchCopy> out;
  if (!status->ok()) return out;
  while (static_cast<int>(out.size()) < limit) {
    const Batch* b = loader.Next();
    if (b == nullptr) break;
    BatchCopy c{b->index, b->epoch, b->n, b->c, b->h, b->w, {}, {}};
    c.data.assign(b->data, b->data + size_t(b->n) * b->c * b->h * b->w);
    c.labels.assign(b->labels, b->labels + b->n);
    out.push_back(std::move(c));
    loader.Release(b);
  }
  *status = loader.status();
  return out;
}

TEST(Loader, StartBatchResumesTheStreamBitForBit) {
  TempDir dir;
  LoaderOptions o = AugmentedStream(dir, 7);
  o.threads = 2;
  Status s;
  // 20 batches of 5 = 100 images: epochs 0, 1 and 2 (37 records each), batches 7 and 14
  // straddle the boundaries.
  const auto all = Batches(o, 20, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(all.size(), 20u);
  EXPECT_EQ(all[7].epoch, 0);  // positions 35..39: the epoch of its first image
  EXPECT_EQ(all[8].epoch, 1);
  EXPECT_EQ(all[14].epoch, 1);  // positions 70..74
  EXPECT_EQ(all[15].epoch, 2);
  for (int64_t start : {1, 7, 8, 14, 19}) {
    o.start_batch = start;
    const auto resumed = Batches(o, static_cast<int>(20 - start), &s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(resumed.size(), size_t(20 - start));
    for (size_t k = 0; k < resumed.size(); ++k) {
      EXPECT_EQ(resumed[k].index, start + static_cast<int64_t>(k));
      EXPECT_TRUE(resumed[k] == all[static_cast<size_t>(start) + k])
          << "start_batch " << start << ": batch " << resumed[k].index << " differs";
    }
  }
}

TEST(Loader, StartBatchCountsTowardTheEpochs) {
  TempDir dir;
  WriteRawDb(dir / "db", 10, 1, 2, 2);
  LoaderOptions o = EvalOptions(dir / "db", 4, 0);
  o.epochs = 2;  // 20 images: batches 0..4, the last one of 4
  o.shuffle_buffer = 4;
  Status s;
  const auto all = Batches(o, 100, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(all.size(), 5u);
  o.start_batch = 3;
  const auto tail = Batches(o, 100, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_TRUE(tail[0] == all[3]);
  EXPECT_TRUE(tail[1] == all[4]);
  o.start_batch = 5;  // resumed after the last batch: nothing left, no error
  EXPECT_TRUE(Batches(o, 100, &s).empty());
  EXPECT_TRUE(s.ok()) << s.ToString();
  o.start_batch = 6;
  Loader past(o);
  s = past.Open();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("start_batch 6 is past the end of the stream"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("are 5 batches of 4"), std::string::npos) << s.message();
  o.start_batch = -1;
  Loader negative(o);
  s = negative.Open();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("start_batch is -1"), std::string::npos) << s.message();
}

TEST(Loader, LabelOutsideTheModelsClassesStopsTheLoaderNamingKeyAndLabel) {
  TempDir dir;
  // Labels = index 0..11; with num_classes 10, records 10 and 11 do not fit the model.
  WriteDbWithBadRecords(dir / "db", 12, {});
  for (BadRecordPolicy policy : {BadRecordPolicy::kSkip, BadRecordPolicy::kFail}) {
    LoaderOptions o = EvalOptions(dir / "db", 4, 0);
    o.num_classes = 10;
    o.on_bad_record = policy;
    Loader loader(o);
    ASSERT_TRUE(loader.Open().ok()) << loader.status().ToString();
    int batches = 0;
    while (const Batch* b = loader.Next()) {
      for (int i = 0; i < b->n; ++i) EXPECT_LT(b->labels[i], 10);
      ++batches;
      loader.Release(b);
    }
    EXPECT_LE(batches, 2) << "the batch holding key 10 is never handed out";
    const Status s = loader.status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("LMDB " + (dir / "db") +
                               " key 00000010_x: label 10 is outside "
                               "the model's 10 classes (0..9): the dataset and model.config "
                               "do not match"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(loader.stats().skipped_records, 0) << "a label mismatch is not a skipped record";
  }
  // Negative labels too; num_classes 12 accepts every record.
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(dir / "neg", &writer).ok());
  const uint8_t px[4] = {1, 2, 3, 4};
  ASSERT_TRUE(writer->Put(RecordKey(0, "a"), MakeRawDatum(1, 2, 2, px, 0)).ok());
  ASSERT_TRUE(writer->Put(RecordKey(1, "b"), MakeRawDatum(1, 2, 2, px, -3)).ok());
  ASSERT_TRUE(writer->Finish().ok());
  LoaderOptions o = EvalOptions(dir / "neg", 2, 0);
  o.num_classes = 5;
  Status s;
  EXPECT_TRUE(Batches(o, 10, &s).empty());
  EXPECT_NE(s.message().find("key 00000001_b: label -3 is outside the model's 5 classes (0..4)"), std::string::npos)
      << s.message();
  o = EvalOptions(dir / "db", 4, 0);
  o.num_classes = 12;
  EXPECT_EQ(Batches(o, 10, &s).size(), 3u);
  EXPECT_TRUE(s.ok()) << s.ToString();
  o.num_classes = -1;
  Loader bad(o);
  EXPECT_NE(bad.Open().message().find("num_classes is -1"), std::string::npos);
}

TEST(Loader, MixedGreyAndColourEncodedRecordsNameTheChannelsFix) {
  TempDir dir;
  Image colour;
  colour.c = 3;
  colour.h = colour.w = 8;
  colour.pixels.assign(3 * 64, 120);
  Image grey = colour;
  grey.c = 1;
  grey.pixels.assign(64, 50);
  std::string cj, gj;
  ASSERT_TRUE(EncodeJpeg(colour, 95, &cj).ok());
  ASSERT_TRUE(EncodeJpeg(grey, 95, &gj).ok());
  {
    std::unique_ptr<LmdbWriter> w;
    ASSERT_TRUE(LmdbWriter::Create(dir / "db", &w).ok());
    ASSERT_TRUE(w->Put(RecordKey(0, "colour"), MakeEncodedDatum(cj, 3, 8, 8, 0)).ok());
    ASSERT_TRUE(w->Put(RecordKey(1, "grey"), MakeEncodedDatum(gj, 1, 8, 8, 1)).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  LoaderOptions o = EvalOptions(dir / "db", 2, 0);
  o.on_bad_record = BadRecordPolicy::kFail;
  Status s;
  EXPECT_TRUE(Batches(o, 10, &s).empty());
  EXPECT_NE(s.message().find("key 00000001_grey: the stored image decodes to 1 channels, the stream has 3; to "
                             "convert every encoded record to 3 channels, set the loader's channels to 3"),
            std::string::npos)
      << s.message();
  o.channels = 3;
  const auto batches = Batches(o, 10, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].c, 3);
  EXPECT_NEAR(batches[0].data[3 * 64 + 2 * 64], 50, 2);  // the grey record, its third channel
}

TEST(Loader, AllocatorHookOwnsTheBatchMemory) {
  TempDir dir;
  WriteRawDb(dir / "db", 9, 1, 4, 4);
  int allocs = 0, frees = 0;
  {
    LoaderOptions o = EvalOptions(dir / "db", 3, 0);
    o.queue_depth = 2;
    o.allocate = [&](size_t bytes) { ++allocs; return std::malloc(bytes); };
    o.deallocate = [&](void* p) { ++frees; std::free(p); };
    Loader loader(o);
    ASSERT_TRUE(loader.Open().ok());
    EXPECT_EQ(allocs, 4);  // data + labels per ring slot
    const Batch* a = loader.Next();
    const Batch* b = loader.Next();
    ASSERT_TRUE(a && b);
    EXPECT_EQ(loader.Next(), nullptr) << "a third batch while both slots are held is refused";
    EXPECT_EQ(loader.status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(frees, 4);
}

}  // namespace
}  // namespace downpour::data
