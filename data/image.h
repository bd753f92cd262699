// image.h — 8-bit images in memory and the codecs the pipeline needs: JPEG (libjpeg-turbo),
// PNG (libpng), bilinear resize.
//
// An Image is uint8 c x h x w in one of two layouts: kChw (planar, how Caffe stores raw
// Datum data) or kHwc (interleaved, how decoders produce pixels). Colour images are BGR,
// Caffe's (OpenCV's) channel order, so records written by either side agree.
//
// Thread-safety: free functions; each call creates its own codec handle, so any number of
// threads may decode at once. Ownership: outputs are caller-owned and replaced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour::data {

enum class Layout { kChw, kHwc };

struct Image {
  int c = 0, h = 0, w = 0;
  Layout layout = Layout::kChw;
  std::vector<uint8_t> pixels;  // c*h*w bytes in `layout`

  // Byte strides of one channel, one row and one column step.
  int64_t ChannelStride() const { return layout == Layout::kChw ? int64_t{h} * w : 1; }
  int64_t RowStride() const { return layout == Layout::kChw ? w : int64_t{w} * c; }
  int64_t ColStride() const { return layout == Layout::kChw ? 1 : c; }
  uint8_t At(int ch, int y, int x) const {
    return pixels[ch * ChannelStride() + y * RowStride() + x * ColStride()];
  }
};

// Returns the image in the other layout (a copy; same pixels).
Image ToLayout(const Image& in, Layout layout);

// Decodes JPEG bytes into an HWC image: 1 channel for greyscale JPEGs, else 3 (BGR).
// want_channels (0 = as stored, 1 or 3) forces greyscale or colour. CMYK and YCCK JPEGs are
// converted to BGR with Adobe's inverted-CMYK convention, as OpenCV does (image.cc says how).
// `what` names the source (file or LMDB key) in errors.
Status DecodeJpeg(std::string_view bytes, int want_channels, const std::string& what,
                  Image* out);
// Decodes PNG bytes into an HWC image (1 or 3 channels, as DecodeJpeg).
Status DecodePng(std::string_view bytes, int want_channels, const std::string& what,
                 Image* out);
// Sniffs the magic bytes and calls DecodeJpeg or DecodePng; anything else is kCorrupt.
Status DecodeImage(std::string_view bytes, int want_channels, const std::string& what,
                   Image* out);
// The channel count DecodeImage(bytes, 0, ...) yields (1 for greyscale, 3 for colour),
// from the header alone.
Status EncodedChannels(std::string_view bytes, const std::string& what, int* channels);

// Encodes an image (any layout, 1 or 3 channels, BGR) as JPEG with the given quality.
Status EncodeJpeg(const Image& in, int quality, std::string* out);
// Encodes an image (any layout, 1 or 3 channels, BGR) as PNG.
Status EncodePng(const Image& in, std::string* out);
// Writes an image as a PNG file; errors name the path.
Status WritePngFile(const Image& in, const std::string& path);
// Reads a whole file into bytes; errors name the path.
Status ReadFileBytes(const std::string& path, std::string* out);

// Bilinear resize (pixel centres aligned, as OpenCV's INTER_LINEAR); keeps the layout.
Image ResizeBilinear(const Image& in, int out_h, int out_w);

}  // namespace downpour::data
