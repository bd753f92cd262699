// byte_batch.h — a training batch as bytes: each image's crop window of its uint8 record, with
// where the crop sits and whether it is mirrored, normalised (mean, mirror, scale) only where
// it is consumed. A GPU worker uploads these bytes, a quarter of the floats' (AlexNet at batch 128:
// 20 MB instead of 79 MB), one step ahead, and normalises them with a kernel
// (client/engine/layer.h Backend::NormalizeInput); data/loader.h yields them
// (LoaderOptions::byte_batches). docs/architecture.md "Input as bytes".
//
// The arithmetic is data/transform.h's, so a byte batch normalised anywhere equals the float batch
// the loader would have made from the same records, bit for bit:
//   out[i][c][y][x] = inside ? (float(pixels[i][c][y][x']) - mean(c, y0 + y, x0 + x')) * scale : 0
// with x' = mirror ? w - 1 - x : x, and inside when (y0 + y, x0 + x') is in the record (a crop
// with padding reaches past its edges; those pixels are 0 in the output, as the loader's); the
// mean is the mean image at that record pixel, or a per-channel value.
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace downpour {

// Where image i's crop starts in its record (negative, or reaching past the end, with padding),
// the record's size, and whether the crop is flipped. Plain int32 so a device kernel reads them
// as they are.
struct CropWindow {
  int32_t y0 = 0, x0 = 0;
  int32_t record_h = 0, record_w = 0;  // with a mean image: its size (the loader checks each record)
  int32_t mirror = 0;                  // 0 or 1
};

// What turns a byte batch into the net's input; fixed for a run.
struct InputNormalization {
  int channels = 0, height = 0, width = 0;  // the crop, c × h × w: the net's input
  std::vector<float> mean_image;            // c × mean_h × mean_w, or empty
  int mean_h = 0, mean_w = 0;
  std::vector<float> mean_values;  // without a mean image: 1 (all channels) or c; empty = 0
  float scale = 1.0f;              // multiplies (pixel - mean)

  int64_t image_bytes() const { return int64_t{channels} * height * width; }
  // The sizes agree with each other (a positive crop, a mean image of c × mean_h × mean_w floats,
  // 0, 1 or c mean values); otherwise InvalidArgument naming `what` and the sizes.
  Status Check(const char* what) const;
};

// n images: `pixels` is n × c × h × w bytes, image i's crop window as stored (rows and columns in
// the record's order, not mirrored; bytes outside the record are ignored), `windows` n entries.
// Both are borrowed.
struct ByteBatch {
  const uint8_t* pixels = nullptr;
  const CropWindow* windows = nullptr;
  int n = 0;
};

// The host's normalisation: `out` gets n × c × h × w floats (the formula above). With a mean image
// every window's record size must be the mean image's (CHECKed).
void NormalizeByteBatch(const InputNormalization& norm, const ByteBatch& batch, float* out);

}  // namespace downpour
