// mean_file.h — the mean image: computing it over an LMDB and its file format.
//
// File format (little-endian): uint32 magic 0x4E4D5044 ("DPMN"), uint32 version (1),
// int32 channels, height, width, then channels*height*width float32, planar c x h x w.
//
// Thread-safety: free functions. Ownership: outputs are caller-owned and replaced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::data {

inline constexpr uint32_t kMeanFileMagic = 0x4E4D5044;  // "DPMN"
inline constexpr uint32_t kMeanFileVersion = 1;

struct MeanImage {
  int c = 0, h = 0, w = 0;
  std::vector<float> values;  // [c, h, w]
};

// Mean over every record of an LMDB (encoded ones decoded). All records must share one
// shape; the first that does not is kInvalidArgument naming its key and both shapes.
Status ComputeMean(const std::string& db_path, MeanImage* out);

// Writes atomically (temp file + rename); errors name the path.
Status WriteMeanFile(const MeanImage& mean, const std::string& path);
// Reads and checks magic, version, sizes; errors name the path and the bad values.
Status ReadMeanFile(const std::string& path, MeanImage* out);

}  // namespace downpour::data
