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

WalWriter::WalWriter(std::string path, int fd, uint64_t next_seq, std::chrono::milliseconds fsync_ms, uint64_t bytes)
    : path_(std::move(path)), fd_(fd), next_seq_(next_seq), fsync_ms_(fsync_ms), bytes_(bytes) {
  if (fsync_ms_.count() > 0) syncer_ = std::thread([this] { SyncLoop(); });
}

WalWriter::~WalWriter() {
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    stop_ = true;
  }
  sync_cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
  if (fd_ >= 0) {
    (void)Sync();
    close(fd_);
  }
}

// Group commit off the shard's thread: every fsync_ms, one fdatasync for whatever was appended.
void WalWriter::SyncLoop() {
  std::unique_lock<std::mutex> lock(sync_mu_);
  while (!stop_) {
    sync_cv_.wait_for(lock, fsync_ms_, [this] { return stop_; });
    if (stop_ || !dirty_.exchange(false)) continue;
    lock.unlock();
    const int rc = CurrentEnv().Fdatasync(fd_);
    const int err = errno;
    timespec cpu{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
      sync_cpu_ns_.store(static_cast<uint64_t>(cpu.tv_sec) * 1000000000u + static_cast<uint64_t>(cpu.tv_nsec),
                         std::memory_order_relaxed);
    }
    lock.lock();
    if (rc != 0) NoteSyncFailureLocked(err);
  }
}

void WalWriter::NoteSyncFailureLocked(int err) {
  if (sync_error_.ok()) sync_error_ = IoError("{}: fdatasync: {}", path_, std::strerror(err));
}

Status WalWriter::SyncError() {
  std::lock_guard<std::mutex> lock(sync_mu_);
  return sync_error_;
}

Status WalWriter::Open(const std::string& path, uint64_t next_seq, bool truncate, std::chrono::milliseconds fsync_ms,
                       std::unique_ptr<WalWriter>* out) {
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
  const int fd = open(path.c_str(), flags, 0600);
  if (fd < 0) return IoError("{}: cannot open the write-ahead log: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return IoError("{}: fstat: {}", path, std::strerror(errno));
  }
  if (CurrentEnv().Fsync(fd) != 0) {  // the truncation / creation itself
    close(fd);
    return IoError("{}: fsync: {}", path, std::strerror(errno));
  }
  out->reset(new WalWriter(path, fd, next_seq == 0 ? 1 : next_seq, fsync_ms, static_cast<uint64_t>(st.st_size)));
  return Status::Ok();
}

// A push record goes out with one writev(2) (more only past IOV_MAX pieces or on a short write):
// the header and the small per-chunk / per-frame fields from buf_, the floats and frames straight
// from the push, so a 100 MB push is not copied once more on its way to the page cache.
Status WalWriter::Append(WalRecord* r) {
  DP_RETURN_IF_ERROR(Failure());  // before anything is written: a refused record is not in the log
  r->seq = next_seq_;
  const uint64_t start = bytes_;
  uint64_t record_bytes = 0;
  Status written;
  if (r->kind != WalKind::kPush && r->kind != WalKind::kCodedPush) {
    EncodeWalRecord(*r, &buf_);
    record_bytes = buf_.size();
    written = WriteFully(fd_, buf_.data(), buf_.size(), path_);
  } else {
    std::vector<iovec> iov;
    DP_RETURN_IF_ERROR(PushPieces(*r, &iov));
    uint64_t payload = 0;
    for (const iovec& v : iov) payload += v.iov_len;
    payload -= kWalHeaderBytes;
    if (payload > kWalMaxPayload) return InvalidArgument("{}: a push of {} bytes exceeds the log's record limit", path_, payload);
    char* b = buf_.data();
    const auto len = static_cast<uint32_t>(payload);
    std::memcpy(b + 16, &len, 4);
    // The CRC covers bytes 0..19 of the header, then the payload, piece by piece.
    uint32_t crc = Crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b), 20));
    crc = Crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b) + kWalHeaderBytes,
                                         iov[0].iov_len - kWalHeaderBytes),
                crc);
    for (size_t k = 1; k < iov.size(); ++k) {
      crc = Crc32(std::span<const uint8_t>(static_cast<const uint8_t*>(iov[k].iov_base), iov[k].iov_len), crc);
    }
    std::memcpy(b + 20, &crc, 4);
    record_bytes = kWalHeaderBytes + payload;
    written = WritevFully(fd_, std::move(iov), path_);
  }
  if (!written.ok()) return CutOff(start, written);
  bytes_ += record_bytes;
  dirty_ = true;
  if (fsync_ms_.count() == 0) {
    // Not durable, so not taken: cut off, the log holds exactly what the shard applied.
    if (Status synced = Sync(); !synced.ok()) return CutOff(start, synced);
  }
  ++next_seq_;
  return Status::Ok();
}

// The pieces of a push record, in order: iov[0] is buf_'s header (24 bytes, length and crc left
// for Append) and push fields (36); then per chunk its 16-byte header (in buf_), its floats and
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

Status WalWriter::Failure() {
  if (!failed_.ok()) return failed_;
  return SyncError();
}

// ftruncate back to where the record began: with O_APPEND the next record is written there.
Status WalWriter::CutOff(uint64_t start, const Status& cause) {
  if (CurrentEnv().Ftruncate(fd_, static_cast<off_t>(start)) != 0) {
    failed_ = IoError("{}: a record failed ({}) and could not be cut off ({}): the log takes nothing more", path_,
                      cause.message(), std::strerror(errno));
    return failed_;
  }
  bytes_ = start;
  return cause;
}

// A failed fsync is for good (sync_error_): after one the kernel may have dropped the unwritten
// pages, and a later fsync that succeeds says nothing about them.
Status WalWriter::Sync() {
  if (!dirty_.exchange(false)) return SyncError();
  if (CurrentEnv().Fdatasync(fd_) != 0) {
    const int err = errno;
    std::lock_guard<std::mutex> lock(sync_mu_);
    NoteSyncFailureLocked(err);
    return sync_error_;
  }
  return SyncError();
}

Status WalWriter::Restart() {
  if (CurrentEnv().Ftruncate(fd_, 0) != 0) return IoError("{}: truncate: {}", path_, std::strerror(errno));
  bytes_ = 0;
  dirty_ = true;
  return Sync();
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
