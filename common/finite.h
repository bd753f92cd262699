// finite.h — the checks that keep NaN and ±inf away from weights: a server refuses a gradient that
// holds one, a worker's encoder sends such a gradient unencoded, a factor push bounds its product,
// a received frame of f32, f16 or bf16 values is checked before it is decoded.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace downpour {

// +inf's bit pattern; a float is NaN or ±inf when its magnitude bits are this or above.
inline constexpr uint32_t kF32InfBits = 0x7f800000u;

// The largest magnitude among n values of unsigned type U (the bits of f32, f16 or bf16) stored
// at src at any alignment, as bits with the sign bit cleared. An integer max, so it vectorises
// (a bool OR per element did not; bench/RESULTS.md §11.7) and NaN cannot hide (its pattern is
// above inf's).
template <typename U>
U MaxMagnitudeBits(const std::byte* src, size_t n) {
  constexpr U kMagnitude = static_cast<U>(static_cast<U>(~U{0}) >> 1);
  U m = 0;
  for (size_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, src + i * sizeof(U), sizeof(U));
    m = std::max<U>(m, static_cast<U>(x & kMagnitude));
  }
  return m;
}

// The largest |x| over x, as its bit pattern (sign cleared): below kF32InfBits when every element
// is finite, and then std::bit_cast<float> of it is the value. 0 for an empty span.
uint32_t MaxAbsBits(std::span<const float> x);

// True when no element is NaN or ±inf.
bool AllFinite(std::span<const float> x);

}  // namespace downpour
