// mean_file.h — the mean image: computing it over an LMDB and its file format.
//
// File format: the project's tensor file (common/tensor_file.h: magic "DPTF", version, CRCs)
// holding one tensor named "mean" of shape [c, h, w] (planar float32) and the metadata
// kind = "mean_image" (plus source = the LMDB path and records = how many were averaged when
// computed by ComputeMean).
//
// Thread-safety: free functions. Ownership: outputs are caller-owned and replaced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::data {

inline constexpr char kMeanTensorName[] = "mean";
inline constexpr char kMeanFileKind[] = "mean_image";

struct MeanImage {
  int c = 0, h = 0, w = 0;
  std::vector<float> values;  // [c, h, w]
  std::string source;         // the LMDB it was computed from (metadata; may be empty)
  int64_t records = 0;        // records averaged (metadata; 0 = unknown)
};

// Mean over every record of an LMDB (encoded ones decoded). All records must share one
// shape; the first that does not is kInvalidArgument naming its key and both shapes.
Status ComputeMean(const std::string& db_path, MeanImage* out);

// Writes atomically (WriteTensorFile: temp file, fsync, rename); errors name the path.
Status WriteMeanFile(const MeanImage& mean, const std::string& path);
// Reads and checks the tensor file (magic, version, CRCs), that it is a mean image and that
// the "mean" tensor is [c, h, w]; errors name the path and the bad values.
Status ReadMeanFile(const std::string& path, MeanImage* out);

}  // namespace downpour::data
