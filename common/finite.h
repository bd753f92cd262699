// finite.h — the checks that keep NaN and ±inf away from weights: a server refuses a gradient that
// holds one, a worker's encoder sends such a gradient unencoded, a factor push bounds its product.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace downpour {

// The largest |x| over x, as its bit pattern (sign cleared): below 0x7f800000 (+inf) when every
// element is finite, and then std::bit_cast<float> of it is the value. An integer max, so it
// vectorises and NaN cannot hide (its pattern is above +inf's). 0 for an empty span.
uint32_t MaxAbsBits(std::span<const float> x);

// True when no element is NaN or ±inf.
bool AllFinite(std::span<const float> x);

}  // namespace downpour
