// fillers.h — seeded parameter initialisers and dropout masks, shared by every backend so
// that the same seed gives bit-identical weights and masks everywhere.
//
// Randomness is counter-based (splitmix64 of seed, stream, index): a value depends only on
// its coordinates, so a GPU kernel or a threaded loop can reproduce it without shared state.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "client/engine/net_spec.h"
#include "common/tensor_spec.h"

namespace downpour::engine {

// Uniform in [0, 1) from (seed, stream, index); 24 random bits.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float CounterUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = SplitMix64(SplitMix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// Fills `out` (canonical layout of `spec`) per `filler`; fan_in = numel / shape[0]
// (Caffe's definition: in/group × kh × kw for conv, in for inner product).
void FillTensor(const FillerSpec& filler, const TensorSpec& spec, uint64_t seed, uint64_t stream,
                std::span<float> out);

// Inverted dropout mask: mask[i] = 0 with probability `ratio`, else 1/(1-ratio).
// A pure function of (seed, step, i).
void DropoutMask(uint64_t seed, int64_t step, float ratio, std::span<float> mask);

}  // namespace downpour::engine
