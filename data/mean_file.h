// mean_file.h — the mean image: computing it over an LMDB and its file format.
//
// File formats, told apart by content when read:
//   * ours (the default): the project's tensor file (common/tensor_file.h: magic "DPTF",
//     version, CRCs) holding one tensor named "mean" of shape [c, h, w] (planar float32) and
//     the metadata kind = "mean_image" (plus source = the LMDB path and records = how many
//     were averaged when computed by ComputeMean);
//   * Caffe's .binaryproto (compute_image_mean): a serialized caffe.BlobProto
//     (data/caffe.proto) of num 1, channels, height, width — as `shape {dim: 1 dim: c dim: h
//     dim: w}` or the legacy num/channels/height/width fields — and float `data` (or
//     `double_data`) in C x H x W order, BGR for colour like the records. No metadata.
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

// Writes atomically (temp file, fsync, rename); errors name the path. A path ending in
// ".binaryproto" is written in Caffe's format (WriteMeanBinaryproto), any other in ours.
Status WriteMeanFile(const MeanImage& mean, const std::string& path);
// Writes Caffe's format as compute_image_mean does (legacy num = 1, channels, height, width
// and float data), atomically; errors name the path.
Status WriteMeanBinaryproto(const MeanImage& mean, const std::string& path);
// Reads either format: a file starting with "DPTF" is our tensor file (magic, version, CRCs
// checked, kind must be mean_image, the "mean" tensor [c, h, w]); anything else is parsed as
// a Caffe BlobProto (num must be 1, the value count c x h x w). Errors name the path and what
// was wrong, with the values.
Status ReadMeanFile(const std::string& path, MeanImage* out);

}  // namespace downpour::data
