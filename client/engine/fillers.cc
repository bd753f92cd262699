// fillers.cc — see fillers.h.
#include "client/engine/fillers.h"

#include <cmath>

#include "common/status.h"

namespace downpour::engine {
namespace {

// Standard normal by Box–Muller from two counter-based uniforms.
float Gaussian(uint64_t seed, uint64_t stream, uint64_t i) {
  const float u1 = CounterUniform(seed, stream, 2 * i) + (0.5f / 16777216.0f);
  const float u2 = CounterUniform(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
}

}  // namespace

void FillTensor(const FillerSpec& filler, const TensorSpec& spec, uint64_t seed, uint64_t stream,
                std::span<float> out) {
  DP_CHECK_EQ(static_cast<int64_t>(out.size()), spec.numel());
  const int64_t fan_in = spec.shape.empty() || spec.shape[0] == 0 ? 1 : spec.numel() / spec.shape[0];
  const int64_t n = static_cast<int64_t>(out.size());
  switch (filler.type) {
    case FillerType::kConstant:
      for (int64_t i = 0; i < n; ++i) out[i] = filler.value;
      break;
    case FillerType::kGaussian:
      for (int64_t i = 0; i < n; ++i) out[i] = filler.std * Gaussian(seed, stream, i);
      break;
    case FillerType::kMsra: {
      const float std = std::sqrt(2.0f / static_cast<float>(fan_in));
      for (int64_t i = 0; i < n; ++i) out[i] = std * Gaussian(seed, stream, i);
      break;
    }
    case FillerType::kUniform:
    case FillerType::kXavier: {
      const float scale = filler.type == FillerType::kUniform
                              ? filler.scale
                              : std::sqrt(3.0f / static_cast<float>(fan_in));
      for (int64_t i = 0; i < n; ++i)
        out[i] = scale * (2.0f * CounterUniform(seed, stream, i) - 1.0f);
      break;
    }
  }
}

void DropoutMask(uint64_t seed, int64_t step, float ratio, std::span<float> mask) {
  const float keep_scale = 1.0f / (1.0f - ratio);
  const int64_t n = static_cast<int64_t>(mask.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    mask[i] = CounterUniform(seed, static_cast<uint64_t>(step), i) < ratio ? 0.0f : keep_scale;
}

}  // namespace downpour::engine
