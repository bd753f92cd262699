// transform.cc — crop/mirror/mean/scale. The planar uint8 path (raw records, the common
// case) runs over contiguous rows so the compiler vectorises it; decoded JPEGs (interleaved)
// and float records take the strided path.
#include "data/transform.h"

#include <algorithm>
#include <cstring>

#include "common/status.h"

namespace downpour::data {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

CropChoice ChooseCrop(int h, int w, int crop_h, int crop_w, bool train, bool mirror,
                      uint64_t seed, int64_t epoch, int64_t position) {
  CropChoice c;
  if (!train) {
    c.y0 = (h - crop_h) / 2;
    c.x0 = (w - crop_w) / 2;
    return c;
  }
  const uint64_t r = Mix64(Mix64(Mix64(seed) ^ static_cast<uint64_t>(epoch)) ^
                           static_cast<uint64_t>(position));
  const uint64_t r2 = Mix64(r);
  c.y0 = static_cast<int>(r % static_cast<uint64_t>(h - crop_h + 1));
  c.x0 = static_cast<int>((r >> 32) % static_cast<uint64_t>(w - crop_w + 1));
  c.mirror = mirror && (r2 & 1);
  return c;
}

namespace {

// A crop that reaches past the edges (padding): every pixel checked, outside ones 0.
template <typename T>
void TransformPadded(const ImageView& src, const T* pixels, const CropChoice& crop, int crop_h, int crop_w,
                     const MeanSpec& mean, float* dst) {
  for (int ch = 0; ch < src.c; ++ch) {
    const float mv = mean.values.empty() ? 0.f
                                         : mean.values[mean.values.size() == 1 ? 0 : size_t(ch)];
    for (int y = 0; y < crop_h; ++y) {
      const int sy = crop.y0 + y;
      float* out = dst + (int64_t{ch} * crop_h + y) * crop_w;
      if (sy < 0 || sy >= src.h) {
        for (int x = 0; x < crop_w; ++x) out[x] = 0.f;
        continue;
      }
      const T* row = pixels + ch * src.channel_stride + sy * src.row_stride;
      const float* mrow = mean.image ? mean.image + (int64_t{ch} * src.h + sy) * src.w : nullptr;
      for (int x = 0; x < crop_w; ++x) {
        const int sx = crop.x0 + (crop.mirror ? crop_w - 1 - x : x);
        if (sx < 0 || sx >= src.w) {
          out[x] = 0.f;
          continue;
        }
        const float m = mrow ? mrow[sx] : mv;
        out[x] = (static_cast<float>(row[sx * src.col_stride]) - m) * mean.scale;
      }
    }
  }
}

template <typename T>
void TransformStrided(const ImageView& src, const T* pixels, const CropChoice& crop, int crop_h,
                      int crop_w, const MeanSpec& mean, float* dst) {
  for (int ch = 0; ch < src.c; ++ch) {
    const float mv = mean.values.empty() ? 0.f
                                         : mean.values[mean.values.size() == 1 ? 0 : size_t(ch)];
    for (int y = 0; y < crop_h; ++y) {
      const int sy = crop.y0 + y;
      const T* row = pixels + ch * src.channel_stride + sy * src.row_stride;
      const float* mrow = mean.image ? mean.image + (int64_t{ch} * src.h + sy) * src.w : nullptr;
      float* out = dst + (int64_t{ch} * crop_h + y) * crop_w;
      for (int x = 0; x < crop_w; ++x) {
        const int sx = crop.x0 + (crop.mirror ? crop_w - 1 - x : x);
        const float m = mrow ? mrow[sx] : mv;
        out[x] = (static_cast<float>(row[sx * src.col_stride]) - m) * mean.scale;
      }
    }
  }
}

// Planar uint8: contiguous source rows, the hot path for raw records.
void TransformPlanarU8(const ImageView& src, const CropChoice& crop, int crop_h, int crop_w,
                       const MeanSpec& mean, float* __restrict dst) {
  const float scale = mean.scale;
  for (int ch = 0; ch < src.c; ++ch) {
    const float mv = mean.values.empty() ? 0.f
                                         : mean.values[mean.values.size() == 1 ? 0 : size_t(ch)];
    for (int y = 0; y < crop_h; ++y) {
      const int sy = crop.y0 + y;
      const uint8_t* __restrict row = src.u8 + ch * src.channel_stride + int64_t{sy} * src.w + crop.x0;
      float* __restrict out = dst + (int64_t{ch} * crop_h + y) * crop_w;
      if (mean.image) {
        const float* __restrict mrow = mean.image + (int64_t{ch} * src.h + sy) * src.w + crop.x0;
        if (crop.mirror) {
          for (int x = 0; x < crop_w; ++x)
            out[x] = (float(row[crop_w - 1 - x]) - mrow[crop_w - 1 - x]) * scale;
        } else {
          for (int x = 0; x < crop_w; ++x) out[x] = (float(row[x]) - mrow[x]) * scale;
        }
      } else if (crop.mirror) {
        for (int x = 0; x < crop_w; ++x) out[x] = (float(row[crop_w - 1 - x]) - mv) * scale;
      } else {
        for (int x = 0; x < crop_w; ++x) out[x] = (float(row[x]) - mv) * scale;
      }
    }
  }
}

}  // namespace

void TransformToFloat(const ImageView& src, const CropChoice& crop, int crop_h, int crop_w,
                      const MeanSpec& mean, float* dst) {
  if (crop.y0 < 0 || crop.x0 < 0 || crop.y0 + crop_h > src.h || crop.x0 + crop_w > src.w) {
    if (src.u8 != nullptr) {
      TransformPadded(src, src.u8, crop, crop_h, crop_w, mean, dst);
    } else {
      TransformPadded(src, src.f32, crop, crop_h, crop_w, mean, dst);
    }
  } else if (src.u8 != nullptr && src.col_stride == 1 && src.row_stride == src.w) {
    TransformPlanarU8(src, crop, crop_h, crop_w, mean, dst);
  } else if (src.u8 != nullptr) {
    TransformStrided(src, src.u8, crop, crop_h, crop_w, mean, dst);
  } else {
    TransformStrided(src, src.f32, crop, crop_h, crop_w, mean, dst);
  }
}

void CropToBytes(const ImageView& src, const CropChoice& crop, int crop_h, int crop_w, uint8_t* dst) {
  DP_CHECK(src.u8 != nullptr);
  const bool planar = src.col_stride == 1 && src.row_stride == src.w;
  for (int ch = 0; ch < src.c; ++ch) {
    for (int y = 0; y < crop_h; ++y) {
      const int sy = crop.y0 + y;
      uint8_t* out = dst + (int64_t{ch} * crop_h + y) * crop_w;
      if (sy < 0 || sy >= src.h) {
        std::memset(out, 0, static_cast<size_t>(crop_w));
        continue;
      }
      const uint8_t* row = src.u8 + ch * src.channel_stride + sy * src.row_stride;
      // The columns of the window inside the record, [lo, hi); the rest are padding.
      const int lo = std::clamp(-crop.x0, 0, crop_w), hi = std::clamp(src.w - crop.x0, lo, crop_w);
      std::memset(out, 0, static_cast<size_t>(lo));
      if (planar) {
        std::memcpy(out + lo, row + crop.x0 + lo, static_cast<size_t>(hi - lo));
      } else {
        for (int x = lo; x < hi; ++x) out[x] = row[(crop.x0 + x) * src.col_stride];
      }
      std::memset(out + hi, 0, static_cast<size_t>(crop_w - hi));
    }
  }
}

}  // namespace downpour::data
