// wal.cc — see wal.h. The log is read through a read-only mmap (a log holds every push since
// the last checkpoint and may be far larger than memory is happy to copy).
#include "server/wal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <span>

#include "common/codec.h"
#include "common/env.h"
#include "common/tensor_file.h"

namespace downpour {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

const char* KindName(uint16_t k) {
  switch (static_cast<WalKind>(k)) {
    case WalKind::kPush: return "push";
    case WalKind::kGone: return "gone";
    case WalKind::kClock: return "clock";
    case WalKind::kJoin: return "join";
    case WalKind::kCodedPush: return "coded push";
  }
  return "unknown";
}

uint32_t RecordCrc(const uint8_t* header20, const uint8_t* payload, size_t len) {
  const uint32_t c = Crc32(std::span<const uint8_t>(header20, 20));
  return Crc32(std::span<const uint8_t>(payload, len), c);
}

// Checks one record at `off` of `data` (size n). Ok: *len_out = whole record bytes. Errors carry
// the field; `*past_end` = the file ends inside the record.
Status CheckRecord(const std::string& path, const uint8_t* data, uint64_t n, uint64_t off, uint64_t* len_out,
                   bool* past_end) {
  *past_end = false;
  if (n - off < kWalHeaderBytes) {
    *past_end = true;
    return Corrupt("{}: byte {}: record header truncated ({} of {} bytes)", path, off, n - off, kWalHeaderBytes);
  }
  const uint8_t* p = data + off;
  const uint32_t magic = Get<uint32_t>(p);
  if (magic != kWalMagic) return Corrupt("{}: byte {}: field magic is {:#010x}, expected {:#010x}", path, off, magic, kWalMagic);
  const uint16_t version = Get<uint16_t>(p + 4);
  if (version != kWalVersion) {
    return Corrupt("{}: byte {}: field version is {}, this build reads {}", path, off, version, kWalVersion);
  }
  const uint16_t kind = Get<uint16_t>(p + 6);
  const uint32_t len = Get<uint32_t>(p + 16);
  if (len > kWalMaxPayload) return Corrupt("{}: byte {}: field length {} exceeds {}", path, off, len, kWalMaxPayload);
  if (n - off - kWalHeaderBytes < len) {
    *past_end = true;
    return Corrupt("{}: byte {}: record of {} payload bytes runs past the end of the file ({} bytes)", path, off, len,
                   n);
  }
  const uint32_t crc = Get<uint32_t>(p + 20);
  const uint32_t want = RecordCrc(p, p + kWalHeaderBytes, len);
  if (crc != want) return Corrupt("{}: byte {}: field crc {:#010x}, computed {:#010x}", path, off, crc, want);
  if (kind < 1 || kind > kMaxWalKind) return Corrupt("{}: byte {}: field kind {} is unknown", path, off, kind);
  *len_out = kWalHeaderBytes + len;
  return Status::Ok();
}

// Decodes the payload of a checked record. Chunk data points into `data` when aligned, else
// into `scratch`.
Status DecodeRecord(const std::string& path, const uint8_t* p, uint64_t off, WalRecord* r,
                    std::vector<std::vector<float>>* scratch) {
  r->kind = static_cast<WalKind>(Get<uint16_t>(p + 6));
  r->seq = Get<uint64_t>(p + 8);
  const uint32_t len = Get<uint32_t>(p + 16);
  const uint8_t* q = p + kWalHeaderBytes;
  const uint8_t* end = q + len;
  r->chunks.clear();
  r->frames.clear();
  r->header = MessageHeader{};
  auto need = [&](size_t bytes, const char* field) -> Status {
    if (static_cast<size_t>(end - q) < bytes) {
      return Corrupt("{}: byte {}: {} record too short for field {}", path, off, KindName(static_cast<uint16_t>(r->kind)),
                     field);
    }
    return Status::Ok();
  };
  DP_RETURN_IF_ERROR(need(4, "worker"));
  r->worker = Get<int32_t>(q);
  q += 4;
  // A push record's fields after the worker (both kinds): flags, session, request id, clock and
  // the count of what follows (chunks or frames).
  auto push_fields = [&](uint32_t* count) -> Status {
    DP_RETURN_IF_ERROR(need(32, "push header"));
    r->flags = Get<uint32_t>(q);
    r->session = Get<uint64_t>(q + 4);
    r->request_id = Get<uint64_t>(q + 12);
    r->clock = Get<int64_t>(q + 20);
    *count = Get<uint32_t>(q + 28);
    q += 32;
    return Status::Ok();
  };
  switch (r->kind) {
    case WalKind::kPush: {
      uint32_t nchunks = 0;
      DP_RETURN_IF_ERROR(push_fields(&nchunks));
      const bool raw = (r->flags & kWalFlagRaw) != 0;
      scratch->resize(2 * static_cast<size_t>(nchunks));
      // `count` floats at q, in place when aligned, else copied into scratch slot k.
      auto floats = [&](size_t k, uint32_t count) -> const float* {
        if (reinterpret_cast<uintptr_t>(q) % alignof(float) == 0) return reinterpret_cast<const float*>(q);
        (*scratch)[k].resize(count);
        std::memcpy((*scratch)[k].data(), q, static_cast<size_t>(count) * 4);
        return (*scratch)[k].data();
      };
      for (uint32_t i = 0; i < nchunks; ++i) {
        DP_RETURN_IF_ERROR(need(16, "chunk header"));
        WalChunk c;
        c.chunk_id = Get<uint32_t>(q);
        c.version_from = Get<int64_t>(q + 4);
        c.count = Get<uint32_t>(q + 12);
        q += 16;
        DP_RETURN_IF_ERROR(need(static_cast<size_t>(c.count) * 4, "chunk data"));
        c.data = floats(2 * static_cast<size_t>(i), c.count);
        q += static_cast<size_t>(c.count) * 4;
        if (raw) {
          DP_RETURN_IF_ERROR(need(static_cast<size_t>(c.count) * 4, "raw gradient"));
          c.raw = floats(2 * static_cast<size_t>(i) + 1, c.count);
          q += static_cast<size_t>(c.count) * 4;
        }
        r->chunks.push_back(c);
      }
      break;
    }
    case WalKind::kCodedPush: {
      uint32_t nframes = 0;
      DP_RETURN_IF_ERROR(push_fields(&nframes));
      if (nframes < 2) {
        return Corrupt("{}: byte {}: coded push record field frames is {}, expected a header and a payload", path, off,
                       nframes);
      }
      for (uint32_t i = 0; i < nframes; ++i) {
        DP_RETURN_IF_ERROR(need(4, "frame length"));
        const uint32_t length = Get<uint32_t>(q);
        q += 4;
        const size_t padded = (static_cast<size_t>(length) + 3) & ~size_t{3};
        DP_RETURN_IF_ERROR(need(padded, "frame"));
        // Records are whole multiples of 4 bytes, so a frame starts aligned in the mapping; the
        // copy is for a mapping that is not (none on Linux), never a silent misread.
        r->frames.push_back(reinterpret_cast<uintptr_t>(q) % alignof(float) == 0
                                ? Frame::Borrow(q, length, nullptr)
                                : Frame::Copy(q, length));
        for (size_t k = length; k < padded; ++k) {
          if (q[k] != 0) return Corrupt("{}: byte {}: coded push record frame {} has nonzero padding", path, off, i);
        }
        q += padded;
      }
      const Frame& head = r->frames[0];
      r->header = MessageHeader{};
      if (Status d = DecodeHeader(head.data(), head.size(), &r->header); !d.ok() || r->header.type != MsgType::kPush) {
        return Corrupt("{}: byte {}: coded push record field header is not a push header ({})", path, off,
                       d.ok() ? MsgTypeName(r->header.type) : d.message());
      }
      break;
    }
    case WalKind::kGone:
      DP_RETURN_IF_ERROR(need(4, "finished"));
      r->finished = Get<uint32_t>(q) != 0;
      q += 4;
      break;
    case WalKind::kClock:
      DP_RETURN_IF_ERROR(need(8, "clock"));
      r->clock = Get<int64_t>(q);
      q += 8;
      break;
    case WalKind::kJoin:
      break;
  }
  if (q != end) {
    return Corrupt("{}: byte {}: {} record has {} bytes after its last field", path, off,
                   KindName(static_cast<uint16_t>(r->kind)), end - q);
  }
  return Status::Ok();
}

class Mapping {
 public:
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, size_);
    if (fd_ >= 0) close(fd_);
  }
  Status Open(const std::string& path) {
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) return NotFound("{}: no such log", path);
      return IoError("{}: open: {}", path, std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd_, &st) != 0) return IoError("{}: fstat: {}", path, std::strerror(errno));
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ == 0) return Status::Ok();
    void* a = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (a == MAP_FAILED) return IoError("{}: mmap of {} bytes: {}", path, size_, std::strerror(errno));
    addr_ = a;
    return Status::Ok();
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace

void EncodeWalRecord(const WalRecord& r, std::string* out) {
  out->clear();
  Put<uint32_t>(out, kWalMagic);
  Put<uint16_t>(out, kWalVersion);
  Put<uint16_t>(out, static_cast<uint16_t>(r.kind));
  Put<uint64_t>(out, r.seq);
  Put<uint32_t>(out, 0);  // length, patched below
  Put<uint32_t>(out, 0);  // crc, patched below
  Put<int32_t>(out, r.worker);
  auto push_fields = [&](size_t count) {  // both push kinds; `count` chunks or frames follow
    Put<uint32_t>(out, r.flags);
    Put<uint64_t>(out, r.session);
    Put<uint64_t>(out, r.request_id);
    Put<int64_t>(out, r.clock);
    Put<uint32_t>(out, static_cast<uint32_t>(count));
  };
  switch (r.kind) {
    case WalKind::kPush:
      push_fields(r.chunks.size());
      for (const WalChunk& c : r.chunks) {
        Put<uint32_t>(out, c.chunk_id);
        Put<int64_t>(out, c.version_from);
        Put<uint32_t>(out, c.count);
        out->append(reinterpret_cast<const char*>(c.data), static_cast<size_t>(c.count) * sizeof(float));
        if ((r.flags & kWalFlagRaw) != 0 && c.raw != nullptr) {  // without it: a short record (tests)
          out->append(reinterpret_cast<const char*>(c.raw), static_cast<size_t>(c.count) * sizeof(float));
        }
      }
      break;
    case WalKind::kGone:
      Put<uint32_t>(out, r.finished ? 1u : 0u);
      break;
    case WalKind::kClock:
      Put<int64_t>(out, r.clock);
      break;
    case WalKind::kJoin:
      break;
    case WalKind::kCodedPush:
      push_fields(r.frames.size());
      for (const Frame& f : r.frames) {
        Put<uint32_t>(out, static_cast<uint32_t>(f.size()));
        out->append(reinterpret_cast<const char*>(f.data()), f.size());
        out->append((4 - f.size() % 4) % 4, '\0');
      }
      break;
  }
  const auto len = static_cast<uint32_t>(out->size() - kWalHeaderBytes);
  std::memcpy(out->data() + 16, &len, 4);
  const auto* b = reinterpret_cast<const uint8_t*>(out->data());
  const uint32_t crc = RecordCrc(b, b + kWalHeaderBytes, len);
  std::memcpy(out->data() + 20, &crc, 4);
}

// ---------------------------------------------------------------------------------------------
// Writer.

namespace {

uint64_t AlignDown(uint64_t x) { return x & ~uint64_t{kWalBlock - 1}; }

bool NoRoom(int err) { return err == ENOSPC || err == EDQUOT; }

}  // namespace

void WalWriter::BlockFree::operator()(std::byte* p) const { std::free(p); }

WalWriter::BlockMem WalWriter::NewBlockMem() {
  void* p = std::aligned_alloc(kWalBlock, kStageBlock);
  if (p == nullptr) throw std::bad_alloc();
  return BlockMem(static_cast<std::byte*>(p));
}

WalWriter::WalWriter(std::string path, int fd, bool direct, uint64_t next_seq, const WalOptions& options,
                     uint64_t size, BlockMem first)
    : path_(std::move(path)), fd_(fd), direct_(direct), options_(options), next_seq_(next_seq) {
  // The first block starts at the block boundary at or before the log's end and holds the bytes
  // of the log from there (read by Open): a direct write puts that block down again, whole.
  blocks_.push_back(Block{AlignDown(size), std::move(first)});
  tail_ = size;
  written_ = size;
  durable_seq_.store(next_seq - 1, std::memory_order_release);
  page_ = NewBlockMem();
  thread_ = std::thread([this] { Run(); });
}

WalWriter::~WalWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // A clean close leaves the log exactly its records long (no block padding).
  if (failed_.ok() && written_ == tail_) {
    struct stat st {};
    if (fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) != tail_) {
      (void)CurrentEnv().Ftruncate(fd_, static_cast<off_t>(tail_));
    }
    (void)CurrentEnv().Fdatasync(fd_);
  }
  close(fd_);
}

Status WalWriter::Open(const std::string& path, uint64_t next_seq, bool truncate, std::chrono::milliseconds fsync_ms,
                       std::unique_ptr<WalWriter>* out) {
  WalOptions o;
  o.fsync_ms = fsync_ms;
  return Open(path, next_seq, truncate, o, out);
}

Status WalWriter::Open(const std::string& path, uint64_t next_seq, bool truncate, const WalOptions& options,
                       std::unique_ptr<WalWriter>* out) {
  if (options.fsync_ms.count() < 0) return InvalidArgument("{}: fsync_ms must be >= 0", path);
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0);
  BlockMem first = NewBlockMem();
  bool direct = options.io != WalIo::kBuffered;
  int fd = -1;
  uint64_t size = 0;
  std::string direct_error;
  // The log's last partial block is read into the first staging block; a direct open is tried
  // with one write of that block (some filesystems open O_DIRECT and refuse its writes).
  auto open_as = [&](bool want_direct) -> Status {
    fd = open(path.c_str(), flags | (want_direct ? O_DIRECT : 0), 0600);
    if (fd < 0) {
      if (want_direct && errno == EINVAL) {
        direct_error = std::strerror(errno);
        return Unavailable("no O_DIRECT");
      }
      return IoError("{}: cannot open the write-ahead log: {}", path, std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) return IoError("{}: fstat: {}", path, std::strerror(errno));
    size = static_cast<uint64_t>(st.st_size);
    const uint64_t base = AlignDown(size);
    std::memset(first.get(), 0, kWalBlock);
    if (size > base) {
      const ssize_t r = pread(fd, first.get(), kWalBlock, static_cast<off_t>(base));
      if (r < 0 && want_direct && errno == EINVAL) {
        direct_error = std::strerror(errno);
        return Unavailable("no O_DIRECT");
      }
      if (r < static_cast<ssize_t>(size - base)) {
        return IoError("{}: reading its last block: {}", path, r < 0 ? std::strerror(errno) : "short read");
      }
      std::memset(first.get() + (size - base), 0, kWalBlock - (size - base));
    }
    if (want_direct) {
      const ssize_t w = CurrentEnv().Pwrite(fd, first.get(), kWalBlock, static_cast<off_t>(base));
      if (w < 0 && errno == EINVAL) {
        direct_error = std::strerror(errno);
        return Unavailable("no O_DIRECT");
      }
      if (w != static_cast<ssize_t>(kWalBlock) || CurrentEnv().Ftruncate(fd, static_cast<off_t>(size)) != 0) {
        return IoError("{}: cannot write the write-ahead log: {}", path, w < 0 ? std::strerror(errno) : "short write");
      }
    }
    return Status::Ok();
  };
  Status s = open_as(direct);
  if (!s.ok() && s.code() == StatusCode::kUnavailable) {
    if (fd >= 0) close(fd);
    fd = -1;
    if (options.io == WalIo::kDirect) {
      return IoError("{}: the filesystem does not take O_DIRECT writes ({}); use another log directory", path,
                     direct_error);
    }
    direct = false;
    s = open_as(false);
  }
  if (s.ok() && CurrentEnv().Fsync(fd) != 0) {  // the truncation / creation itself
    s = IoError("{}: fsync: {}", path, std::strerror(errno));
  }
  if (!s.ok()) {
    if (fd >= 0) close(fd);
    return s;
  }
  out->reset(new WalWriter(path, fd, direct, next_seq == 0 ? 1 : next_seq, options, size, std::move(first)));
  return Status::Ok();
}

Status WalWriter::Submit(WalRecord* r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    if (!stalled_.ok()) return stalled_;
  }
  r->seq = next_seq_;
  std::vector<iovec> iov;
  bool fuse_crc = false;  // a push: its CRC computed from the staged copy, still in cache
  uint32_t crc_head = 0;
  if (r->kind != WalKind::kPush && r->kind != WalKind::kCodedPush) {
    EncodeWalRecord(*r, &buf_);
    iov.push_back(iovec{buf_.data(), buf_.size()});
  } else {
    DP_RETURN_IF_ERROR(PushPieces(*r, &iov));
    uint64_t payload = 0;
    for (const iovec& v : iov) payload += v.iov_len;
    payload -= kWalHeaderBytes;
    if (payload > kWalMaxPayload) {
      return InvalidArgument("{}: a push of {} bytes exceeds the log's record limit", path_, payload);
    }
    char* b = buf_.data();
    const auto len = static_cast<uint32_t>(payload);
    std::memcpy(b + 16, &len, 4);
    // The CRC covers bytes 0..19 of the header, then the payload: here the header's own fields;
    // the rest as it is copied into the staging (below), and iov[0] goes in last, with it.
    crc_head = Crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b), 20));
    crc_head = Crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b) + kWalHeaderBytes,
                                              iov[0].iov_len - kWalHeaderBytes),
                     crc_head);
    fuse_crc = true;
  }
  uint64_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;

  // Room in the staging: blocks up to staging_bytes, more only for a record that is larger alone.
  std::vector<std::pair<std::byte*, uint64_t>> dest;  // (block memory, block offset) covering the record
  const uint64_t start = tail_;  // only this thread moves tail_
  const uint64_t end = start + total;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t max_blocks = std::max<size_t>(1, options_.staging_bytes / kStageBlock);
    auto take = [&] {
      if (spare_.empty()) return NewBlockMem();
      BlockMem m = std::move(spare_.back());
      spare_.pop_back();
      return m;
    };
    while (true) {
      if (!failed_.ok()) return failed_;
      if (!stalled_.ok()) return stalled_;
      if (blocks_.empty()) blocks_.push_back(Block{AlignDown(start), take()});  // after a Restart: at 0
      const uint64_t have = blocks_.back().offset + kStageBlock;
      if (have >= end) break;
      if (blocks_.size() < max_blocks || written_ == tail_) {
        blocks_.push_back(Block{have, take()});
        continue;
      }
      cv_.wait(lock);  // the log thread frees blocks as it writes them
    }
    for (const Block& b : blocks_) {
      if (b.offset + kStageBlock > start && b.offset < end) dest.emplace_back(b.mem.get(), b.offset);
    }
  }
  // Copied outside the lock: the log thread reads only bytes before tail_, and frees only blocks
  // wholly before the block it last wrote.
  // Copies `v` to stream offset `at`, slice by slice; `crc` (if given) goes on over each slice
  // just copied, read back while it is in cache: one pass over the push's bytes in memory.
  auto stage = [&](const iovec& v, uint64_t at, uint32_t* crc) {
    const auto* p = static_cast<const std::byte*>(v.iov_base);
    size_t left = v.iov_len;
    size_t d = 0;
    while (left > 0) {
      while (at >= dest[d].second + kStageBlock) ++d;
      const size_t in_block = at - dest[d].second;
      const size_t n = std::min({left, kStageBlock - in_block, size_t{256} << 10});
      std::byte* to = dest[d].first + in_block;
      std::memcpy(to, p, n);
      if (crc != nullptr) *crc = Crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(to), n), *crc);
      p += n;
      left -= n;
      at += n;
    }
  };
  if (fuse_crc) {
    uint32_t crc = crc_head;
    uint64_t at = start + iov[0].iov_len;
    for (size_t k = 1; k < iov.size(); ++k) {
      stage(iov[k], at, &crc);
      at += iov[k].iov_len;
    }
    std::memcpy(buf_.data() + 20, &crc, 4);
    stage(iov[0], start, nullptr);
  } else {
    uint64_t at = start;
    for (const iovec& v : iov) {
      stage(v, at, nullptr);
      at += v.iov_len;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    tail_ = end;
    pending_.emplace_back(end, next_seq_);
  }
  cv_.notify_all();
  ++next_seq_;
  return Status::Ok();
}

Status WalWriter::Append(WalRecord* r) {
  DP_RETURN_IF_ERROR(Submit(r));
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return durable_seq() >= r->seq || !failed_.ok() || !stalled_.ok(); });
  if (durable_seq() >= r->seq) return Status::Ok();
  return !failed_.ok() ? failed_ : stalled_;
}

Status WalWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return written_ == tail_ || !failed_.ok() || !stalled_.ok(); });
  if (!failed_.ok()) return failed_;
  if (written_ != tail_) return stalled_;
  return Status::Ok();
}

bool WalWriter::WritesFileAt(const std::string& path) const {
  struct stat mine;
  struct stat there;
  if (fstat(fd_, &mine) != 0 || stat(path.c_str(), &there) != 0) return false;
  return mine.st_dev == there.st_dev && mine.st_ino == there.st_ino;
}

Status WalWriter::Sync() {
  DP_RETURN_IF_ERROR(Drain());
  std::lock_guard<std::mutex> lock(mu_);
  if (!dirty_) return Status::Ok();
  if (CurrentEnv().Fdatasync(fd_) != 0) {
    failed_ = IoError("{}: fdatasync: {}", path_, std::strerror(errno));
    return failed_;
  }
  dirty_ = false;
  return Status::Ok();
}

Status WalWriter::Restart() {
  DP_RETURN_IF_ERROR(Drain());
  std::lock_guard<std::mutex> lock(mu_);
  if (CurrentEnv().Ftruncate(fd_, 0) != 0) return IoError("{}: truncate: {}", path_, std::strerror(errno));
  if (CurrentEnv().Fdatasync(fd_) != 0) {
    failed_ = IoError("{}: fdatasync: {}", path_, std::strerror(errno));
    return failed_;
  }
  dirty_ = false;
  for (Block& b : blocks_) {
    if (b.mem != nullptr) spare_.push_back(std::move(b.mem));
  }
  blocks_.clear();
  tail_ = 0;
  written_ = 0;
  return Status::Ok();
}

void WalWriter::Abandon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (failed_.ok()) failed_ = FailedPrecondition("{}: abandoned: this process is out of the run", path_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status WalWriter::Stalled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stalled_;
}

Status WalWriter::Failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

uint64_t WalWriter::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tail_;
}

void WalWriter::NoteCpu() {
  timespec cpu{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
    sync_cpu_ns_.store(static_cast<uint64_t>(cpu.tv_sec) * 1000000000u + static_cast<uint64_t>(cpu.tv_nsec),
                       std::memory_order_relaxed);
  }
}

// The pieces of one batch go down with pwrite at their own offsets, so a batch tried again after
// a stall puts the same bytes at the same places: nothing is cut off, nothing doubled.
Status WalWriter::WritePieces(const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) {
    size_t done = 0;
    while (done < p.size) {
      const ssize_t w = CurrentEnv().Pwrite(fd_, p.data + done, p.size - done, static_cast<off_t>(p.offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : ENOSPC;
        const Status s = IoError("{}: write of {} bytes at offset {} failed after {}: {}", path_, p.size, p.offset, done,
                                 std::strerror(err));
        return NoRoom(err) ? Unavailable("{}", s.message()) : s;
      }
      done += static_cast<size_t>(w);
    }
  }
  return Status::Ok();
}

void WalWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  auto last_sync = std::chrono::steady_clock::now();
  const bool periodic = options_.fsync_ms.count() > 0;
  while (true) {
    const bool stalled = !stalled_.ok();
    auto ready = [&] { return stop_ || (failed_.ok() && tail_ > written_ && stalled_.ok()); };
    if (stalled) {
      cv_.wait_for(lock, kWalStallRetry, [&] { return stop_; });
    } else if (periodic && dirty_) {
      cv_.wait_until(lock, last_sync + options_.fsync_ms, ready);
    } else {
      cv_.wait(lock, ready);
    }
    if (stop_ && (tail_ == written_ || !failed_.ok() || !stalled_.ok())) break;
    if (failed_.ok() && tail_ > written_) {
      const uint64_t from = written_;
      const uint64_t to = tail_;
      std::vector<Piece> pieces;
      const uint64_t wfrom = direct_ ? AlignDown(from) : from;
      const uint64_t wto = direct_ ? AlignDown(to) : to;
      for (const Block& b : blocks_) {
        const uint64_t lo = std::max(wfrom, b.offset);
        const uint64_t hi = std::min(wto, b.offset + kStageBlock);
        if (lo < hi) pieces.push_back(Piece{b.mem.get() + (lo - b.offset), lo, static_cast<size_t>(hi - lo)});
      }
      if (direct_ && wto < to) {  // the last partial block, from a private copy padded with zeros
        const uint64_t lo = wto;
        for (const Block& b : blocks_) {
          if (lo >= b.offset && lo < b.offset + kStageBlock) {
            std::memcpy(page_.get(), b.mem.get() + (lo - b.offset), to - lo);
            break;
          }
        }
        std::memset(page_.get() + (to - lo), 0, kWalBlock - (to - lo));
        pieces.push_back(Piece{page_.get(), lo, kWalBlock});
      }
      lock.unlock();
      Status s = WritePieces(pieces);
      if (s.ok() && !periodic && CurrentEnv().Fdatasync(fd_) != 0) {
        s = IoError("{}: fdatasync: {}", path_, std::strerror(errno));
      }
      NoteCpu();
      lock.lock();
      if (s.code() == StatusCode::kUnavailable) {
        if (stalled_.ok()) stalled_ = IoError("{} (the disk is full: the log waits for room)", s.message());
      } else if (!s.ok()) {
        failed_ = s;
      } else {
        stalled_ = Status::Ok();
        written_ = to;
        dirty_ = periodic;
        uint64_t durable = 0;
        while (!pending_.empty() && pending_.front().first <= to) {
          durable = pending_.front().second;
          pending_.pop_front();
        }
        if (durable != 0) durable_seq_.store(durable, std::memory_order_release);
        // Blocks wholly before the block the next write starts in are done.
        while (blocks_.size() > 1 && blocks_.front().offset + kStageBlock <= AlignDown(written_)) {
          if (spare_.size() < std::max<size_t>(1, options_.staging_bytes / kStageBlock)) {
            spare_.push_back(std::move(blocks_.front().mem));
          }
          blocks_.pop_front();
        }
      }
      lock.unlock();
      cv_.notify_all();
      if (options_.on_progress) options_.on_progress();
      lock.lock();
    }
    if (periodic && dirty_ && failed_.ok() && std::chrono::steady_clock::now() >= last_sync + options_.fsync_ms) {
      dirty_ = false;
      lock.unlock();
      const int rc = CurrentEnv().Fdatasync(fd_);
      const int err = errno;
      NoteCpu();
      lock.lock();
      last_sync = std::chrono::steady_clock::now();
      if (rc != 0) {
        failed_ = IoError("{}: fdatasync: {}", path_, std::strerror(err));
        lock.unlock();
        cv_.notify_all();
        if (options_.on_progress) options_.on_progress();
        lock.lock();
      }
    }
  }
}

// The pieces of a push record, in order: iov[0] is buf_'s header (24 bytes, length and crc left
// for Submit) and push fields (36); then per chunk its 16-byte header (in buf_), its floats and
// DC-ASGD-a's raw floats, or per frame its 4-byte length (in buf_), its bytes and the padding.
Status WalWriter::PushPieces(const WalRecord& r, std::vector<iovec>* iov) {
  const bool coded = r.kind == WalKind::kCodedPush;
  const bool raw = !coded && (r.flags & kWalFlagRaw) != 0;
  for (const WalChunk& c : r.chunks) {
    if (raw && c.raw == nullptr) return InvalidArgument("{}: a push flagged raw has a chunk without it", path_);
  }
  if (coded && r.frames.size() < 2) {
    return InvalidArgument("{}: a coded push needs a header and a payload, got {} frames", path_, r.frames.size());
  }
  const size_t items = coded ? r.frames.size() : r.chunks.size();
  const size_t item_bytes = coded ? 4 : 16;
  // Reserved up front so the iovecs into it stay valid.
  const size_t fixed = kWalHeaderBytes + 36;
  buf_.assign(fixed + item_bytes * items, '\0');
  char* b = buf_.data();
  auto put = [](char* at, auto v) { std::memcpy(at, &v, sizeof(v)); };
  put(b, kWalMagic);
  put(b + 4, kWalVersion);
  put(b + 6, static_cast<uint16_t>(r.kind));
  put(b + 8, r.seq);
  put(b + 24, r.worker);
  put(b + 28, r.flags);
  put(b + 32, r.session);
  put(b + 40, r.request_id);
  put(b + 48, r.clock);
  put(b + 56, static_cast<uint32_t>(items));
  static constexpr char kZeros[4] = {};
  iov->reserve(1 + 3 * items);
  iov->push_back(iovec{b, fixed});
  for (size_t i = 0; i < items; ++i) {
    char* h = b + fixed + item_bytes * i;
    if (coded) {
      const Frame& f = r.frames[i];
      if (f.size() > kWalMaxPayload) {
        return InvalidArgument("{}: a frame of {} bytes exceeds the log's record limit", path_, f.size());
      }
      put(h, static_cast<uint32_t>(f.size()));
      iov->push_back(iovec{h, 4});
      iov->push_back(iovec{const_cast<std::byte*>(f.data()), f.size()});
      if (const size_t pad = (4 - f.size() % 4) % 4; pad != 0) iov->push_back(iovec{const_cast<char*>(kZeros), pad});
      continue;
    }
    const WalChunk& c = r.chunks[i];
    put(h, c.chunk_id);
    put(h + 4, c.version_from);
    put(h + 12, c.count);
    iov->push_back(iovec{h, 16});
    iov->push_back(iovec{const_cast<float*>(c.data), static_cast<size_t>(c.count) * sizeof(float)});
    if (raw) iov->push_back(iovec{const_cast<float*>(c.raw), static_cast<size_t>(c.count) * sizeof(float)});
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Reader.

Status ScanWal(const std::string& path, const std::function<Status(const WalRecord&)>& visit, WalScanInfo* info) {
  *info = WalScanInfo{};
  Mapping m;
  DP_RETURN_IF_ERROR(m.Open(path));
  const uint8_t* data = m.data();
  const uint64_t n = m.size();
  info->file_bytes = n;
  // Pass 1: structure, CRCs, seq continuity; find the valid prefix.
  uint64_t off = 0;
  uint64_t prev_seq = 0;
  WalRecord r;
  std::vector<std::vector<float>> scratch;
  while (off < n) {
    uint64_t len = 0;
    bool past_end = false;
    Status s = CheckRecord(path, data, n, off, &len, &past_end);
    if (s.ok()) {
      const uint64_t seq = Get<uint64_t>(data + off + 8);
      if (prev_seq != 0 && seq != prev_seq + 1) {
        return Corrupt("{}: byte {}: field seq is {} after {} (a gap: records are missing)", path, off, seq, prev_seq);
      }
      DP_RETURN_IF_ERROR(DecodeRecord(path, data + off, off, &r, &scratch));  // CRC-valid but malformed: corrupt
      if (info->records == 0) info->first_seq = seq;
      prev_seq = seq;
      info->last_seq = seq;
      ++info->records;
      off += len;
      continue;
    }
    // Zeros to the next block boundary are a direct writer's padding (wal.h), not a record.
    if (n - off < kWalBlock && std::all_of(data + off, data + n, [](uint8_t b) { return b == 0; })) {
      info->padding_bytes = n - off;
      break;
    }
    // A bad record: a torn tail only if no valid record starts anywhere after it.
    if (!past_end) {
      for (uint64_t q = off + 1; q + kWalHeaderBytes <= n; ++q) {
        if (Get<uint32_t>(data + q) != kWalMagic) continue;
        uint64_t l2 = 0;
        bool pe2 = false;
        if (CheckRecord(path, data, n, q, &l2, &pe2).ok()) {
          return Corrupt("{} (a valid record follows at byte {}: the log is damaged, not torn)", s.message(), q);
        }
      }
    }
    info->torn = true;
    info->torn_reason = s.message();
    break;
  }
  info->valid_bytes = off;
  if (!visit) return Status::Ok();
  // Pass 2: decode and visit.
  for (uint64_t p = 0; p < info->valid_bytes;) {
    DP_RETURN_IF_ERROR(DecodeRecord(path, data + p, p, &r, &scratch));
    DP_RETURN_IF_ERROR(visit(r));
    p += kWalHeaderBytes + Get<uint32_t>(data + p + 16);
  }
  return Status::Ok();
}

Status TruncateWal(const std::string& path, uint64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return IoError("{}: open: {}", path, std::strerror(errno));
  Status s;
  if (CurrentEnv().Ftruncate(fd, static_cast<off_t>(bytes)) != 0 || CurrentEnv().Fsync(fd) != 0) {
    s = IoError("{}: truncate to {} bytes: {}", path, bytes, std::strerror(errno));
  }
  close(fd);
  return s;
}

}  // namespace downpour
