// CompareTensors (client/engine/tensor_compare.h), the comparison behind every agreement test:
// it fails on a NaN or Inf in either tensor (the old `if (d > worst)` let a NaN through), on one
// element over tolerance, and on a size mismatch, and its message names the first failing element.
// The gtest wrapper the agreement tests use fails too (EXPECT_NONFATAL_FAILURE).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "client/engine/tensor_compare.h"

namespace downpour::engine {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The wrapper the agreement tests use (engine_agreement_test.cc, gpu_test_util.h).
void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want, double rel) {
  const TensorComparison c = CompareTensors(what, got, want, rel);
  EXPECT_TRUE(c.ok) << c.message;
}

TEST(EngineCompare, EqualAndWithinTolerancePass) {
  const std::vector<float> want = {1.0f, -2.0f, 4.0f};
  EXPECT_TRUE(CompareTensors("t", want, want, 0.0).ok);
  const std::vector<float> got = {1.0f, -2.0f, 4.0f + 2e-4f};  // tolerance: 1e-4 of max |want| = 4e-4
  const TensorComparison c = CompareTensors("t", got, want, 1e-4);
  EXPECT_TRUE(c.ok) << c.message;
  EXPECT_EQ(c.failures, 0);
  EXPECT_EQ(c.first_bad, -1);
  EXPECT_TRUE(c.message.empty());
  EXPECT_DOUBLE_EQ(c.scale, 4.0);
  EXPECT_NEAR(c.worst, 5e-5, 1e-6);
}

TEST(EngineCompare, NanInEitherTensorFails) {
  const std::vector<float> want = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> got = want;
  got[2] = kNan;
  TensorComparison c = CompareTensors("scores", got, want, 1e-4);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.first_bad, 2);
  EXPECT_EQ(c.failures, 1);
  EXPECT_TRUE(std::isnan(c.got));
  EXPECT_NE(c.message.find("scores: element 2"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("nan"), std::string::npos) << c.message;

  // NaN in the expected tensor fails as well (and does not poison the scale).
  std::vector<float> bad_want = want;
  bad_want[0] = kNan;
  c = CompareTensors("scores", want, bad_want, 1e-4);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.first_bad, 0);
  EXPECT_DOUBLE_EQ(c.scale, 4.0);

  // Even with an infinite tolerance.
  c = CompareTensors("scores", got, want, kInf);
  EXPECT_FALSE(c.ok);
  // All NaN: every element fails.
  const std::vector<float> nans(4, kNan);
  c = CompareTensors("scores", nans, nans, 1.0);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.failures, 4);
}

TEST(EngineCompare, InfFails) {
  const std::vector<float> want = {1.0f, 2.0f};
  const std::vector<float> got = {1.0f, kInf};
  const TensorComparison c = CompareTensors("grad", got, want, 1.0);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.first_bad, 1);
  // Inf == Inf is still not a finite agreement.
  EXPECT_FALSE(CompareTensors("grad", got, got, 1.0).ok);
}

TEST(EngineCompare, OverToleranceNamesTheFirstFailingElement) {
  const std::vector<float> want = {10.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> got = {10.0f, 0.0f, 0.002f, 0.0f, 0.5f};  // tolerance 1e-4 · 10 = 1e-3
  const TensorComparison c = CompareTensors("conv1.weight", got, want, 1e-4);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.first_bad, 2);  // the first, not the worst (4)
  EXPECT_EQ(c.failures, 2);
  EXPECT_FLOAT_EQ(c.got, 0.002f);
  EXPECT_NE(c.message.find("conv1.weight: element 2"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("2 of 5 elements fail"), std::string::npos) << c.message;
  EXPECT_NEAR(c.worst, 0.05, 1e-7);
}

TEST(EngineCompare, SizeMismatchFails) {
  const std::vector<float> a = {1.0f, 2.0f}, b = {1.0f};
  const TensorComparison c = CompareTensors("t", a, b, 1.0);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("2 elements computed but 1 expected"), std::string::npos) << c.message;
}

TEST(EngineCompare, TheTestWrapperFailsOnNan) {
  const std::vector<float> want = {1.0f, 2.0f};
  const std::vector<float> got = {1.0f, kNan};
  EXPECT_NONFATAL_FAILURE(ExpectClose("loss", got, want, 1e-4), "loss: element 1 is nan");
  EXPECT_NONFATAL_FAILURE(ExpectClose("loss", want, got, 1e-4), "loss: element 1 is 2");
}

}  // namespace
}  // namespace downpour::engine
