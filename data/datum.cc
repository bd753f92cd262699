// datum.cc — Datum validation and views.
#include "data/datum.h"

#include <algorithm>
#include <cmath>

namespace downpour::data {

Status ParseDatum(std::string_view bytes, const std::string& where, caffe::Datum* out) {
  if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Corrupt("{}: not a Caffe Datum ({} bytes, protobuf parse failed)", where,
                   bytes.size());
  }
  // Arbitrary bytes often parse as a message of unknown fields; a real Datum has none.
  if (!out->GetReflection()->GetUnknownFields(*out).empty()) {
    return Corrupt("{}: not a Caffe Datum ({} bytes, fields outside the Datum schema)", where,
                   bytes.size());
  }
  if (out->data().empty() && out->float_data_size() == 0) {
    return Corrupt("{}: not a Caffe Datum (no data and no float_data)", where);
  }
  if (out->encoded()) return Status::Ok();
  const int64_t c = out->channels(), h = out->height(), w = out->width();
  if (c <= 0 || h <= 0 || w <= 0) {
    return Corrupt("{}: raw Datum has bad shape channels={} height={} width={}", where, c, h, w);
  }
  if (!out->data().empty()) {
    if (static_cast<int64_t>(out->data().size()) != c * h * w) {
      return Corrupt("{}: Datum data has {} bytes but channels x height x width = {}x{}x{} = {}",
                     where, out->data().size(), c, h, w, c * h * w);
    }
  } else if (out->float_data_size() != c * h * w) {
    return Corrupt("{}: Datum float_data has {} values but channels x height x width = "
                   "{}x{}x{} = {}", where, out->float_data_size(), c, h, w, c * h * w);
  }
  return Status::Ok();
}

std::string MakeRawDatum(int c, int h, int w, const uint8_t* chw, int label) {
  caffe::Datum d;
  d.set_channels(c);
  d.set_height(h);
  d.set_width(w);
  d.set_data(chw, size_t(c) * h * w);
  d.set_label(label);
  return d.SerializeAsString();
}

std::string MakeEncodedDatum(std::string_view encoded, int c, int h, int w, int label) {
  caffe::Datum d;
  d.set_channels(c);
  d.set_height(h);
  d.set_width(w);
  d.set_data(encoded.data(), encoded.size());
  d.set_label(label);
  d.set_encoded(true);
  return d.SerializeAsString();
}

Status ViewDatum(const caffe::Datum& datum, int want_channels, const std::string& where,
                 Image* scratch, ImageView* out) {
  ImageView v;
  if (datum.encoded()) {
    DP_RETURN_IF_ERROR(DecodeImage(datum.data(), want_channels, where, scratch));
    v.c = scratch->c;
    v.h = scratch->h;
    v.w = scratch->w;
    v.channel_stride = scratch->ChannelStride();
    v.row_stride = scratch->RowStride();
    v.col_stride = scratch->ColStride();
    v.u8 = scratch->pixels.data();
  } else {
    v.c = datum.channels();
    v.h = datum.height();
    v.w = datum.width();
    v.channel_stride = int64_t{v.h} * v.w;
    v.row_stride = v.w;
    v.col_stride = 1;
    if (!datum.data().empty()) {
      v.u8 = reinterpret_cast<const uint8_t*>(datum.data().data());
    } else {
      v.f32 = datum.float_data().data();
    }
    if (want_channels != 0 && want_channels != v.c) {
      return Corrupt("{}: raw record has {} channels, the loader wants {}", where, v.c,
                     want_channels);
    }
  }
  *out = v;
  return Status::Ok();
}

Image ViewToImage(const ImageView& v) {
  Image img;
  img.c = v.c;
  img.h = v.h;
  img.w = v.w;
  img.layout = Layout::kChw;
  img.pixels.resize(size_t(v.c) * v.h * v.w);
  size_t i = 0;
  for (int ch = 0; ch < v.c; ++ch)
    for (int y = 0; y < v.h; ++y)
      for (int x = 0; x < v.w; ++x) {
        const int64_t off = ch * v.channel_stride + y * v.row_stride + x * v.col_stride;
        img.pixels[i++] = v.u8 ? v.u8[off]
                               : static_cast<uint8_t>(std::clamp(std::lround(v.f32[off]), 0L, 255L));
      }
  return img;
}

}  // namespace downpour::data
