// byte_batch.cc — see byte_batch.h.
#include "common/byte_batch.h"

#include <algorithm>

namespace downpour {

Status InputNormalization::Check(const char* what) const {
  if (channels <= 0 || height <= 0 || width <= 0)
    return InvalidArgument("{}: crop {}x{}x{}: every size must be positive", what, channels, height, width);
  const size_t plane = size_t(channels) * size_t(std::max(mean_h, 0)) * size_t(std::max(mean_w, 0));
  if (!mean_image.empty() && (mean_h <= 0 || mean_w <= 0 || mean_image.size() != plane))
    return InvalidArgument("{}: the mean image has {} floats; {}x{}x{} needs {}", what, mean_image.size(), channels,
                           mean_h, mean_w, plane);
  if (mean_values.size() > 1 && mean_values.size() != size_t(channels))
    return InvalidArgument("{}: {} mean values for {} channels (give 1 or {})", what, mean_values.size(), channels,
                           channels);
  return Status::Ok();
}

void NormalizeByteBatch(const InputNormalization& norm, const ByteBatch& batch, float* out) {
  const int c = norm.channels, h = norm.height, w = norm.width;
  for (int i = 0; i < batch.n; ++i) {
    const CropWindow& win = batch.windows[i];
    DP_CHECK(norm.mean_image.empty() || (win.record_h == norm.mean_h && win.record_w == norm.mean_w));
    const uint8_t* image = batch.pixels + int64_t{i} * norm.image_bytes();
    float* dst = out + int64_t{i} * norm.image_bytes();
    for (int ch = 0; ch < c; ++ch) {
      const float mv = norm.mean_values.empty() ? 0.f : norm.mean_values[norm.mean_values.size() == 1 ? 0 : size_t(ch)];
      for (int y = 0; y < h; ++y) {
        const int sy = win.y0 + y;
        const uint8_t* row = image + (int64_t{ch} * h + y) * w;
        float* o = dst + (int64_t{ch} * h + y) * w;
        if (sy < 0 || sy >= win.record_h) {
          for (int x = 0; x < w; ++x) o[x] = 0.f;
          continue;
        }
        const float* mrow =
            norm.mean_image.empty() ? nullptr : norm.mean_image.data() + (int64_t{ch} * norm.mean_h + sy) * norm.mean_w;
        for (int x = 0; x < w; ++x) {
          const int xs = win.mirror ? w - 1 - x : x;
          const int sx = win.x0 + xs;
          if (sx < 0 || sx >= win.record_w) {
            o[x] = 0.f;
            continue;
          }
          const float m = mrow ? mrow[sx] : mv;
          o[x] = (static_cast<float>(row[xs]) - m) * norm.scale;
        }
      }
    }
  }
}

}  // namespace downpour
