// image.cc — JPEG via the TurboJPEG API, PNG via libpng's simplified API, bilinear resize.
#include "data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

namespace downpour::data {
namespace {

// An interleaved (HWC) image of c × h × w bytes, zeroed, for a decoder to fill.
Image HwcImage(int c, int h, int w) {
  Image img;
  img.c = c;
  img.h = h;
  img.w = w;
  img.layout = Layout::kHwc;
  img.pixels.resize(size_t(c) * h * w);
  return img;
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

Image ToHwc(const Image& in) { return in.layout == Layout::kHwc ? in : ToLayout(in, Layout::kHwc); }

// CMYK and YCCK JPEGs (print workflows, Photoshop). libjpeg-turbo decodes both to its CMYK
// pixel format: the four components as stored in the file (YCCK converted back to CMYK), not
// inverted. Adobe's applications, which write nearly all such files (they carry an Adobe
// APP14 marker), store CMYK inverted: 255 = no ink, 0 = full ink. With the components as
// decoded, then, R = C*K/255, G = M*K/255, B = Y*K/255, which is also what OpenCV's imread
// (and so Caffe's convert_imageset) computes. Greyscale is the JPEG luma of that colour,
// 0.299 R + 0.587 G + 0.114 B, as libjpeg takes for a colour JPEG decoded to greyscale.
Status DecodeCmykJpeg(void* tj, std::string_view bytes, int w, int h, int want_channels, const std::string& what,
                      Image* out) {
  std::vector<uint8_t> cmyk(size_t(4) * w * h);
  if (tjDecompress2(tj, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), cmyk.data(), w, 0, h,
                    TJPF_CMYK, TJFLAG_STOPONWARNING) != 0) {
    return Corrupt("{}: corrupt CMYK JPEG ({} bytes, {}x{}): {}", what, bytes.size(), w, h, tjGetErrorStr2(tj));
  }
  const int channels = want_channels != 0 ? want_channels : 3;
  Image img = HwcImage(channels, h, w);
  const size_t n = size_t(w) * h;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &cmyk[4 * i];
    const int k = p[3];
    const int r = (p[0] * k + 127) / 255, g = (p[1] * k + 127) / 255, b = (p[2] * k + 127) / 255;
    if (channels == 1) {
      img.pixels[i] = static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
    } else {
      img.pixels[3 * i] = static_cast<uint8_t>(b);
      img.pixels[3 * i + 1] = static_cast<uint8_t>(g);
      img.pixels[3 * i + 2] = static_cast<uint8_t>(r);
    }
  }
  *out = std::move(img);
  return Status::Ok();
}

}  // namespace

Image ToLayout(const Image& in, Layout layout) {
  if (in.layout == layout) return in;
  Image out;
  out.c = in.c;
  out.h = in.h;
  out.w = in.w;
  out.layout = layout;
  out.pixels.resize(in.pixels.size());
  for (int ch = 0; ch < in.c; ++ch)
    for (int y = 0; y < in.h; ++y)
      for (int x = 0; x < in.w; ++x)
        out.pixels[ch * out.ChannelStride() + y * out.RowStride() + x * out.ColStride()] =
            in.At(ch, y, x);
  return out;
}

Status DecodeJpeg(std::string_view bytes, int want_channels, const std::string& what,
                  Image* out) {
  TjHandle tj(tjInitDecompress());
  if (!tj) return Internal("tjInitDecompress failed");
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  if (tjDecompressHeader3(tj.get(), src, bytes.size(), &w, &h, &subsamp, &colorspace) != 0) {
    return Corrupt("{}: not a readable JPEG ({} bytes): {}", what, bytes.size(),
                   tjGetErrorStr2(tj.get()));
  }
  if (w <= 0 || h <= 0 || w > 65536 || h > 65536) {
    return Corrupt("{}: JPEG has bad size {}x{}", what, w, h);
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return DecodeCmykJpeg(tj.get(), bytes, w, h, want_channels, what, out);
  }
  int channels = want_channels != 0 ? want_channels : (colorspace == TJCS_GRAY ? 1 : 3);
  Image img = HwcImage(channels, h, w);
  const int pf = channels == 1 ? TJPF_GRAY : TJPF_BGR;
  // TJFLAG_STOPONWARNING: a truncated or damaged stream is an error, not a grey half-image.
  if (tjDecompress2(tj.get(), src, bytes.size(), img.pixels.data(), w, 0, h, pf,
                    TJFLAG_STOPONWARNING) != 0) {
    return Corrupt("{}: corrupt JPEG ({} bytes, {}x{}): {}", what, bytes.size(), w, h,
                   tjGetErrorStr2(tj.get()));
  }
  *out = std::move(img);
  return Status::Ok();
}

Status DecodePng(std::string_view bytes, int want_channels, const std::string& what,
                 Image* out) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    return Corrupt("{}: not a readable PNG ({} bytes): {}", what, bytes.size(), png.message);
  }
  const bool grey_src = (png.format & PNG_FORMAT_FLAG_COLOR) == 0;
  const int channels = want_channels != 0 ? want_channels : (grey_src ? 1 : 3);
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_BGR;
  Image img = HwcImage(channels, static_cast<int>(png.height), static_cast<int>(png.width));
  img.pixels.resize(PNG_IMAGE_SIZE(png));  // libpng's own size (the same, row padding aside)
  if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
    const std::string msg = png.message;
    png_image_free(&png);
    return Corrupt("{}: corrupt PNG ({} bytes): {}", what, bytes.size(), msg);
  }
  *out = std::move(img);
  return Status::Ok();
}

Status DecodeImage(std::string_view bytes, int want_channels, const std::string& what,
                   Image* out) {
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8) {
    return DecodeJpeg(bytes, want_channels, what, out);
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    return DecodePng(bytes, want_channels, what, out);
  }
  return Corrupt("{}: encoded image is neither JPEG nor PNG ({} bytes)", what, bytes.size());
}

Status EncodedChannels(std::string_view bytes, const std::string& what, int* channels) {
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF && static_cast<uint8_t>(bytes[1]) == 0xD8) {
    TjHandle tj(tjInitDecompress());
    if (!tj) return Internal("tjInitDecompress failed");
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj.get(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), &w, &h,
                            &subsamp, &colorspace) != 0) {
      return Corrupt("{}: not a readable JPEG ({} bytes): {}", what, bytes.size(), tjGetErrorStr2(tj.get()));
    }
    *channels = colorspace == TJCS_GRAY ? 1 : 3;
    return Status::Ok();
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    png_image png;
    std::memset(&png, 0, sizeof(png));
    png.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
      return Corrupt("{}: not a readable PNG ({} bytes): {}", what, bytes.size(), png.message);
    }
    *channels = (png.format & PNG_FORMAT_FLAG_COLOR) == 0 ? 1 : 3;
    png_image_free(&png);
    return Status::Ok();
  }
  return Corrupt("{}: encoded image is neither JPEG nor PNG ({} bytes)", what, bytes.size());
}

Status EncodeJpeg(const Image& in, int quality, std::string* out) {
  if (in.c != 1 && in.c != 3) return InvalidArgument("EncodeJpeg: {} channels, need 1 or 3", in.c);
  const Image hwc = ToHwc(in);
  TjHandle tj(tjInitCompress());
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int pf = in.c == 1 ? TJPF_GRAY : TJPF_BGR;
  const int subsamp = in.c == 1 ? TJSAMP_GRAY : TJSAMP_420;
  if (tjCompress2(tj.get(), hwc.pixels.data(), in.w, 0, in.h, pf, &buf, &size, subsamp,
                  quality, TJFLAG_FASTDCT) != 0) {
    const std::string msg = tjGetErrorStr2(tj.get());
    tjFree(buf);
    return Internal("JPEG encode failed: {}", msg);
  }
  out->assign(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  return Status::Ok();
}

Status EncodePng(const Image& in, std::string* out) {
  if (in.c != 1 && in.c != 3) return InvalidArgument("EncodePng: {} channels, need 1 or 3", in.c);
  const Image hwc = ToHwc(in);
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(in.w);
  png.height = static_cast<png_uint_32>(in.h);
  png.format = in.c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_BGR;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, hwc.pixels.data(), 0, nullptr)) {
    return Internal("PNG size query failed: {}", png.message);
  }
  out->resize(size);
  if (!png_image_write_to_memory(&png, out->data(), &size, 0, hwc.pixels.data(), 0, nullptr)) {
    return Internal("PNG encode failed: {}", png.message);
  }
  out->resize(size);
  return Status::Ok();
}

Status WritePngFile(const Image& in, const std::string& path) {
  std::string bytes;
  DP_RETURN_IF_ERROR(EncodePng(in, &bytes));
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) return IoError("{}: cannot write PNG", path);
  return Status::Ok();
}

Status ReadFileBytes(const std::string& path, std::string* out) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("{}: is a directory, not a file", path);
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("{}: cannot open", path);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  // A pipe or device has no size to read up to.
  if (size < 0) return InvalidArgument("{}: not a regular file (no size)", path);
  f.seekg(0);
  out->resize(static_cast<size_t>(size));
  f.read(out->data(), size);
  if (!f.good()) return IoError("{}: read failed", path);
  return Status::Ok();
}

Image ResizeBilinear(const Image& in, int out_h, int out_w) {
  Image out;
  out.c = in.c;
  out.h = out_h;
  out.w = out_w;
  out.layout = in.layout;
  out.pixels.resize(size_t(in.c) * out_h * out_w);
  const double sy = double(in.h) / out_h, sx = double(in.w) / out_w;
  for (int y = 0; y < out_h; ++y) {
    const double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, double(in.h - 1));
    const int y0 = static_cast<int>(fy), y1 = std::min(y0 + 1, in.h - 1);
    const double ay = fy - y0;
    for (int x = 0; x < out_w; ++x) {
      const double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, double(in.w - 1));
      const int x0 = static_cast<int>(fx), x1 = std::min(x0 + 1, in.w - 1);
      const double ax = fx - x0;
      for (int ch = 0; ch < in.c; ++ch) {
        const double v = (1 - ay) * ((1 - ax) * in.At(ch, y0, x0) + ax * in.At(ch, y0, x1)) +
                         ay * ((1 - ax) * in.At(ch, y1, x0) + ax * in.At(ch, y1, x1));
        out.pixels[ch * out.ChannelStride() + y * out.RowStride() + x * out.ColStride()] =
            static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

}  // namespace downpour::data
