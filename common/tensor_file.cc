// tensor_file.cc — reading and writing the tensor file format described in tensor_file.h.
#include "common/tensor_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <libdeflate.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/env.h"
#include "common/file_io.h"

namespace downpour {
namespace {

static_assert(std::endian::native == std::endian::little,
              "tensor files are little-endian and written with memcpy");

constexpr uint32_t kMaxNameLen = 4096;
constexpr uint32_t kMaxNdim = 8;
constexpr uint32_t kMaxMetaLen = 1u << 20;
constexpr size_t kIoBuffer = 1u << 20;

std::string Errno() { return std::strerror(errno); }

// Buffered sequential writer over a file descriptor that keeps a running CRC of what it
// writes since the last ResetCrc().
class Writer {
 public:
  Writer(int fd, const std::string& path) : fd_(fd), path_(path) { buf_.reserve(kIoBuffer); }

  void ResetCrc() { crc_ = 0; }
  uint32_t crc() const { return crc_; }

  Status Put(const void* p, size_t n) {
    crc_ = Crc32({static_cast<const uint8_t*>(p), n}, crc_);
    if (buf_.size() + n <= kIoBuffer) {
      buf_.insert(buf_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
      return Status::Ok();
    }
    DP_RETURN_IF_ERROR(Flush());
    return WriteFully(fd_, p, n, path_);
  }
  template <typename T>
  Status PutValue(T v) {
    return Put(&v, sizeof(v));
  }
  Status PutString(const std::string& s) {
    DP_RETURN_IF_ERROR(PutValue(static_cast<uint32_t>(s.size())));
    return Put(s.data(), s.size());
  }

  Status Flush() {
    Status s = WriteFully(fd_, buf_.data(), buf_.size(), path_);
    buf_.clear();
    return s;
  }

 private:
  int fd_;
  const std::string& path_;
  std::vector<uint8_t> buf_;
  uint32_t crc_ = 0;
};

// Buffered sequential reader that knows the file size, so every declared length is checked
// against what is left before anything is allocated.
class Reader {
 public:
  Reader(int fd, const std::string& path, uint64_t size) : fd_(fd), path_(path), size_(size) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return size_ - offset_; }
  void ResetCrc() { crc_ = 0; }
  uint32_t crc() const { return crc_; }

  Status Get(void* dst, size_t n, std::string_view field) {
    if (n > remaining()) {
      return Corrupt("{}: truncated at byte {} reading {} ({} bytes needed, {} left)", path_,
                     offset_, field, n, remaining());
    }
    uint8_t* out = static_cast<uint8_t*>(dst);
    size_t left = n;
    while (left > 0) {
      if (pos_ == end_) {
        if (left >= kIoBuffer) {  // large payloads go straight into the destination
          DP_RETURN_IF_ERROR(ReadAll(out, left, field));
          break;
        }
        DP_RETURN_IF_ERROR(Fill(field));
      }
      const size_t k = std::min(left, end_ - pos_);
      std::memcpy(out, buf_.data() + pos_, k);
      pos_ += k;
      out += k;
      left -= k;
    }
    crc_ = Crc32({static_cast<const uint8_t*>(dst), n}, crc_);
    offset_ += n;
    return Status::Ok();
  }
  template <typename T>
  Status GetValue(T* v, std::string_view field) {
    return Get(v, sizeof(T), field);
  }
  Status GetString(std::string* s, uint32_t max_len, std::string_view field) {
    uint32_t len = 0;
    DP_RETURN_IF_ERROR(GetValue(&len, fmt::format("{} length", field)));
    if (len > max_len) {
      return Corrupt("{}: {} length {} at byte {} exceeds the limit {}", path_, field, len,
                     offset_ - 4, max_len);
    }
    s->resize(len);
    return Get(s->data(), len, field);
  }

 private:
  // Refills the buffer with what the file has left past the bytes read from it so far
  // (file_pos_), which runs ahead of offset_ (bytes handed out) while a Get is in progress.
  Status Fill(std::string_view field) {
    if (buf_.empty()) buf_.resize(kIoBuffer);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kIoBuffer, size_ - file_pos_));
    DP_RETURN_IF_ERROR(ReadAll(buf_.data(), want, field));
    pos_ = 0;
    end_ = want;
    return Status::Ok();
  }
  Status ReadAll(uint8_t* p, size_t n, std::string_view field) {
    while (n > 0) {
      const ssize_t r = ::read(fd_, p, std::min(n, size_t{1} << 30));
      if (r < 0) {
        if (errno == EINTR) continue;
        return IoError("{}: read failed in {}: {}", path_, field, Errno());
      }
      if (r == 0) return Corrupt("{}: truncated (file shrank) reading {}", path_, field);
      p += r;
      n -= static_cast<size_t>(r);
      file_pos_ += static_cast<uint64_t>(r);
    }
    return Status::Ok();
  }

  int fd_;
  const std::string& path_;
  uint64_t size_;
  uint64_t offset_ = 0;    // bytes handed out by Get
  uint64_t file_pos_ = 0;  // bytes read from the file (offset_ + what sits in the buffer)
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, end_ = 0;
  uint32_t crc_ = 0;
};

// Product of the dims; -1 if a dim is negative or the product overflows.
int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

Status CheckWritable(const std::string& path, const TensorFile& file) {
  std::set<std::string_view> names;
  for (const auto& [k, v] : file.meta) {
    if (k.size() > kMaxMetaLen || v.size() > kMaxMetaLen) {
      return InvalidArgument("{}: meta \"{}\" is longer than {} bytes", path, k, kMaxMetaLen);
    }
  }
  if (file.tensors.size() > UINT32_MAX) {
    return InvalidArgument("{}: {} tensors exceed the format's limit", path, file.tensors.size());
  }
  for (const NamedTensor& t : file.tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameLen) {
      return InvalidArgument("{}: tensor name \"{}\" must have 1..{} bytes", path, t.name,
                             kMaxNameLen);
    }
    if (!names.insert(t.name).second) {
      return InvalidArgument("{}: duplicate tensor name \"{}\"", path, t.name);
    }
    if (t.shape.size() > kMaxNdim) {
      return InvalidArgument("{}: tensor \"{}\" has {} dims (at most {})", path, t.name,
                             t.shape.size(), kMaxNdim);
    }
    if (ShapeNumel(t.shape) < 0 || static_cast<uint64_t>(ShapeNumel(t.shape)) != t.data.size()) {
      return InvalidArgument("{}: tensor \"{}\" has shape [{}] but {} values", path, t.name,
                             fmt::join(t.shape, ", "), t.data.size());
    }
  }
  return Status::Ok();
}

Status WriteBody(Writer& w, const TensorFile& file) {
  DP_RETURN_IF_ERROR(w.PutValue(kTensorFileMagic));
  DP_RETURN_IF_ERROR(w.PutValue(kTensorFileVersion));
  DP_RETURN_IF_ERROR(w.PutValue(static_cast<uint32_t>(file.meta.size())));
  DP_RETURN_IF_ERROR(w.PutValue(static_cast<uint32_t>(file.tensors.size())));
  for (const auto& [k, v] : file.meta) {
    DP_RETURN_IF_ERROR(w.PutString(k));
    DP_RETURN_IF_ERROR(w.PutString(v));
  }
  DP_RETURN_IF_ERROR(w.PutValue(w.crc()));
  for (const NamedTensor& t : file.tensors) {
    w.ResetCrc();
    DP_RETURN_IF_ERROR(w.PutString(t.name));
    DP_RETURN_IF_ERROR(w.PutValue(static_cast<uint32_t>(t.shape.size())));
    DP_RETURN_IF_ERROR(w.Put(t.shape.data(), t.shape.size() * sizeof(int64_t)));
    DP_RETURN_IF_ERROR(w.PutValue(static_cast<uint64_t>(t.data.size())));
    DP_RETURN_IF_ERROR(w.Put(t.data.data(), t.data.size() * sizeof(float)));
    DP_RETURN_IF_ERROR(w.PutValue(w.crc()));
  }
  return w.Flush();
}

Status ReadBody(Reader& r, const std::string& path, TensorFile* out) {
  uint32_t magic = 0, version = 0, meta_count = 0, tensor_count = 0;
  DP_RETURN_IF_ERROR(r.GetValue(&magic, "magic"));
  if (magic != kTensorFileMagic) {
    return Corrupt("{}: bad magic 0x{:08x} (expected 0x{:08x}, \"DPTF\"): not a downpour tensor file",
                   path, magic, kTensorFileMagic);
  }
  DP_RETURN_IF_ERROR(r.GetValue(&version, "version"));
  if (version != kTensorFileVersion) {
    return Corrupt("{}: bad version {} (this build reads version {})", path, version,
                   kTensorFileVersion);
  }
  DP_RETURN_IF_ERROR(r.GetValue(&meta_count, "meta_count"));
  DP_RETURN_IF_ERROR(r.GetValue(&tensor_count, "tensor_count"));
  for (uint32_t i = 0; i < meta_count; ++i) {
    std::string k, v;
    DP_RETURN_IF_ERROR(r.GetString(&k, kMaxMetaLen, fmt::format("meta key {}", i)));
    DP_RETURN_IF_ERROR(r.GetString(&v, kMaxMetaLen, fmt::format("meta \"{}\" value", k)));
    out->meta[k] = std::move(v);
  }
  const uint32_t header_crc = r.crc();
  uint32_t stored = 0;
  DP_RETURN_IF_ERROR(r.GetValue(&stored, "header_crc"));
  if (stored != header_crc) {
    return Corrupt("{}: crc mismatch in header/meta (stored 0x{:08x}, computed 0x{:08x})", path,
                   stored, header_crc);
  }
  out->tensors.reserve(std::min<uint32_t>(tensor_count, 1u << 16));
  for (uint32_t i = 0; i < tensor_count; ++i) {
    NamedTensor t;
    r.ResetCrc();
    DP_RETURN_IF_ERROR(r.GetString(&t.name, kMaxNameLen, fmt::format("tensor {} name", i)));
    const std::string field = fmt::format("tensor \"{}\"", t.name);
    uint32_t ndim = 0;
    DP_RETURN_IF_ERROR(r.GetValue(&ndim, field + " ndim"));
    if (ndim > kMaxNdim) {
      return Corrupt("{}: {} has ndim {} (at most {})", path, field, ndim, kMaxNdim);
    }
    t.shape.resize(ndim);
    DP_RETURN_IF_ERROR(r.Get(t.shape.data(), ndim * sizeof(int64_t), field + " dims"));
    uint64_t numel = 0;
    DP_RETURN_IF_ERROR(r.GetValue(&numel, field + " numel"));
    const int64_t shape_numel = ShapeNumel(t.shape);
    if (shape_numel < 0 || static_cast<uint64_t>(shape_numel) != numel) {
      return Corrupt("{}: {} numel {} does not match its shape [{}]", path, field, numel,
                     fmt::join(t.shape, ", "));
    }
    if (numel > r.remaining() / sizeof(float)) {
      return Corrupt("{}: truncated: {} declares {} floats, only {} bytes left", path, field, numel,
                     r.remaining());
    }
    t.data.resize(numel);
    DP_RETURN_IF_ERROR(r.Get(t.data.data(), numel * sizeof(float), field + " data"));
    const uint32_t computed = r.crc();
    DP_RETURN_IF_ERROR(r.GetValue(&stored, field + " crc"));
    if (stored != computed) {
      return Corrupt("{}: crc mismatch in {} (stored 0x{:08x}, computed 0x{:08x})", path, field,
                     stored, computed);
    }
    out->tensors.push_back(std::move(t));
  }
  if (r.remaining() != 0) {
    return Corrupt("{}: {} unexpected bytes after the last tensor (at byte {})", path,
                   r.remaining(), r.offset());
  }
  return Status::Ok();
}

}  // namespace

uint32_t Crc32(std::span<const uint8_t> bytes, uint32_t crc) {
  // libdeflate (as zlib) answers a null buffer with the initial value, 0, not `crc`: an empty
  // piece (an empty vector's data() is null) would restart the chain, and the bytes before it
  // would go unchecked.
  if (bytes.empty()) return crc;
  return libdeflate_crc32(crc, bytes.data(), bytes.size());
}

std::string FormatMetaInts(std::span<const int64_t> values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(values[i]);
  }
  return out;
}

Status ParseMetaInts(std::string_view text, const std::string& path, std::string_view key, std::vector<int64_t>* out) {
  out->clear();
  if (text.empty()) return Status::Ok();
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string tok(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || errno == ERANGE) {
      return Corrupt("{}: meta '{}': bad entry '{}'", path, key, tok);
    }
    out->push_back(v);
    if (comma == std::string_view::npos) return Status::Ok();
    start = comma + 1;
  }
}

const NamedTensor* FindTensor(const TensorFile& file, std::string_view name) {
  for (const NamedTensor& t : file.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status WriteTensorFile(const std::string& path, const TensorFile& file) {
  DP_RETURN_IF_ERROR(CheckWritable(path, file));
  DP_RETURN_IF_ERROR(CheckReplaceable(path));
  const std::filesystem::path target(path);
  const std::string dir =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  // Hidden temp name in the same directory (rename is atomic only within one filesystem).
  std::string tmp = fmt::format("{}/.{}.tmp.XXXXXX", dir, target.filename().string());
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return IoError("{}: cannot create a temporary file in {}: {}", path, dir, Errno());
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  Status s;
  {
    Writer w(fd, path);
    s = WriteBody(w, file);
  }
  if (s.ok() && CurrentEnv().Fsync(fd) != 0) s = IoError("{}: fsync failed: {}", path, Errno());
  if (::close(fd) != 0 && s.ok()) s = IoError("{}: close failed: {}", path, Errno());
  if (s.ok() && CurrentEnv().Rename(tmp.c_str(), path.c_str()) != 0) {
    s = IoError("{}: rename from {} failed: {}", path, tmp, Errno());
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDirectory(dir, path);
}

Status ReadTensorFile(const std::string& path, TensorFile* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("{}: no such tensor file", path);
    return IoError("{}: cannot open: {}", path, Errno());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError("{}: not a regular file", path);
  }
  TensorFile file;
  Reader r(fd, path, static_cast<uint64_t>(st.st_size));
  Status s = ReadBody(r, path, &file);
  ::close(fd);
  if (s.ok()) *out = std::move(file);
  return s;
}

}  // namespace downpour
