// shard_durability.h — ShardDurability, what keeps a shard's state across a dead process: its
// write-ahead log (ShardLog, server/shard_log.h), its checkpoints (when one is due, where it
// goes, what it empties), and recovery (a checkpoint loaded, then the log replayed past it).
//
// It owns no weights. What a checkpoint holds, how a file is adopted, and how a log record is
// applied are the shard's (DurableShard): replay goes through the shard's live apply path, so a
// recovered shard is byte for byte the one that died. docs/architecture.md "The server's parts
// and threads", docs/operations.md "Checkpoints".
//
// Thread-safety: the shard's loop, under the shard's lock (Recover, Load and Open before the
// loop), except log().failed(). The log's own thread calls only ShardLogOptions::on_progress.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/codec.h"
#include "common/status.h"
#include "common/tensor_file.h"
#include "server/shard_log.h"
#include "server/wal.h"

namespace downpour {

// What durability asks of the shard it keeps; called under the shard's lock.
class DurableShard {
 public:
  virtual ~DurableShard() = default;
  // A checkpoint of everything the shard's behaviour depends on, covering log records up to
  // `wal_seq` (server/shard_checkpoint.h).
  virtual TensorFile Checkpoint(uint64_t wal_seq) = 0;
  // Checks all of `file` (read from `path`) against the shard before changing anything, then
  // adopts it; *wal_seq: the last log record the file covers. Errors name `path` and the field.
  virtual Status Restore(TensorFile& file, const std::string& path, uint64_t* wal_seq) = 0;
  // One log record (of `path`) through the live apply path; kCorrupt naming `path` and the record
  // for one the shard cannot take.
  virtual Status Apply(const WalRecord& r, const std::string& path) = 0;
  virtual int64_t updates() const = 0;  // chunk updates applied
};

// What Recover() did.
struct RecoverReport {
  bool checkpoint_loaded = false;
  int64_t checkpoint_updates = 0;  // the checkpoint's applied chunk updates
  uint64_t checkpoint_seq = 0;     // the last log seq the checkpoint covers
  uint64_t replayed = 0;           // log records replayed after the checkpoint
  uint64_t replayed_pushes = 0;    // of which pushes
  bool torn_tail = false;          // a torn last record was dropped
};

struct ShardDurabilityOptions {
  int server_id = 0;
  // Where the shard's own checkpoints go ("" = none): periodic ones, the log's bound's, and the
  // one after a recovery. A save there empties the log.
  std::string checkpoint_path;
  // checkpoint.every_updates: a checkpoint every this many rounds (chunk updates / owned_chunks);
  // 0 = none.
  int64_t every_rounds = 0;
  int64_t owned_chunks = 0;
  ShardLogOptions log;  // log.path "" = no log (its max_bytes: a checkpoint when reached)
  // A checkpoint at the log's bound that failed is tried again this often (AfterChange, Tick).
  std::chrono::milliseconds bound_retry{1000};
};

class ShardDurability {
 public:
  ShardDurability(ShardDurabilityOptions options, DurableShard* shard);

  ShardLog& log() { return log_; }
  const ShardLog& log() const { return log_; }
  bool logging() const { return log_.open(); }
  // A replay is applying records: the shard counts no live traffic and writes no checkpoint.
  bool replaying() const { return replaying_; }
  uint64_t seq() const { return seq_; }  // the last record in the state: staged, replayed or checkpointed

  // Opens the log for a fresh start: empties it, seq continuing after a loaded checkpoint's.
  // No-op when the log is off or already open (Recover). kFailedPrecondition naming the
  // directory when it lacks room for the log's bound and two checkpoints.
  Status Open();
  // Stages `r` in the log (no-op when it is off) and counts it. On failure nothing was taken:
  // the log's own (server/shard_log.h), or while the log is at its bound and the checkpoint
  // that would empty it cannot be written (bound_failure()).
  Status Stage(WalRecord* r);
  // After a change: a checkpoint to checkpoint_path when the log has reached its bound or
  // every_rounds have passed since the last one. A periodic one that fails is a line, and the log
  // goes on. One at the bound that fails (a full disk) holds the bound instead: Stage refuses
  // every change, and the checkpoint is tried again every bound_retry until it goes through.
  void AfterChange();
  // On the loop after every receive or timeout: tries a failed bound checkpoint again when due,
  // and once a second checks the log is still this process's (ShardLog::CheckOwned).
  void Tick();
  // Ok, or why the log is held at its bound (the failed checkpoint's error).
  const Status& bound_failure() const { return bound_failure_; }

  // A checkpoint to `path`; to checkpoint_path it empties the log (replay skips seq <= the
  // checkpoint's, so a crash between the two is safe), and is refused, writing nothing, once the
  // log was taken over by another process (ShardLog::CheckOwned).
  Status Save(const std::string& path);
  Status Load(const std::string& path);
  // Rebuilds a dead process's shard: loads checkpoint_path and replays the log past it (either
  // may be missing), drops a torn last record. With a checkpoint path, what was replayed is
  // checkpointed at once and the log goes on in a new file (the old one unlinked, or kept as a
  // segment), so a process that still holds the old file open cannot write into the log this one
  // writes; else the log goes on in the old file. Leaves the log open. Errors name the file,
  // offset and field; after one the shard must not serve.
  Status Recover(RecoverReport* report);
  // One record of a log, as Recover applies it, whatever its seq (downpour-history). The log closed.
  Status Replay(const WalRecord& r, const std::string& path);

  // Its counters: wal_ns, wal_records, wal_bytes, wal_coded_records, wal_sync_cpu_ns,
  // checkpoints_written, replayed.
  void AddStats(ShardStatsWire* s) const;

 private:
  Status ReplayLog(uint64_t covered, RecoverReport* report, WalScanInfo* info);
  bool AtBound() const { return log_.open() && o_.log.max_bytes > 0 && log_.bytes() >= o_.log.max_bytes; }
  // Full rounds of the shard's chunk updates so far (every_rounds' unit).
  int64_t Rounds() const { return shard_->updates() / std::max<int64_t>(1, o_.owned_chunks); }
  void SaveAtBound();  // the bound's checkpoint, or its retry when due

  const ShardDurabilityOptions o_;
  DurableShard* const shard_;
  ShardLog log_;
  uint64_t seq_ = 0;
  bool replaying_ = false;
  int64_t rounds_at_last_checkpoint_ = 0;
  Status bound_failure_;
  std::chrono::steady_clock::time_point bound_retry_at_;
  static constexpr std::chrono::seconds kOwnerCheckEvery{1};
  std::chrono::steady_clock::time_point next_owner_check_{};
  ShardStatsWire counts_;  // only the fields AddStats names
};

}  // namespace downpour
