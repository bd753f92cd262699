// shard.h — which records a worker reads, and in what order, epoch after epoch.
//
// A worker reads either its own LMDB (shard_count 1) or its slice i of W of a shared one:
// the contiguous record range [n*i/W, n*(i+1)/W) in key order, so the W slices partition
// the records exactly (sizes differ by at most one) and each slice is one sequential read.
// Within a slice, each epoch's order is a windowed shuffle (a shuffle buffer of B records,
// like tf.data's): sequential-ish reads, decorrelated order, a pure function of
// (seed, epoch, slice size, B). B = 0 keeps key order; B >= slice size is a full shuffle.
//
// Thread-safety: pure functions. Ownership: results are values.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace downpour::data {

struct SliceRange {
  int64_t begin = 0, end = 0;  // record indices in key order, [begin, end)
  int64_t size() const { return end - begin; }
};

// Slice `index` of `count` over n records; index/count are checked by the caller
// (0 <= index < count).
SliceRange SliceOf(int64_t n, int index, int count);

// The order in which epoch `epoch` visits the slice: a permutation of 0..n-1.
std::vector<int64_t> EpochOrder(int64_t n, int64_t shuffle_buffer, uint64_t seed, int64_t epoch);

}  // namespace downpour::data
