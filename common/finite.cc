// finite.cc — see finite.h.
#include "common/finite.h"

#include <algorithm>
#include <bit>

namespace downpour {

uint32_t MaxAbsBits(std::span<const float> x) {
  const float* __restrict p = x.data();
  const size_t n = x.size();
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(p[i]) & 0x7fffffffu);
  return m;
}

// NaN and ±inf are the magnitudes from +inf's pattern up. As an integer max this runs at about
// twice the speed of an OR over "exponent all ones" per element (10.5–12.3 against 5.5–7.0 ms
// over 57M floats in cache, bench/RESULTS.md §11.7).
bool AllFinite(std::span<const float> x) { return MaxAbsBits(x) < 0x7f800000u; }

}  // namespace downpour
