// finite.cc — see finite.h.
#include "common/finite.h"

namespace downpour {

uint32_t MaxAbsBits(std::span<const float> x) {
  return MaxMagnitudeBits<uint32_t>(reinterpret_cast<const std::byte*>(x.data()), x.size());
}

// As an integer max this runs faster than an OR over "exponent all ones" per element
// (bench/RESULTS.md §11.7, "An fp16 pull on the worker").
bool AllFinite(std::span<const float> x) { return MaxAbsBits(x) < kF32InfBits; }

}  // namespace downpour
