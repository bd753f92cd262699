// grad_codec_test.cc — the lossy wire codecs (common/grad_codec.h): each round trip within the
// bound the header states, error feedback's invariant sum(sent) + residual == sum(gradients)
// over many steps, and malformed payloads refused (with the right fault) before any output
// float is written; and the finite checks (common/finite.h) those refusals rest on.
#include "common/grad_codec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/finite.h"

namespace downpour {
namespace {

std::vector<float> Gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> Decode(Encoding e, DType d, const std::vector<std::byte>& bytes, size_t n) {
  std::vector<float> out(n, 123.0f);
  CodecFault fault;
  const Status s = DecodeChunk(e, d, bytes, out, 7, &fault);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fault, CodecFault::kNone);
  return out;
}

// ---- Conversions.

TEST(HalfTest, EveryHalfRoundTripsExactlyThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;  // NaN stays NaN
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "half " << h << " -> " << f;
  }
}

TEST(HalfTest, RoundsToNearestEvenOnTies) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to even (1). 1 + 3*2^-11: to 1 + 2^-9.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // the largest half
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 2^16
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie rounds to even: Inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);      // half the smallest subnormal: to even (0)
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);  // 1.5 subnormal steps: to even (2)
}

TEST(HalfTest, BulkConversionEqualsScalarBitForBit) {
  // The bulk path uses F16C when compiled with it; it must agree with the portable scalar code
  // (which the GPU's kernels copy), NaN payloads included.
  std::mt19937 rng(5);
  std::vector<float> x(100003);
  for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  for (uint32_t m : {0x1u, 0x1fffu, 0x2000u, 0x3fe000u, 0x400000u, 0x7fffffu}) {  // payloads at both ends
    x.push_back(std::bit_cast<float>(0x7f800000u | m));
    x.push_back(std::bit_cast<float>(0xff800000u | m));
  }
  for (int i = 0; i < 1000; ++i) x[static_cast<size_t>(i)] = (1.0f + static_cast<float>(i) * 0x1p-11f);  // ties
  std::vector<uint16_t> h(x.size());
  FloatsToHalf(x, h.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h[i], FloatToHalf(x[i])) << i << " " << x[i];
  std::vector<float> back(x.size());
  HalfToFloats(h.data(), back);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(HalfToFloat(h[i])));
  // Every half, signalling NaNs included (widened quiet).
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  HalfToFloats(all.data(), wide);
  for (size_t i = 0; i < all.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(HalfToFloat(all[i]))) << i;
}

// A received frame's halves are read where they lie, at any alignment and with a tail shorter
// than a vector: the same floats as the scalar conversions.
TEST(HalfTest, FromBytesAtAnyAlignmentEqualsScalar) {
  std::mt19937 rng(7);
  const size_t n = 8 * 37 + 5;
  std::vector<std::byte> buf(1 + 2 * n);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  std::vector<float> out(n);
  for (size_t offset : {size_t{0}, size_t{1}}) {
    const std::byte* src = buf.data() + offset;
    HalfBytesToFloats(src, std::span<float>(out.data(), n - offset));
    for (size_t i = 0; i + offset < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(HalfToFloat(h))) << offset << " " << i;
    }
    Bf16BytesToFloats(src, std::span<float>(out.data(), n - offset));
    for (size_t i = 0; i + offset < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(Bf16ToFloat(b))) << offset << " " << i;
    }
  }
}

TEST(HalfTest, RoundTripWithinStatedBound) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> expo(-14.0f, 15.9f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(expo(rng)) * (i % 2 ? -1.0f : 1.0f);
    if (std::fabs(x) > 65504.0f) continue;
    const float y = HalfToFloat(FloatToHalf(x));
    ASSERT_LE(std::fabs(y - x), 0x1p-11f * std::fabs(x)) << x;
  }
  for (int i = 0; i < 10000; ++i) {  // subnormal range: absolute bound 2^-25
    const float x = std::ldexp(static_cast<float>(i), -38);
    ASSERT_LE(std::fabs(HalfToFloat(FloatToHalf(x)) - x), 0x1p-25f) << x;
  }
}

TEST(Bf16Test, RoundTripWithinStatedBoundAndNanStaysNan) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> expo(-120.0f, 120.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(expo(rng)) * (i % 2 ? -1.0f : 1.0f);
    const float y = Bf16ToFloat(FloatToBf16(x));
    ASSERT_LE(std::fabs(y - x), 0x1p-8f * std::fabs(x)) << x;
  }
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);       // tie: to even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);   // tie: to even (up)
  const float nan = std::bit_cast<float>(0x7f800001u);  // a NaN whose payload sits in the low bits
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
}

// ---- Codec round trips.

TEST(GradCodecTest, DenseRoundTripsWithinBoundPerDType) {
  const auto x = Gaussian(4099, 1, 0.01f);
  for (DType d : {DType::kF32, DType::kF16, DType::kBf16}) {
    std::vector<std::byte> bytes;
    EncodeDense(x, d, &bytes);
    ASSERT_EQ(bytes.size(), EncodedBytes(Encoding::kDense, d, x.size()));
    const auto y = Decode(Encoding::kDense, d, bytes, x.size());
    const float rel = d == DType::kF32 ? 0.0f : d == DType::kF16 ? 0x1p-11f : 0x1p-8f;
    for (size_t i = 0; i < x.size(); ++i) {
      // f16: values below 2^-14 are subnormal there: the absolute bound 2^-25 applies.
      const float bound = std::max(rel * std::fabs(x[i]), d == DType::kF16 ? 0x1p-25f : 0.0f);
      ASSERT_LE(std::fabs(y[i] - x[i]), bound) << static_cast<int>(d) << " " << i;
    }
  }
}

TEST(GradCodecTest, TopKKeepsTheLargestMagnitudesExactly) {
  auto x = Gaussian(10000, 2);
  const size_t k = TopKCount(0.01, x.size());
  ASSERT_EQ(k, 100u);
  std::vector<std::byte> bytes;
  EncodeTopK(x, k, DType::kF32, &bytes);
  ASSERT_EQ(bytes.size(), k * 8);
  const auto y = Decode(Encoding::kTopK, DType::kF32, bytes, x.size());
  std::vector<float> mags(x.size());
  for (size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(k - 1), mags.end(), std::greater<>());
  const float kth = mags[k - 1];
  size_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0.0f) {
      ++kept;
      ASSERT_EQ(y[i], x[i]) << i;  // exact on the kept entries
      ASSERT_GE(std::fabs(x[i]), kth);
    } else {
      ASSERT_LE(std::fabs(x[i]), kth) << i;
    }
  }
  EXPECT_EQ(kept, k);
}

// Large chunks take the sampled threshold (common/grad_codec.cc, KthLargestMagnitude); it must
// select exactly what a full sort by (|x| descending, index ascending) selects — also when the
// strided sample is misleading (the fallback over all n) and with many equal magnitudes.
TEST(GradCodecTest, TopKOnLargeChunksEqualsAFullSort) {
  const size_t n = size_t{1} << 17;
  std::vector<std::vector<float>> cases;
  cases.push_back(Gaussian(n, 21));
  std::vector<float> misleading = Gaussian(n, 22, 0.01f);
  for (size_t j = 0; j < n; j += n / 8192) misleading[j] = 1000.0f + static_cast<float>(j);  // the sampled points
  cases.push_back(misleading);
  std::vector<float> ties(n);
  for (size_t i = 0; i < n; ++i) ties[i] = static_cast<float>(static_cast<int>(i % 7) - 3);  // |x| in {0..3}
  cases.push_back(ties);
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& x = cases[c];
    for (size_t k : {size_t{1}, size_t{1311}, size_t{9000}}) {
      std::vector<uint32_t> order(n);
      for (uint32_t i = 0; i < n; ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return std::fabs(x[a]) > std::fabs(x[b]) || (std::fabs(x[a]) == std::fabs(x[b]) && a < b);
      });
      order.resize(k);
      std::sort(order.begin(), order.end());
      std::vector<std::byte> bytes;
      EncodeTopK(x, k, DType::kF32, &bytes);
      ASSERT_EQ(bytes.size(), k * 8);
      std::vector<uint32_t> got(k);
      std::memcpy(got.data(), bytes.data(), k * 4);
      ASSERT_EQ(got, order) << "case " << c << ", k = " << k;
    }
  }
}

TEST(GradCodecTest, TopKCountIsCeilOfFractionAtLeastOne) {
  EXPECT_EQ(TopKCount(0.01, 1), 1u);
  EXPECT_EQ(TopKCount(0.01, 150), 2u);
  EXPECT_EQ(TopKCount(1.0, 37), 37u);
  EXPECT_EQ(TopKCount(1e-9, 1000), 1u);
}

TEST(GradCodecTest, TopKWarmupDecaysExponentiallyFromAQuarterToTheFraction) {
  EXPECT_DOUBLE_EQ(TopKWarmupFraction(0.01, 0, 100), 0.25);
  EXPECT_NEAR(TopKWarmupFraction(0.01, 50, 100), 0.05, 1e-12);  // the geometric mean halfway
  EXPECT_NEAR(TopKWarmupFraction(0.01, 25, 100), 0.25 * std::pow(0.04, 0.25), 1e-12);
  EXPECT_DOUBLE_EQ(TopKWarmupFraction(0.01, 100, 100), 0.01);
  EXPECT_DOUBLE_EQ(TopKWarmupFraction(0.01, 1000000, 100), 0.01);
  for (uint64_t p = 1; p <= 100; ++p) {
    ASSERT_LT(TopKWarmupFraction(0.01, p, 100), TopKWarmupFraction(0.01, p - 1, 100)) << p;
    ASSERT_GE(TopKWarmupFraction(0.01, p, 100), 0.01) << p;
  }
  EXPECT_DOUBLE_EQ(TopKWarmupFraction(0.01, 0, 0), 0.01);  // no warm-up
  EXPECT_DOUBLE_EQ(TopKWarmupFraction(0.5, 0, 100), 0.5);   // a fraction above the start: as set
}

TEST(GradCodecTest, TopKWarmupSendsFewerEntriesEachPushOfAChunkUntilTheFraction) {
  const size_t n = 10000;
  ChunkEncoder enc(CompressionConfig{.push = WireCodec::kTopK, .top_k_fraction = 0.01,
                                     .top_k_warmup_pushes = 4, .error_feedback = true});
  const auto g = Gaussian(n, 8);
  // k per push of chunk 5: ceil(n * 0.25 * 0.04^(p/4)) for p < 4, then ceil(n * 0.01).
  const size_t want[] = {2500, 1119, 500, 224, 100, 100, 100};
  for (size_t p = 0; p < std::size(want); ++p) {
    EncodedChunk e;
    enc.Encode(5, g, &e);
    ASSERT_EQ(e.encoding, Encoding::kTopK) << "push " << p;
    EXPECT_EQ(e.bytes.size(), EncodedBytes(Encoding::kTopK, DType::kF32, n, want[p])) << "push " << p;
  }
  // Each chunk counts its own pushes: a chunk pushed for the first time starts at a quarter.
  EncodedChunk other;
  enc.Encode(6, g, &other);
  EXPECT_EQ(other.bytes.size(), EncodedBytes(Encoding::kTopK, DType::kF32, n, 2500));
}

TEST(GradCodecTest, OneBitDecodesToScaleTimesSign) {
  const auto x = Gaussian(1003, 3);  // not a multiple of 8: padding bits in the last byte
  std::vector<std::byte> bytes;
  EncodeOneBit(x, &bytes);
  ASSERT_EQ(bytes.size(), 4u + 126u);
  double mean = 0;
  for (float v : x) mean += std::fabs(v);
  const auto scale = static_cast<float>(mean / static_cast<double>(x.size()));
  const auto y = Decode(Encoding::kOneBit, DType::kF32, bytes, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] < 0 ? -scale : scale) << i;
}

// ---- Error feedback.

void CheckErrorFeedback(WireCodec codec, int64_t warmup = 0) {
  const size_t n = 5000;
  ChunkEncoder enc(CompressionConfig{.push = codec, .top_k_fraction = 0.01,
                                     .top_k_warmup_pushes = warmup, .error_feedback = true});
  std::vector<double> sum_g(n, 0), sum_sent(n, 0);
  double max_abs = 0;
  for (int step = 0; step < 300; ++step) {
    const auto g = Gaussian(n, 100 + static_cast<uint32_t>(step), 0.1f);
    EncodedChunk e;
    enc.Encode(3, g, &e);
    ASSERT_EQ(e.encoding, CodecEncoding(codec)) << "step " << step;
    const auto y = Decode(e.encoding, enc.dtype(), e.bytes, n);
    for (size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i];
      sum_sent[i] += y[i];
      max_abs = std::max(max_abs, std::fabs(sum_g[i]));
    }
  }
  const auto r = enc.residual(3);
  ASSERT_EQ(r.size(), n);
  // f32 rounding: each step rounds g + r and g' - decoded once (2^-24 relative to values around
  // |g'|); after 300 steps the drift stays far below 1e-4 of the magnitudes involved.
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(sum_sent[i] + r[i] - sum_g[i]);
    ASSERT_TRUE(d <= 1e-4) << "element " << i << ": sent " << sum_sent[i] << " + residual " << r[i] << " vs "
                           << sum_g[i];
    worst = std::max(worst, d);
  }
  EXPECT_GT(max_abs, 0.5);  // the sums are not trivially small
}

TEST(ErrorFeedbackTest, TopKSentPlusResidualEqualsSumOfGradients) { CheckErrorFeedback(WireCodec::kTopK); }
TEST(ErrorFeedbackTest, OneBitSentPlusResidualEqualsSumOfGradients) { CheckErrorFeedback(WireCodec::kOneBit); }
TEST(ErrorFeedbackTest, TopKWithWarmupSentPlusResidualEqualsSumOfGradients) {
  CheckErrorFeedback(WireCodec::kTopK, /*warmup=*/100);  // k changes every push for 100, then stays
}

TEST(ErrorFeedbackTest, ResidualIsPerChunkAndOffWithoutErrorFeedback) {
  ChunkEncoder ef(CompressionConfig{.push = WireCodec::kTopK, .top_k_fraction = 0.01, .error_feedback = true});
  ChunkEncoder plain(CompressionConfig{.push = WireCodec::kTopK, .top_k_fraction = 0.01, .error_feedback = false});
  const auto g = Gaussian(1000, 4);
  EncodedChunk e;
  ef.Encode(1, g, &e);
  EXPECT_EQ(ef.residual(1).size(), 1000u);
  EXPECT_TRUE(ef.residual(2).empty());
  plain.Encode(1, g, &e);
  EXPECT_TRUE(plain.residual(1).empty());
  // Without feedback the second push of the same gradient sends the same entries.
  EncodedChunk e2;
  plain.Encode(1, g, &e2);
  EXPECT_EQ(e.bytes, e2.bytes);
}

TEST(ErrorFeedbackTest, NonFiniteGradientGoesAsItIsAndLeavesTheResidual) {
  ChunkEncoder enc(CompressionConfig{.push = WireCodec::kOneBit, .top_k_fraction = 0.01, .error_feedback = true});
  auto g = Gaussian(64, 5);
  EncodedChunk e;
  enc.Encode(0, g, &e);
  const std::vector<float> before(enc.residual(0).begin(), enc.residual(0).end());
  g[10] = std::numeric_limits<float>::quiet_NaN();
  enc.Encode(0, g, &e);
  EXPECT_EQ(e.encoding, Encoding::kDense);
  std::vector<float> out(64);
  CodecFault fault;
  EXPECT_FALSE(DecodeChunk(e.encoding, enc.dtype(), e.bytes, out, 0, &fault).ok());
  EXPECT_EQ(fault, CodecFault::kNonFinite);
  EXPECT_EQ(std::vector<float>(enc.residual(0).begin(), enc.residual(0).end()), before);
}

TEST(ErrorFeedbackTest, TinyChunkGoesDenseWhenTopKWouldNotPay) {
  ChunkEncoder enc(CompressionConfig{.push = WireCodec::kTopK, .top_k_fraction = 0.5, .error_feedback = true});
  const auto g = Gaussian(10, 6);
  EncodedChunk e;
  enc.Encode(0, g, &e);
  EXPECT_EQ(e.encoding, Encoding::kDense);
  EXPECT_EQ(Decode(e.encoding, DType::kF32, e.bytes, 10), g);
  for (float r : enc.residual(0)) EXPECT_EQ(r, 0.0f);
}

// ---- Bad payloads: refused with the fault named, output untouched.

struct Refusal {
  Status status;
  CodecFault fault;
  bool untouched;
};

Refusal Try(Encoding e, DType d, const std::vector<std::byte>& bytes, size_t n) {
  std::vector<float> out(n, 42.0f);
  Refusal r;
  r.status = DecodeChunk(e, d, bytes, out, 9, &r.fault);
  r.untouched = std::all_of(out.begin(), out.end(), [](float v) { return v == 42.0f; });
  return r;
}

std::vector<std::byte> TopKBytes(const std::vector<uint32_t>& idx, const std::vector<float>& values) {
  std::vector<std::byte> b(idx.size() * 4 + values.size() * 4);
  std::memcpy(b.data(), idx.data(), idx.size() * 4);
  std::memcpy(b.data() + idx.size() * 4, values.data(), values.size() * 4);
  return b;
}

void ExpectRefused(const Refusal& r, CodecFault fault, const std::string& words) {
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.fault, fault) << r.status.ToString();
  EXPECT_TRUE(r.untouched);
  EXPECT_NE(r.status.message().find("chunk 9"), std::string::npos) << r.status.ToString();
  EXPECT_NE(r.status.message().find(words), std::string::npos) << r.status.ToString();
}

TEST(GradCodecRefusalTest, TopKIndexOutOfRange) {
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({1, 10}, {1, 2}), 10), CodecFault::kIndex, "outside");
}

TEST(GradCodecRefusalTest, TopKUnsortedAndDuplicateIndices) {
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({5, 2}, {1, 2}), 10), CodecFault::kIndex, "ascending");
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({3, 3}, {1, 2}), 10), CodecFault::kIndex, "ascending");
}

TEST(GradCodecRefusalTest, TopKMoreEntriesThanElements) {
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({0, 1, 2, 3}, {1, 2, 3, 4}), 3), CodecFault::kIndex,
                "more than");
}

TEST(GradCodecRefusalTest, WrongLengths) {
  auto topk = TopKBytes({1, 2}, {1, 2});
  topk.pop_back();
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, topk, 10), CodecFault::kLength, "entries");
  ExpectRefused(Try(Encoding::kTopK, DType::kF16, {}, 10), CodecFault::kLength, "entries");  // k = 0
  ExpectRefused(Try(Encoding::kDense, DType::kF16, std::vector<std::byte>(19), 10), CodecFault::kLength, "bytes");
  ExpectRefused(Try(Encoding::kDense, DType::kF32, std::vector<std::byte>(20), 10), CodecFault::kLength, "bytes");
  ExpectRefused(Try(Encoding::kOneBit, DType::kF32, std::vector<std::byte>(5), 10), CodecFault::kLength, "oneBit");
}

TEST(GradCodecRefusalTest, OneBitNanNegativeOrInfScale) {
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), -1.0f, std::numeric_limits<float>::infinity()}) {
    std::vector<std::byte> b(4 + 2);
    std::memcpy(b.data(), &scale, 4);
    ExpectRefused(Try(Encoding::kOneBit, DType::kF32, b, 10), CodecFault::kNonFinite, "scale");
  }
}

TEST(GradCodecRefusalTest, OneBitPaddingBitsSet) {
  std::vector<std::byte> b(4 + 2);
  b[5] = std::byte{0x04};  // element 10 of a 10-element chunk
  ExpectRefused(Try(Encoding::kOneBit, DType::kF32, b, 10), CodecFault::kLength, "past element");
}

TEST(GradCodecRefusalTest, NanOrInfValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({1, 2}, {1, nan}), 10), CodecFault::kNonFinite, "NaN");
  ExpectRefused(Try(Encoding::kTopK, DType::kF32, TopKBytes({1, 2}, {inf, 1}), 10), CodecFault::kNonFinite, "NaN");
  std::vector<std::byte> half(20);
  const uint16_t hinf = 0x7c00, hnan = 0x7e01, bnan = 0x7fc1;
  std::memcpy(half.data() + 6, &hinf, 2);
  ExpectRefused(Try(Encoding::kDense, DType::kF16, half, 10), CodecFault::kNonFinite, "element 3");
  std::memcpy(half.data() + 6, &hnan, 2);
  ExpectRefused(Try(Encoding::kDense, DType::kF16, half, 10), CodecFault::kNonFinite, "element 3");
  std::vector<std::byte> bf(20);
  std::memcpy(bf.data() + 18, &bnan, 2);
  ExpectRefused(Try(Encoding::kDense, DType::kBf16, bf, 10), CodecFault::kNonFinite, "element 9");
}

// Chunk-sized payloads (several of the check's 4096-value blocks, an odd tail): the largest
// finite values and subnormals pass, every sign of NaN and Inf is found at its own index, in any
// block, unaligned in its frame (the check reads the bytes as they came).
TEST(GradCodecRefusalTest, NonFiniteFoundAtItsIndexInLargeUnalignedChunks) {
  constexpr size_t kCount = 3 * 4096 + 123;
  struct Kind {
    DType dtype;
    std::vector<uint32_t> finite, bad;  // bit patterns
  };
  const std::vector<Kind> kinds = {
      {DType::kF32,
       {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u},
       {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u}},
      {DType::kF16, {0x7bffu, 0xfbffu, 0x0001u, 0x8000u}, {0x7c00u, 0xfc00u, 0x7e00u, 0xfe01u}},
      {DType::kBf16, {0x7f7fu, 0xff7fu, 0x0001u, 0x8000u}, {0x7f80u, 0xff80u, 0x7fc0u, 0xffc1u}},
  };
  for (const Kind& k : kinds) {
    const size_t size = k.dtype == DType::kF32 ? 4 : 2;
    std::vector<std::byte> buf(1 + kCount * size);  // the payload starts one byte in: unaligned
    auto put = [&](size_t i, uint32_t bits) { std::memcpy(buf.data() + 1 + i * size, &bits, size); };
    for (size_t i = 0; i < kCount; ++i) put(i, k.finite[i % k.finite.size()]);
    const std::span<const std::byte> payload(buf.data() + 1, kCount * size);
    CodecFault fault = CodecFault::kNone;
    EXPECT_TRUE(CheckChunk(Encoding::kDense, k.dtype, payload, kCount, 7, &fault).ok()) << static_cast<int>(k.dtype);
    for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{2 * 4096 + 7}, kCount - 1}) {
      for (uint32_t bad : k.bad) {
        put(at, bad);
        const Status s = CheckChunk(Encoding::kDense, k.dtype, payload, kCount, 7, &fault);
        EXPECT_EQ(fault, CodecFault::kNonFinite) << static_cast<int>(k.dtype) << " " << std::hex << bad << " at " << at;
        EXPECT_NE(s.message().find(fmt::format("element {} is", at)), std::string::npos) << s.message();
        put(at, k.finite[0]);
      }
    }
  }
}

// ---- common/finite.h: the checks that keep NaN and ±inf away from weights.

TEST(Finite, AllFinite) {
  std::vector<float> x(37, 1.0f);
  x[3] = std::numeric_limits<float>::denorm_min();
  x[4] = -std::numeric_limits<float>::max();
  EXPECT_TRUE(AllFinite(x));
  EXPECT_TRUE(AllFinite({}));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t pos : {size_t{0}, size_t{17}, size_t{36}}) {  // head, middle, scalar tail
      std::vector<float> y = x;
      y[pos] = bad;
      EXPECT_FALSE(AllFinite(y)) << bad << " at " << pos;
    }
  }
}

TEST(Finite, MaxAbsBitsIsTheLargestMagnitudeAndFlagsNonFinite) {
  std::vector<float> x(37, 0.5f);
  x[3] = std::numeric_limits<float>::denorm_min();
  x[20] = -3.25f;
  EXPECT_EQ(std::bit_cast<float>(MaxAbsBits(x)), 3.25f);
  EXPECT_EQ(MaxAbsBits({}), 0u);
  x[36] = -std::numeric_limits<float>::max();  // the scalar tail
  EXPECT_EQ(std::bit_cast<float>(MaxAbsBits(x)), std::numeric_limits<float>::max());
  EXPECT_LT(MaxAbsBits(x), 0x7f800000u);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t pos : {size_t{0}, size_t{17}, size_t{36}}) {
      std::vector<float> y = x;
      y[pos] = bad;
      EXPECT_GE(MaxAbsBits(y), 0x7f800000u) << bad << " at " << pos;
    }
  }
}

TEST(GradCodecRefusalTest, FactorsAreNotDecodedHere) {
  ExpectRefused(Try(Encoding::kFactors, DType::kF32, std::vector<std::byte>(40), 10), CodecFault::kUnsupported,
                "factors");
}

}  // namespace
}  // namespace downpour
