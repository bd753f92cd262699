// wal.h — a shard's write-ahead log: every state change the shard takes from the wire (a push,
// a worker's clock, a worker gone, an elastic worker joining) is staged here before it is
// applied, and acknowledged only once written, so an acknowledged update survives the death of
// the server process and, after the next fsync, of the machine.
// A restart (downpour-server --recover) loads the shard's checkpoint and replays the records
// the checkpoint does not cover (seq > the checkpoint's meta "wal_seq"), which rebuilds the
// exact state: replay goes through the same apply code as the live path, in the same order. It
// then checkpoints and logs into a new file (ShardDurability::Recover): a process that still
// holds the old file (a server replaced while it was cut off) cannot write into the new one.
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
// Writing: group commit on a log thread. The shard's loop stages a record (Submit: one copy of
// its bytes and its CRC into page-aligned staging, no system call) and goes on to apply it; the
// log thread writes whatever is staged with one pwrite per 4 MiB block and reports the records it
// has written (durable_seq); the shard acknowledges a message only once its records are durable.
// With O_DIRECT (WalIo, where the filesystem takes it) the disk's DMA reads the staging: no copy
// into the page cache and no kernel write-back on the cores that apply (the page cache path cost
// over half the throughput, bench/RESULTS.md §7). Direct writes are whole 4096-byte blocks, so
// the last block is written again with the next batch, and a log the process left without
// closing may end in up to 4095 zero bytes after its last record: padding, which ScanWal
// reports and the writer's own close trims.
//
// Durability is what WalOptions::fsync_ms promises: a written record survives the death of the
// server process (O_DIRECT: it is on the device; buffered: in the page cache); the log thread
// fdatasyncs at least every fsync_ms, or with fsync_ms = 0 after each batch, before the batch
// counts as durable, so that it also survives the machine.
//
// A disk without room (ENOSPC, EDQUOT) stalls the log: what is staged stays staged and is tried
// again every kWalStallRetry, Submit refuses new records (the shard refuses their messages as
// kLogWrite, and the clients send them again), and the staged records are written, each once,
// when there is room. Any other write error, or a failed fdatasync (after which the kernel may
// have dropped pages, and a later fdatasync that succeeds says nothing about them), is a failure
// for good: the shard stops, and a restart replays what the log holds.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/codec.h"
#include "common/status.h"
#include "common/config/checkpoint.h"
#include "common/transport.h"

namespace downpour {

inline constexpr uint32_t kWalMagic = 0x4C575044;  // "DPWL" on disk
inline constexpr uint16_t kWalVersion = 1;
inline constexpr size_t kWalHeaderBytes = 24;
inline constexpr uint32_t kWalMaxPayload = 1u << 30;  // a push of one shard is far smaller
inline constexpr size_t kWalBlock = 4096;             // O_DIRECT's unit: offsets, lengths, buffers
inline constexpr std::chrono::milliseconds kWalStallRetry{50};

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

struct WalOptions {
  // fdatasync at least this often (on the log thread); 0 = after every batch, before its records
  // count as durable. Must be >= 0.
  std::chrono::milliseconds fsync_ms{200};
  WalIo io = WalIo::kAuto;
  // Staged bytes the log thread has not written, at most: Submit waits beyond it (the disk sets
  // the pace). A record larger than this is staged whole once everything before it is written.
  size_t staging_bytes = size_t{256} << 20;
  // Called on the log thread after durable_seq() moved on, or the log stalled or failed. Keep it
  // short (wake the shard's loop); it must not call into the writer.
  std::function<void()> on_progress;
};

// Appends records to one log file (created 0600 if missing). Submit, Append, Drain, Sync and
// Restart from one thread at a time (the shard's loop); durable_seq, Stalled, Failure and
// sync_cpu_ns from any.
class WalWriter {
 public:
  // Opens `path`; `next_seq` is the seq the next record gets. truncate = start the log empty (a
  // fresh shard, or after --restore); otherwise records go after what is there (the caller has
  // scanned it and cut off a torn tail and padding).
  static Status Open(const std::string& path, uint64_t next_seq, bool truncate, const WalOptions& options,
                     std::unique_ptr<WalWriter>* out);
  static Status Open(const std::string& path, uint64_t next_seq, bool truncate, std::chrono::milliseconds fsync_ms,
                     std::unique_ptr<WalWriter>* out);
  // Writes what is staged (unless the log stalled or failed), trims the padding, fdatasyncs.
  ~WalWriter();

  // Stages `r` (its seq set to next_seq()) and returns: it is in the log once durable_seq() >=
  // r->seq. The record's floats and frames are copied, so they may change once this returns. Not
  // taken (no seq used, nothing staged): kInvalidArgument for a malformed record, or the stall or
  // failure that stops the log. Waits while staging is full.
  Status Submit(WalRecord* r);
  // Submit, then wait until the record is durable: Ok, or the stall or failure that stopped it (a
  // stalled record stays staged and is written once the disk has room).
  Status Append(WalRecord* r);
  // Waits until everything submitted is durable: Ok, or the stall or failure that stops it.
  Status Drain();
  Status Sync();  // Drain, then fdatasync now
  // Drains, then empties the log (after a checkpoint that covers everything in it); seq numbers go on.
  Status Restart();
  // Stops the log thread without writing what is staged (a write in progress completes), and
  // leaves the file as it is at close (no trim, no fdatasync): for a process fenced out of the run,
  // whose log another process now writes. Nothing staged was acknowledged. Submit refuses after it.
  void Abandon();

  uint64_t durable_seq() const { return durable_seq_.load(std::memory_order_acquire); }
  uint64_t last_seq() const { return next_seq_ - 1; }  // the last record submitted; 0 = none
  uint64_t next_seq() const { return next_seq_; }
  // Ok, or why the disk takes nothing now (no room): Submit refuses until a retry goes through.
  Status Stalled() const;
  // Ok while the log takes records; once it takes nothing more, why (for good).
  Status Failure() const;
  uint64_t bytes() const;  // the log's length with every submitted record
  // CPU time (ns) the log thread has used so far: the writes and fdatasyncs of the log, beside
  // the shard's loop.
  uint64_t sync_cpu_ns() const { return sync_cpu_ns_.load(std::memory_order_relaxed); }
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  // Whether the file at `path` is the one this writer writes (same device and inode); false once
  // it was unlinked or replaced there, or on an error reading either.
  bool WritesFileAt(const std::string& path) const;

 private:
  struct BlockFree {
    void operator()(std::byte* p) const;
  };
  using BlockMem = std::unique_ptr<std::byte, BlockFree>;
  struct Block {
    uint64_t offset = 0;  // the file offset of its first byte (a multiple of kWalBlock)
    BlockMem mem;         // kStageBlock bytes, kWalBlock-aligned
  };
  struct Piece {  // bytes for the file at `offset`
    const std::byte* data;
    uint64_t offset;
    size_t size;
  };
  static constexpr size_t kStageBlock = size_t{4} << 20;
  static BlockMem NewBlockMem();

  WalWriter(std::string path, int fd, bool direct, uint64_t next_seq, const WalOptions& options, uint64_t size,
            BlockMem first);

  void Run();  // the log thread
  Status WritePieces(const std::vector<Piece>& pieces);  // on the log thread, unlocked
  Status PushPieces(const WalRecord& r, std::vector<iovec>* iov);  // a push record's pieces
  void NoteCpu();

  const std::string path_;
  const int fd_;
  const bool direct_;
  const WalOptions options_;
  uint64_t next_seq_ = 1;  // the loop's
  std::string buf_;        // the loop's: a record's header and small fields

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Block> blocks_;  // the staged stream, contiguous from blocks_.front().offset
  std::vector<BlockMem> spare_;  // written blocks kept for reuse (within staging_bytes)
  BlockMem page_;                // the log thread's copy of a last, partial block (direct)
  uint64_t tail_ = 0;     // the log's length with every submitted record
  uint64_t written_ = 0;  // bytes the log thread has written (and synced, fsync_ms = 0)
  std::deque<std::pair<uint64_t, uint64_t>> pending_;  // (end offset, seq) of records not yet written
  bool dirty_ = false;    // written since the last fdatasync
  bool stop_ = false;
  Status stalled_;
  Status failed_;
  std::atomic<uint64_t> durable_seq_{0};
  std::atomic<uint64_t> sync_cpu_ns_{0};
  std::thread thread_;
};

// What ScanWal found.
struct WalScanInfo {
  uint64_t records = 0;       // valid records
  uint64_t first_seq = 0;     // 0 if none
  uint64_t last_seq = 0;      // 0 if none
  uint64_t valid_bytes = 0;   // the valid prefix: where a torn tail starts
  uint64_t file_bytes = 0;
  bool torn = false;          // bytes after valid_bytes that are a torn last record
  uint64_t padding_bytes = 0; // zero bytes after the last record, fewer than kWalBlock (not torn)
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
