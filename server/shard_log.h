// shard_log.h — ShardLog, a shard's side of its write-ahead log (server/wal.h): opening it once
// its directory has room for it, staging each change as a record (counted in the shard's
// stats), the replies held until the log has written what they acknowledge, and the failure
// that stops the shard. Replay is ShardDurability's (server/shard_durability.h): it goes through
// the same apply path as live traffic.
//
// Held replies: a reply to a change staged in the log waits until the log's durable seq reaches
// the change's (at most kMaxHeld; past that the loop waits for the disk). When the log stalls
// for room, what waits is refused as the log's (kLogWrite), so senders back off and resend (a
// resend is a duplicate, acknowledged once the original is written). When the log fails for
// good, what waits is never acknowledged: senders resend it to the restarted server.
//
// Thread-safety: the shard's loop (under its lock), except failed(), which any thread may read.
// The log's own thread calls only on_progress (ShardLogOptions).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "common/codec.h"
#include "common/transport.h"
#include "server/wal.h"

namespace downpour {

struct ShardLogOptions {
  int server_id = 0;
  std::string path;  // the log file; "" = no log
  std::chrono::milliseconds fsync_ms{200};
  WalIo io = WalIo::kAuto;
  // checkpoint.wal_max_mb in bytes (0 = unbounded). With it, Open checks that the log's
  // directory has room for it and two checkpoints of checkpoint_bytes (what checkpoint_path and
  // the log hold already counts as taken).
  uint64_t max_bytes = 0;
  uint64_t checkpoint_bytes = 0;
  std::string checkpoint_path;
  std::function<void()> on_progress;  // the log thread wrote more, or failed (wakes the loop)
  // checkpoint.history: Restart keeps what the log holds as `path`.<last seq> (KeptSegmentPath)
  // instead of emptying it, so that every record of the run stays on disk for downpour-history.
  bool keep_segments = false;
};

// Where a log restarted with keep_segments puts its records up to `last_seq`: "<log>.<seq>", the
// seq zero-padded to 20 digits so that the names sort in the order of the records.
std::string KeptSegmentPath(const std::string& log_path, uint64_t last_seq);

class ShardLog {
 public:
  static constexpr size_t kMaxHeld = 65536;  // replies held at most (then the loop drains the log)

  explicit ShardLog(ShardLogOptions options) : o_(std::move(options)) {}

  bool configured() const { return !o_.path.empty(); }
  bool open() const { return wal_ != nullptr; }
  const std::string& path() const { return o_.path; }
  // kFailedPrecondition naming the directory when it lacks room for max_bytes and two checkpoints.
  Status CheckRoom() const;
  // Opens the log to append records from `first_seq` (`truncate`: empty it first); one line says
  // how it writes, syncs and is bounded.
  Status Open(uint64_t first_seq, bool truncate);

  // Stages `r` (r->seq set). On failure the error names the log and what was not taken
  // (`change`: "push", "change"), and failed() may now be true.
  Status Stage(WalRecord* r, const char* change);
  uint64_t bytes() const { return wal_ ? wal_->bytes() : 0; }  // what the log file holds now

  // Sends `reply` (send) now when the log holds everything staged, else holds it until it does.
  using Send = std::function<void(const PeerId& peer, const MessageHeader& reply)>;
  using Refuse = std::function<void(const PeerId& peer, const MessageHeader& request, const Status& why)>;
  void ReplyWhenLogged(const PeerId& peer, const MessageHeader& reply, MsgType request_type, const Send& send,
                       const Refuse& refuse);
  // Sends the held replies the log has made durable; on a stalled log refuses the rest; on a
  // failed one forgets them.
  void ReleaseHeld(const Send& send, const Refuse& refuse);

  // A process fenced out of the run: the log is closed without writing anything more, and the
  // held replies are forgotten (never acknowledged: their senders resend them to the process that
  // took this one's place).
  void Abandon() {
    if (wal_) wal_->Abandon();
    held_.clear();
  }
  bool failed() const { return failed_.load(); }
  // Whether the open log is still the file at its path. Another process serving this server's id
  // (started with --recover while this one was stopped or cut off) retires the file and opens its
  // own there; from then on this process must write nothing in the run directory (a checkpoint
  // would overwrite that process's, and moving the log aside would move its log): superseded()
  // for good, one error line, FailedPrecondition. Ok without an open log.
  Status CheckOwned();
  bool superseded() const { return superseded_.load(); }  // thread-safe
  Status Failure() const { return wal_ ? wal_->Failure() : Status::Ok(); }
  Status Sync() { return wal_ ? wal_->Sync() : Status::Ok(); }
  // A checkpoint covers everything in the log: empty it, or with keep_segments move it aside and
  // start a new file (seq numbers go on either way).
  Status Restart();
  // Before Open, after a checkpoint that covers the log file (whose last record is `last_seq`; 0 =
  // none): the file is unlinked, so the next Open makes a new one and nobody can write into it
  // through an old descriptor; with keep_segments its records are first copied to the kept segment.
  Status Retire(uint64_t last_seq);
  uint64_t sync_cpu_ns() const { return wal_ ? wal_->sync_cpu_ns() : 0; }

 private:
  void NoteFailure();  // the log failed for good: failed(), one line
  Status MoveAside(uint64_t last_seq);  // renames the log file to KeptSegmentPath
  WalOptions WriterOptions() const;      // the log writer's options, from o_

  struct Held {
    PeerId peer;
    MessageHeader reply;
    MsgType request_type = MsgType::kPush;
    uint64_t seq = 0;  // sent once the log's durable_seq reaches it
  };
  const ShardLogOptions o_;
  std::unique_ptr<WalWriter> wal_;
  std::deque<Held> held_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> superseded_{false};
};

}  // namespace downpour
