// shard_durability.cc — see shard_durability.h.
#include "server/shard_durability.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "server/elapsed.h"

namespace downpour {

ShardDurability::ShardDurability(ShardDurabilityOptions options, DurableShard* shard)
    : o_(std::move(options)), shard_(shard), log_(o_.log) {}

Status ShardDurability::Open() {
  if (log_.open() || !log_.configured()) return Status::Ok();
  DP_RETURN_IF_ERROR(log_.CheckRoom());
  return log_.Open(seq_ + 1, /*truncate=*/true);
}

Status ShardDurability::Stage(WalRecord* r) {
  if (!log_.open()) return Status::Ok();
  if (!bound_failure_.ok()) {
    return IoError(
        "server {}: the write-ahead log {} is at its bound (checkpoint.wal_max_mb) and the checkpoint "
        "that empties it could not be written, so nothing more is taken until it is: {}",
        o_.server_id, log_.path(), bound_failure_.message());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes0 = log_.bytes();
  const Status s = log_.Stage(r, r->kind == WalKind::kPush || r->kind == WalKind::kCodedPush ? "push" : "change");
  counts_.wal_ns += NanosSince(t0);
  DP_RETURN_IF_ERROR(s);
  seq_ = r->seq;
  ++counts_.wal_records;
  counts_.wal_bytes += log_.bytes() - bytes0;
  if (r->kind == WalKind::kCodedPush) ++counts_.wal_coded_records;
  return Status::Ok();
}

void ShardDurability::AfterChange() {
  if (replaying_ || o_.checkpoint_path.empty()) return;  // replay rebuilds; the next live change may checkpoint
  if (AtBound()) {
    SaveAtBound();
    return;
  }
  const int64_t rounds = Rounds();
  if (o_.every_rounds <= 0 || o_.owned_chunks == 0) return;
  if (rounds - rounds_at_last_checkpoint_ < o_.every_rounds) return;
  const Status s = Save(o_.checkpoint_path);
  if (!s.ok()) spdlog::error("shard {}: periodic checkpoint failed: {}", o_.server_id, s.ToString());
  rounds_at_last_checkpoint_ = rounds;
}

void ShardDurability::Tick() {
  if (!bound_failure_.ok()) SaveAtBound();
  const auto now = std::chrono::steady_clock::now();
  if (log_.open() && now >= next_owner_check_) {  // a replaced process stops within a second
    next_owner_check_ = now + kOwnerCheckEvery;
    (void)log_.CheckOwned();
  }
}

void ShardDurability::SaveAtBound() {
  const auto now = std::chrono::steady_clock::now();
  if (!bound_failure_.ok() && now < bound_retry_at_) return;  // a checkpoint is large: not one per message
  // The log's bound (checkpoint.wal_max_mb): a checkpoint covers it all and empties it.
  const Status s = Save(o_.checkpoint_path);
  rounds_at_last_checkpoint_ = Rounds();
  if (s.ok()) {
    if (!bound_failure_.ok()) {
      spdlog::info("shard {}: the checkpoint at the log's bound went through: changes are taken again", o_.server_id);
    }
    bound_failure_ = Status::Ok();
    return;
  }
  if (bound_failure_.ok()) {
    spdlog::error(
        "shard {}: the log {} reached its bound ({} MiB) and the checkpoint that empties it failed: {}; "
        "changes are refused until it goes through (tried every {} ms)",
        o_.server_id, log_.path(), o_.log.max_bytes >> 20, s.message(), o_.bound_retry.count());
  }
  bound_failure_ = s;
  bound_retry_at_ = now + o_.bound_retry;
}

Status ShardDurability::Save(const std::string& path) {
  // Its own checkpoint empties its log: only while the log at the path is still this process's.
  if (path == o_.checkpoint_path) DP_RETURN_IF_ERROR(log_.CheckOwned());
  DP_RETURN_IF_ERROR(WriteTensorFile(path, shard_->Checkpoint(seq_)));
  ++counts_.checkpoints_written;
  spdlog::info("shard {}: checkpoint written to {} ({} updates, log seq {})", o_.server_id, path, shard_->updates(),
               seq_);
  // The checkpoint (renamed into place and fsynced) covers every record so far: the log starts
  // over. A crash before the restart is safe: replay skips seq <= the checkpoint's.
  if (log_.open() && path == o_.checkpoint_path) DP_RETURN_IF_ERROR(log_.Restart());
  return Status::Ok();
}

Status ShardDurability::Load(const std::string& path) {
  TensorFile file;
  DP_RETURN_IF_ERROR(ReadTensorFile(path, &file));
  uint64_t seq = 0;
  DP_RETURN_IF_ERROR(shard_->Restore(file, path, &seq));
  seq_ = seq;
  rounds_at_last_checkpoint_ = Rounds();
  spdlog::info("shard {}: restored from {} ({} updates)", o_.server_id, path, shard_->updates());
  return Status::Ok();
}

Status ShardDurability::Recover(RecoverReport* report) {
  *report = RecoverReport{};
  std::error_code ec;
  if (!o_.checkpoint_path.empty() && std::filesystem::exists(o_.checkpoint_path, ec)) {
    DP_RETURN_IF_ERROR(Load(o_.checkpoint_path));
    report->checkpoint_loaded = true;
  }
  report->checkpoint_updates = shard_->updates();
  report->checkpoint_seq = seq_;
  if (!log_.configured()) return Status::Ok();
  DP_RETURN_IF_ERROR(log_.CheckRoom());
  const std::string& path = log_.path();
  if (!std::filesystem::exists(path, ec)) return log_.Open(seq_ + 1, /*truncate=*/true);
  WalScanInfo info;
  DP_RETURN_IF_ERROR(ScanWal(path, nullptr, &info));  // the whole log checked before anything applies
  if (info.records > 0 && info.first_seq > seq_ + 1) {
    return Corrupt(
        "{}: byte 0: field seq: the log starts at record {} but the checkpoint {} covers up to {}: "
        "records {}..{} are missing (wrong checkpoint, or a log from another run)",
        path, info.first_seq, report->checkpoint_loaded ? o_.checkpoint_path : "(none)", seq_, seq_ + 1,
        info.first_seq - 1);
  }
  const uint64_t covered = seq_;
  DP_RETURN_IF_ERROR(ReplayLog(covered, report, &info));
  if (info.valid_bytes < info.file_bytes) {  // a torn record, or a direct writer's padding
    DP_RETURN_IF_ERROR(TruncateWal(path, info.valid_bytes));
  }
  if (info.torn) {
    report->torn_tail = true;
    spdlog::warn("server {}: {}: dropped a torn last record at byte {} ({} bytes; it was never acknowledged): {}",
                 o_.server_id, path, info.valid_bytes, info.file_bytes - info.valid_bytes, info.torn_reason);
  }
  const bool nothing_new = info.records == 0 || info.last_seq <= covered;
  if (o_.checkpoint_path.empty()) return log_.Open(seq_ + 1, /*truncate=*/nothing_new);
  // The log goes on in a new file, never in the old one: a process that still holds the old file
  // open (a server replaced while it was cut off or stopped, which may take a message before it
  // hears it is out) can then write only into a file the run no longer reads. What the old file
  // holds past the checkpoint goes into a new checkpoint first.
  if (!nothing_new) DP_RETURN_IF_ERROR(Save(o_.checkpoint_path));
  DP_RETURN_IF_ERROR(log_.Retire(info.records > 0 ? info.last_seq : 0));
  return log_.Open(seq_ + 1, /*truncate=*/true);
}

Status ShardDurability::ReplayLog(uint64_t covered, RecoverReport* report, WalScanInfo* info) {
  const std::string& path = log_.path();
  replaying_ = true;
  const Status s = ScanWal(
      path,
      [&](const WalRecord& r) -> Status {
        if (r.seq <= covered) return Status::Ok();  // in the checkpoint already
        DP_RETURN_IF_ERROR(shard_->Apply(r, path));
        seq_ = r.seq;
        ++report->replayed;
        if (r.kind == WalKind::kPush || r.kind == WalKind::kCodedPush) ++report->replayed_pushes;
        return Status::Ok();
      },
      info);
  replaying_ = false;
  counts_.replayed += report->replayed;
  return s;
}

Status ShardDurability::Replay(const WalRecord& r, const std::string& path) {
  replaying_ = true;
  const Status s = shard_->Apply(r, path);
  replaying_ = false;
  DP_RETURN_IF_ERROR(s);
  seq_ = r.seq;
  ++counts_.replayed;
  return Status::Ok();
}

void ShardDurability::AddStats(ShardStatsWire* s) const {
  s->wal_ns += counts_.wal_ns;
  s->wal_records += counts_.wal_records;
  s->wal_bytes += counts_.wal_bytes;
  s->wal_coded_records += counts_.wal_coded_records;
  s->checkpoints_written += counts_.checkpoints_written;
  s->replayed += counts_.replayed;
  if (log_.open()) s->wal_sync_cpu_ns += log_.sync_cpu_ns();
}

}  // namespace downpour
