// idx.h — readers for IDX files (the MNIST / Fashion-MNIST format), gzipped or raw.
//
// IDX layout (big-endian): magic 0x00 0x00 <type> <ndims>, then ndims uint32 dimensions,
// then the data. Images: type 0x08 (uint8), 3 dims [count, rows, cols], magic 0x00000803.
// Labels: type 0x08, 1 dim [count], magic 0x00000801. A file whose name ends in anything
// is opened with zlib's gzopen, which reads both gzipped and uncompressed files.
//
// Thread-safety: free functions with no shared state; safe to call from any thread.
// Ownership: results are written into caller-owned outputs (replaced, not appended).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::data {

// One IDX image file in memory: pixels is count x rows x cols uint8, row-major.
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
};

// Reads an idx3-ubyte image file (gzipped or raw). Errors name the file and the bad
// magic / dimension / size values; a truncated file is kCorrupt.
Status ReadIdxImages(const std::string& path, IdxImages* out);

// Reads an idx1-ubyte label file (gzipped or raw) into one uint8 label per item.
Status ReadIdxLabels(const std::string& path, std::vector<uint8_t>* out);

}  // namespace downpour::data
