// shard.cc — slices and the windowed shuffle.
#include "data/shard.h"

#include <random>

#include "data/transform.h"

namespace downpour::data {

SliceRange SliceOf(int64_t n, int index, int count) {
  DP_CHECK_GE(index, 0);
  DP_CHECK_LT(index, count);
  // __int128 keeps n*index exact for any n.
  SliceRange r;
  r.begin = static_cast<int64_t>((static_cast<__int128>(n) * index) / count);
  r.end = static_cast<int64_t>((static_cast<__int128>(n) * (index + 1)) / count);
  return r;
}

std::vector<int64_t> EpochOrder(int64_t n, int64_t shuffle_buffer, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  if (shuffle_buffer <= 1) {
    for (int64_t i = 0; i < n; ++i) order.push_back(i);
    return order;
  }
  // mt19937_64's output sequence is fixed by the standard; we take `% k` ourselves rather
  // than use uniform_int_distribution (whose algorithm differs between libraries).
  std::mt19937_64 rng(Mix64(seed ^ Mix64(static_cast<uint64_t>(epoch) + 0x5eed)));
  std::vector<int64_t> buffer;
  buffer.reserve(static_cast<size_t>(std::min(shuffle_buffer, n)));
  int64_t next = 0;
  while (next < n && static_cast<int64_t>(buffer.size()) < shuffle_buffer) buffer.push_back(next++);
  while (!buffer.empty()) {
    const size_t j = static_cast<size_t>(rng() % buffer.size());
    order.push_back(buffer[j]);
    if (next < n) {
      buffer[j] = next++;
    } else {
      buffer[j] = buffer.back();
      buffer.pop_back();
    }
  }
  return order;
}

}  // namespace downpour::data
