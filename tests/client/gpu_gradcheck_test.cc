// Gradient checks of the CUDA backend's layers over the Layer interface: the same layer suite
// the CPU backends pass (client/engine/gradient_cases.h, run by engine_layer_gradcheck_test.cc
// on reference and oneDNN), each CUDA layer built with Backend::CreateLayer as the Net builds
// it, its Backward against central differences of a random linear functional of its top. EVERY
// element of the bottom and of every parameter tensor is checked and must pass.
//
// Tolerances: float32, Caffe's GradientChecker(1e-2, 1e-3) (Float32GradientOptions), with TF32
// off — TF32 keeps 10 mantissa bits, and its rounding (≈1e-3 relative) in a convolution's
// forward would reach the numeric derivative as ≈1e-3 · |top| / step noise.
// Pooling cases cover both GPU paths: cuDNN where floor == ceil (MaxPoolFloorEqualsCeil,
// AvePoolFloorEqualsCeil, AvePoolPadNoOverhang) and the kernels at the ceil overhang.
//
// Skips with "no CUDA device: ..." when there is none (label gpu).
#include <gtest/gtest.h>

#include <cstdio>

#include "client/engine/gpu/cuda_backend.h"
#include "client/engine/gradient_cases.h"
#include "client/engine/gradient_checker.h"
#include "tests/client/gpu_test_util.h"
#include "tests/client/gradient_case_check.h"

namespace downpour::engine {
namespace {

class GpuLayerGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(GpuLayerGradient, EveryElementMatchesCentralDifferences) {
  DP_SKIP_WITHOUT_GPU();
  const GradientCase& g = GetParam();
  LayerCase c;
  Status s = MakeGradientCase(g, 1234, &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  CudaOptions o;
  o.tf32 = false;
  std::unique_ptr<Backend> gpu;
  s = CreateCudaBackend(o, &gpu);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectEveryElementChecked(*gpu, g, c);
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuLayerGradient, ::testing::ValuesIn(LayerGradientCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace downpour::engine
