// wal.h — a shard's write-ahead log: every state change the shard takes from the wire (a push,
// a worker's clock, a worker gone, an elastic worker joining) is appended here BEFORE it is
// applied and acknowledged, so an acknowledged update survives the death of the server process
// (the record is in the page cache after write(2)) and, after the next fsync, of the machine.
// A restart (downpour-server --recover) loads the shard's checkpoint and replays the records
// the checkpoint does not cover (seq > the checkpoint's meta "wal_seq"), which rebuilds the
// exact state: replay goes through the same apply code as the live path, in the same order.
//
// File: D/<checkpoint.dir>/server-<i>.wal (server/run_dir.h ServerWalPath), a sequence of
// records, no file header. Record layout (integers little-endian):
//
//   offset  size  field
//   0       4     magic    u32 kWalMagic 0x4C575044 (bytes "DPWL")
//   4       2     version  u16 kWalVersion (1)
//   6       2     kind     u16 WalKind
//   8       8     seq      u64, 1, 2, 3, ... (+1 per record; continues across log restarts)
//   16      4     length   u32 payload bytes (<= kWalMaxPayload)
//   20      4     crc      u32 CRC-32 (zlib's, common/tensor_file.h) of bytes 0..19 then the payload
//   24      ...   payload:
//     kPush:  worker i32, flags u32 (kFlagInit ...), session u64, request_id u64, clock i64,
//             n u32, n × { chunk_id u32, version_from i64, count u32, count × f32
//                          [, count × f32 raw when flags has kWalFlagRaw] }
//             With kWalFlagRaw (DC-ASGD-a) each chunk holds the compensated gradient that was
//             applied and then the raw one the worker pushed, which the server's running mean
//             square is made of: replay needs both to rebuild the shard exactly.
//     kGone:  worker i32, finished u8
//     kClock: worker i32, clock i64
//     kJoin:  worker i32
//     kCodedPush: worker i32, flags u32, session u64, request_id u64, clock i64,
//             n u32, n × { length u32, length bytes, zeros to a multiple of 4 bytes }
//             A lossy or sufficient-factor push kept as the wire carried it, when that is fewer
//             bytes than its f32 gradient (AlexNet's factors: ~9× fewer; top-k 1%: ~50×): frame
//             0 is the message's header re-encoded (common/codec.h) with the fields decoding
//             needs, the rest its payload frames. Replay forms and decodes it again with the
//             live path's code (server/factor_push.h, request_check.h), whose floats do not
//             depend on thread counts, so the shard comes back byte for byte on a machine of the
//             same instruction set (oneDNN's sgemm picks its kernels by ISA). DC-ASGD pushes are
//             logged as kPush: what they apply depends on pulled copies the log does not keep.
//
// Reading (ScanWal) checks every record. A bad LAST record — the file ends inside it, or its
// CRC / header is bad and no valid record follows anywhere after it — is what a process or
// machine dying in the middle of a write leaves: it was never acknowledged, so it is reported
// as a torn tail (ScanInfo::torn_*) and the caller truncates it away with one log line. A bad
// record followed by a valid one, a wrong magic / version in the middle, or a sequence gap is
// kCorrupt naming the file, the byte offset and the field: never a silently wrong shard.
//
// After the shard writes a checkpoint to its own path (renamed into place, fsynced), the log is
// restarted (truncated to empty); seq numbers go on. A crash between the two is safe: replay
// skips records with seq <= the checkpoint's.
//
// Thread-safety: a WalWriter is used by one thread at a time (the shard holds its lock); with
// fsync_ms > 0 it owns a thread of its own that fsyncs the file every fsync_ms when it has
// unsynced records, so the shard's loop never waits for the disk (an fsync error is returned by
// the next Append, and every later one, which write nothing). ScanWal is reentrant.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/status.h"
#include "common/transport.h"

namespace downpour {

inline constexpr uint32_t kWalMagic = 0x4C575044;  // "DPWL" on disk
inline constexpr uint16_t kWalVersion = 1;
inline constexpr size_t kWalHeaderBytes = 24;
inline constexpr uint32_t kWalMaxPayload = 1u << 30;  // a push of one shard is far smaller

enum class WalKind : uint16_t { kPush = 1, kGone = 2, kClock = 3, kJoin = 4, kCodedPush = 5 };
inline constexpr uint16_t kMaxWalKind = 5;

// A push record's flag of the log's own (never on the wire, where flags stay below it): every
// chunk carries the raw gradient after the applied one.
inline constexpr uint32_t kWalFlagRaw = 1u << 31;

struct WalChunk {
  uint32_t chunk_id = 0;
  int64_t version_from = 0;
  const float* data = nullptr;  // count floats; points into the scanned bytes / the push frame
  uint32_t count = 0;
  const float* raw = nullptr;   // count floats, with kWalFlagRaw only (else null)
};

struct WalRecord {
  WalKind kind = WalKind::kPush;
  uint64_t seq = 0;
  int32_t worker = 0;
  uint32_t flags = 0;        // push
  uint64_t session = 0;      // push
  uint64_t request_id = 0;   // push
  int64_t clock = 0;         // push, clock
  bool finished = false;     // gone
  std::vector<WalChunk> chunks;  // push
  // coded push: the header frame (a push's header, common/codec.h), then the payload frames. Read
  // back, they point into the scanned log (valid during the visit), or own a copy when misaligned,
  // and `header` is frames[0] decoded (ScanWal checks that it is a push's).
  Frames frames;
  MessageHeader header;
};

// Appends records to one log file (O_APPEND; created 0600 if missing).
class WalWriter {
 public:
  // Opens `path` for appending; `next_seq` is the seq the next record gets. truncate = start the
  // log empty (a fresh shard, or after --restore); otherwise appends after what is there (the
  // caller has scanned it and truncated a torn tail). fsync_ms: fsync at least this often (on
  // the writer's own thread); 0 = every Append fsyncs before it returns.
  static Status Open(const std::string& path, uint64_t next_seq, bool truncate, std::chrono::milliseconds fsync_ms,
                     std::unique_ptr<WalWriter>* out);
  ~WalWriter();

  // Writes `r` (its seq is set to next_seq()) with one write(2); fsyncs when due. On an error
  // the record is not in the log: a record written in part, or written but not synced (fsync_ms
  // = 0), is cut off again (ftruncate), so the log never holds a record the shard did not take
  // nor a torn one before later records. The log takes nothing more, every later Append failing
  // without writing, once an fsync has failed (on either thread) or a record could not be cut off.
  Status Append(WalRecord* r);
  Status Sync();  // fsync now if anything is unsynced; a failure is for good (see Append)
  // Ok while the log takes records; once it takes nothing more (see Append), why.
  Status Failure();
  // Empties the log (after a checkpoint that covers everything in it); seq numbers go on.
  Status Restart();
  uint64_t next_seq() const { return next_seq_; }
  uint64_t bytes() const { return bytes_; }
  // CPU time (ns) the fsync thread has used so far (fsync_ms > 0; 0 otherwise): the kernel's
  // write-back of the log runs there, beside the shard's loop, not in Append.
  uint64_t sync_cpu_ns() const { return sync_cpu_ns_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

 private:
  WalWriter(std::string path, int fd, uint64_t next_seq, std::chrono::milliseconds fsync_ms, uint64_t bytes);

  void SyncLoop();
  Status SyncError();
  void NoteSyncFailureLocked(int err);  // the first failed fsync, kept for good (sync_mu_ held)
  Status CutOff(uint64_t start, const Status& cause);
  Status PushPieces(const WalRecord& r, std::vector<iovec>* iov);  // a push record's writev pieces

  std::string path_;
  int fd_ = -1;
  uint64_t next_seq_ = 1;
  std::chrono::milliseconds fsync_ms_;
  uint64_t bytes_ = 0;
  std::atomic<bool> dirty_{false};
  std::atomic<uint64_t> sync_cpu_ns_{0};
  std::string buf_;  // reused record buffer
  std::mutex sync_mu_;  // guards stop_ and sync_error_
  std::condition_variable sync_cv_;
  bool stop_ = false;
  Status sync_error_;
  Status failed_;       // a record that could not be cut off: nothing more is written
  std::thread syncer_;  // fsync_ms > 0 only
};

// What ScanWal found.
struct WalScanInfo {
  uint64_t records = 0;       // valid records
  uint64_t first_seq = 0;     // 0 if none
  uint64_t last_seq = 0;      // 0 if none
  uint64_t valid_bytes = 0;   // the valid prefix: where a torn tail starts
  uint64_t file_bytes = 0;
  bool torn = false;          // bytes after valid_bytes that are a torn last record
  std::string torn_reason;    // what was wrong with it (for the log line)
};

// Reads and checks the whole log at `path`; calls `visit` (if set) for each valid record in
// order, only after the whole file has been checked (so a corrupt log applies nothing). A
// visit error stops the scan and is returned. A missing file is kNotFound.
Status ScanWal(const std::string& path, const std::function<Status(const WalRecord&)>& visit, WalScanInfo* info);

// Truncates `path` to `bytes` and fsyncs it (drops a torn tail).
Status TruncateWal(const std::string& path, uint64_t bytes);

// The record as bytes (header + payload), for tests that craft logs.
void EncodeWalRecord(const WalRecord& r, std::string* out);

}  // namespace downpour
