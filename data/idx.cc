// idx.cc — IDX reading through zlib (gzread reads raw files transparently).
#include "data/idx.h"

#include <zlib.h>

#include <array>
#include <memory>

namespace downpour::data {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8, 3 dims
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8, 1 dim
// Sanity bound on one dimension: no real IDX file has more than 2^28 items or a 64k-wide
// image; larger values mean a corrupt or wrong file, not a request for 100 GB of memory.
constexpr uint32_t kMaxDim = 1u << 28;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

uint32_t BigEndian32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

Status OpenGz(const std::string& path, GzFile* out) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return NotFound("IDX file {}: cannot open", path);
  gzbuffer(f, 1 << 20);
  out->reset(f);
  return Status::Ok();
}

// Reads exactly n bytes; a short read is a truncated file.
Status ReadExact(gzFile f, const std::string& path, void* dst, size_t n, const char* what) {
  auto* p = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < n) {
    const size_t want = std::min<size_t>(n - done, 1u << 30);
    const int got = gzread(f, p + done, static_cast<unsigned>(want));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      return IoError("IDX file {}: read error in {}: {}", path, what, msg ? msg : "?");
    }
    if (got == 0) {
      return Corrupt("IDX file {}: truncated in {}: expected {} bytes, got {}", path, what, n,
                     done);
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

// Reads `n` bytes into `out`, growing it chunk by chunk as the data arrives: a header that
// claims far more than the file holds (a corrupt or wrong file) is reported as truncated
// instead of first allocating, and zero-filling, all the memory it claims.
Status ReadGrowing(gzFile f, const std::string& path, size_t n, const char* what, std::vector<uint8_t>* out) {
  constexpr size_t kChunk = size_t{64} << 20;
  out->clear();
  size_t done = 0;
  while (done < n) {
    if (out->size() == done) out->resize(done + std::min(kChunk, n - done));
    const int got = gzread(f, out->data() + done, static_cast<unsigned>(out->size() - done));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      return IoError("IDX file {}: read error in {}: {}", path, what, msg ? msg : "?");
    }
    if (got == 0) {
      return Corrupt("IDX file {}: truncated in {}: expected {} bytes, got {}", path, what, n, done);
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

// Reads the magic and `ndims` dimensions, checking the magic.
Status ReadHeader(gzFile f, const std::string& path, uint32_t want_magic, int ndims,
                  std::array<uint32_t, 3>* dims) {
  // Magic first, so a wrong kind of file is reported as such rather than as truncated.
  unsigned char buf[16];
  DP_RETURN_IF_ERROR(ReadExact(f, path, buf, 4, "magic"));
  const uint32_t magic = BigEndian32(buf);
  if (magic != want_magic) {
    return Corrupt("IDX file {}: bad magic 0x{:08x}, expected 0x{:08x} ({})", path, magic,
                   want_magic, want_magic == kIdxImagesMagic ? "idx3 uint8 images"
                                                             : "idx1 uint8 labels");
  }
  DP_RETURN_IF_ERROR(ReadExact(f, path, buf + 4, 4 * static_cast<size_t>(ndims), "header"));
  for (int i = 0; i < ndims; ++i) {
    (*dims)[i] = BigEndian32(buf + 4 + 4 * i);
    if ((*dims)[i] > kMaxDim) {
      return Corrupt("IDX file {}: dimension {} is {}, larger than the limit {}", path, i,
                     (*dims)[i], kMaxDim);
    }
  }
  return Status::Ok();
}

// After the payload the file must end: trailing bytes mean the header lies about the size.
Status ExpectEnd(gzFile f, const std::string& path, size_t payload) {
  unsigned char extra;
  const int got = gzread(f, &extra, 1);
  if (got > 0) {
    return Corrupt("IDX file {}: trailing bytes after the {} bytes the header declares", path,
                   payload);
  }
  return Status::Ok();
}

}  // namespace

Status ReadIdxImages(const std::string& path, IdxImages* out) {
  GzFile f;
  DP_RETURN_IF_ERROR(OpenGz(path, &f));
  std::array<uint32_t, 3> dims{};
  DP_RETURN_IF_ERROR(ReadHeader(f.get(), path, kIdxImagesMagic, 3, &dims));
  if (dims[1] == 0 || dims[2] == 0 || dims[1] > 65536 || dims[2] > 65536) {
    return Corrupt("IDX file {}: bad image size {}x{}", path, dims[1], dims[2]);
  }
  const size_t bytes = size_t{dims[0]} * dims[1] * dims[2];
  IdxImages result;
  result.count = dims[0];
  result.rows = dims[1];
  result.cols = dims[2];
  DP_RETURN_IF_ERROR(ReadGrowing(f.get(), path, bytes, "pixels", &result.pixels));
  DP_RETURN_IF_ERROR(ExpectEnd(f.get(), path, bytes));
  *out = std::move(result);
  return Status::Ok();
}

Status ReadIdxLabels(const std::string& path, std::vector<uint8_t>* out) {
  GzFile f;
  DP_RETURN_IF_ERROR(OpenGz(path, &f));
  std::array<uint32_t, 3> dims{};
  DP_RETURN_IF_ERROR(ReadHeader(f.get(), path, kIdxLabelsMagic, 1, &dims));
  std::vector<uint8_t> labels;
  DP_RETURN_IF_ERROR(ReadGrowing(f.get(), path, dims[0], "labels", &labels));
  DP_RETURN_IF_ERROR(ExpectEnd(f.get(), path, labels.size()));
  *out = std::move(labels);
  return Status::Ok();
}

}  // namespace downpour::data
