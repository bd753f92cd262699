// transform.h — augmentation of one record into the net's input: crop, mirror, mean
// subtraction, scale, uint8 -> float. Caffe's DataTransformer semantics:
//   out[c][y][x] = (src[c][y0+y][x0+x'] - mean) * scale,  x' = mirror ? crop_w-1-x : x,
// where mean is the mean image at the same source pixel (mean image c x H x W, the stored
// record size) or a per-channel value.
//
// Randomness is a pure function of (seed, epoch, position in the stream), so a run is
// reproducible whatever the number of loader threads and however they interleave.
//
// Thread-safety: pure functions over caller buffers. Ownership: nothing is retained.
#pragma once

#include <cstdint>
#include <vector>

#include "data/datum.h"

namespace downpour::data {

// Where the crop starts and whether it is mirrored.
struct CropChoice {
  int y0 = 0, x0 = 0;
  bool mirror = false;
};

// 64-bit mixing hash (SplitMix64 finaliser) used to derive per-record random numbers.
uint64_t Mix64(uint64_t x);

// Training: offsets uniform in [0, h-crop] x [0, w-crop] and a fair coin for mirroring
// (when `mirror` is on), all from Mix64 of (seed, epoch, position).
// Evaluation (train=false): the centre crop, never mirrored. crop_h/crop_w must be <= h/w.
CropChoice ChooseCrop(int h, int w, int crop_h, int crop_w, bool train, bool mirror,
                      uint64_t seed, int64_t epoch, int64_t position);

struct MeanSpec {
  // Mean image, planar c x H x W floats (H x W = the record size), or empty.
  const float* image = nullptr;
  int image_c = 0, image_h = 0, image_w = 0;
  // Per-channel means (size c, or 1 broadcast to all channels); used when image is null.
  std::vector<float> values;
  float scale = 1.0f;  // applied after mean subtraction (e.g. 1/255 or 0.00390625)
};

// Writes one image, planar c x crop_h x crop_w floats, into dst. The view and the mean image
// must have the same c/h/w (checked by the caller). The crop may reach past the image's edges
// (y0 / x0 negative, or y0 + crop_h > h: a padded crop); pixels outside the image are 0 in dst.
void TransformToFloat(const ImageView& src, const CropChoice& crop, int crop_h, int crop_w,
                      const MeanSpec& mean, float* dst);

// The byte form of the same image (common/byte_batch.h): its crop window, planar c x crop_h x
// crop_w bytes in the record's orientation (not mirrored), 0 where the crop reaches past the edges;
// `crop` goes with it as its CropWindow. Only for uint8 views (src.u8 set). Row copies for planar
// records: no per-pixel arithmetic on the host.
void CropToBytes(const ImageView& src, const CropChoice& crop, int crop_h, int crop_w, uint8_t* dst);

}  // namespace downpour::data
