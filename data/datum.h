// datum.h — Caffe Datum records: validation, building, and a view of their pixels.
//
// A record is a serialized caffe::Datum (data/caffe.proto). Raw records hold uint8
// C x H x W (planar, BGR for colour) in `data`, or float C x H x W in `float_data`;
// encoded records hold a JPEG/PNG file in `data` (Caffe leaves channels/height/width unset
// for those; we set them, Caffe ignores them).
//
// Thread-safety: free functions; DecodedImage is a single-thread value. Ownership:
// a DecodedImage's view points into the Datum it was decoded from or into its own decode
// buffer, so it is valid while both live and are unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "data/caffe.pb.h"
#include "data/image.h"

namespace downpour::data {

// Parses and validates one record. `where` names it in errors ("LMDB <path> key <key>").
// A record that protobuf cannot parse, that carries fields a Datum does not have, or that
// has no pixels is kCorrupt "not a Caffe Datum"; a raw record whose byte (or float) count
// disagrees with channels x height x width is kCorrupt naming all four numbers.
Status ParseDatum(std::string_view bytes, const std::string& where, caffe::Datum* out);

// Serialized raw record: uint8 pixels planar c x h x w.
std::string MakeRawDatum(int c, int h, int w, const uint8_t* chw, int label);
// Serialized encoded record: a JPEG or PNG file; c/h/w are recorded for inspection.
std::string MakeEncodedDatum(std::string_view encoded, int c, int h, int w, int label);

// Pixels of one record, ready for cropping: strides in elements; exactly one of u8/f32 set.
struct ImageView {
  int c = 0, h = 0, w = 0;
  int64_t channel_stride = 0, row_stride = 0, col_stride = 0;
  const uint8_t* u8 = nullptr;
  const float* f32 = nullptr;
};

// Turns a parsed Datum into a view, decoding JPEG/PNG into `scratch` when encoded.
// want_channels (0 = as stored) forces greyscale/colour decoding of encoded records.
Status ViewDatum(const caffe::Datum& datum, int want_channels, const std::string& where,
                 Image* scratch, ImageView* out);

// Copies a view into an owned planar uint8 image (float records are rounded and clamped).
Image ViewToImage(const ImageView& v);

}  // namespace downpour::data
