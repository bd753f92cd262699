#include "server/shard_log.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/env.h"
#include "common/file_io.h"

namespace downpour {

// The log's directory must take what the shard may write there before its next checkpoint
// empties the log: the bounded log, and a checkpoint written beside the last one.
Status ShardLog::CheckRoom() const {
  if (o_.max_bytes == 0 || o_.path.empty()) return Status::Ok();
  const std::filesystem::path dir = std::filesystem::path(o_.path).parent_path();
  const std::string where = dir.empty() ? std::string(".") : dir.string();
  std::error_code ec;
  auto size_of = [&](const std::string& p) -> uint64_t {
    if (p.empty()) return 0;
    const auto n = std::filesystem::file_size(p, ec);
    return ec ? 0 : static_cast<uint64_t>(n);
  };
  const uint64_t want = o_.max_bytes + 2 * o_.checkpoint_bytes;
  const uint64_t have_already = size_of(o_.path) + size_of(o_.checkpoint_path);
  const uint64_t need = want > have_already ? want - have_already : 0;
  const int64_t free = CurrentEnv().FreeBytes(where.c_str());
  if (free < 0) return IoError("server {}: cannot tell the free space of {}: {}", o_.server_id, where, std::strerror(errno));
  if (static_cast<uint64_t>(free) < need) {
    return FailedPrecondition(
        "server {}: {} has {:.1f} MiB free, and the write-ahead log needs {:.1f} MiB there (checkpoint.wal_max_mb = "
        "{} and two checkpoints of {:.1f} MiB): free some space, lower checkpoint.wal_max_mb, or set checkpoint.wal = "
        "false",
        o_.server_id, where, static_cast<double>(free) / (1 << 20), static_cast<double>(need) / (1 << 20),
        o_.max_bytes >> 20, static_cast<double>(o_.checkpoint_bytes) / (1 << 20));
  }
  return Status::Ok();
}

WalOptions ShardLog::WriterOptions() const {
  WalOptions wo;
  wo.fsync_ms = o_.fsync_ms;
  wo.io = o_.io;
  wo.on_progress = o_.on_progress;
  return wo;
}

Status ShardLog::Open(uint64_t first_seq, bool truncate) {
  DP_RETURN_IF_ERROR(WalWriter::Open(o_.path, first_seq, truncate, WriterOptions(), &wal_));
  spdlog::info("server {}: write-ahead log {} ({}, fsync {}, checkpoint at {})", o_.server_id, wal_->path(),
               wal_->direct()             ? "O_DIRECT"
               : o_.io == WalIo::kBuffered ? "buffered"
                                           : "buffered: the filesystem takes no O_DIRECT",
               o_.fsync_ms.count() == 0 ? std::string("before every ack") : fmt::format("every {} ms", o_.fsync_ms.count()),
               o_.max_bytes == 0 ? std::string("no size bound") : fmt::format("{} MiB", o_.max_bytes >> 20));
  return Status::Ok();
}

std::string KeptSegmentPath(const std::string& log_path, uint64_t last_seq) {
  return fmt::format("{}.{:020}", log_path, last_seq);
}

Status ShardLog::Restart() {
  if (!wal_) return Status::Ok();
  if (!o_.keep_segments || wal_->last_seq() == 0 || wal_->bytes() == 0) return wal_->Restart();
  // Everything written and synced; the file renamed under the open writer and the rename made
  // durable; a new log opened at the path; only then the old writer closed (its padding trimmed).
  // On an error the old writer goes on, into the kept file, and the history stays whole.
  DP_RETURN_IF_ERROR(wal_->Sync());
  DP_RETURN_IF_ERROR(MoveAside(wal_->last_seq()));
  std::unique_ptr<WalWriter> next;
  DP_RETURN_IF_ERROR(WalWriter::Open(o_.path, wal_->next_seq(), /*truncate=*/true, WriterOptions(), &next));
  wal_.swap(next);
  return Status::Ok();
}

Status ShardLog::CheckOwned() {
  if (!wal_) return Status::Ok();
  if (!superseded_.load() && wal_->WritesFileAt(o_.path)) return Status::Ok();
  if (!superseded_.exchange(true)) {
    spdlog::error(
        "server {}: {} is no longer the file this process writes: another process serves this server's id "
        "and took the log over; writing nothing more in the run directory",
        o_.server_id, o_.path);
  }
  return FailedPrecondition("server {}: {} was taken over by another process serving this server's id", o_.server_id,
                            o_.path);
}

Status ShardLog::Retire(uint64_t last_seq) {
  if (wal_ != nullptr) return FailedPrecondition("server {}: {}: the log is open", o_.server_id, o_.path);
  std::error_code ec;
  if (o_.keep_segments && last_seq > 0) {
    const std::string kept = KeptSegmentPath(o_.path, last_seq);
    std::filesystem::copy_file(o_.path, kept, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return IoError("server {}: keeping the log {} as {}: {}", o_.server_id, o_.path, kept, ec.message());
    DP_RETURN_IF_ERROR(TruncateWal(kept, std::filesystem::file_size(kept)));  // fsyncs the copy
  }
  std::filesystem::remove(o_.path, ec);
  if (ec) return IoError("server {}: removing the log {}: {}", o_.server_id, o_.path, ec.message());
  return FsyncParentDirectory(o_.path);
}

Status ShardLog::MoveAside(uint64_t last_seq) {
  const std::string kept = KeptSegmentPath(o_.path, last_seq);
  std::error_code ec;
  std::filesystem::rename(o_.path, kept, ec);
  if (ec) return IoError("server {}: keeping the log {} as {}: {}", o_.server_id, o_.path, kept, ec.message());
  return FsyncParentDirectory(kept);
}

Status ShardLog::Stage(WalRecord* r, const char* change) {
  const Status s = wal_->Submit(r);  // staged: the log thread writes it while the lanes apply it
  if (s.ok()) return s;
  NoteFailure();
  return IoError("server {}: the write-ahead log failed, so the {} was not taken: {}", o_.server_id, change, s.message());
}

void ShardLog::NoteFailure() {
  if (!wal_ || failed_.load()) return;
  if (const Status failure = wal_->Failure(); !failure.ok()) {
    failed_.store(true);
    spdlog::error(
        "server {}: the write-ahead log takes nothing more ({}): stopping, to be restarted from its "
        "checkpoint and log; what it had not written is left unanswered",
        o_.server_id, failure.message());
  }
}

void ShardLog::ReplyWhenLogged(const PeerId& peer, const MessageHeader& reply, MsgType request_type, const Send& send,
                               const Refuse& refuse) {
  if (!wal_ || wal_->durable_seq() >= wal_->last_seq()) {
    send(peer, reply);
    return;
  }
  held_.push_back(Held{peer, reply, request_type, wal_->last_seq()});
  if (held_.size() >= kMaxHeld) {  // bounded: wait for the disk rather than grow
    (void)wal_->Drain();
    ReleaseHeld(send, refuse);
  }
}

void ShardLog::ReleaseHeld(const Send& send, const Refuse& refuse) {
  if (!wal_) return;
  NoteFailure();
  if (failed_.load()) {
    held_.clear();  // never acknowledged: their senders resend them to the restarted server
    return;
  }
  const uint64_t durable = wal_->durable_seq();
  while (!held_.empty() && held_.front().seq <= durable) {
    send(held_.front().peer, held_.front().reply);
    held_.pop_front();
  }
  if (held_.empty()) return;
  // A disk without room: what waits is refused as the log's (kLogWrite), so its senders back off
  // and send it again, as for a message the stalled log refused outright. The change is applied
  // and staged; a resend is a duplicate, acknowledged once the log has written the original.
  const Status stalled = wal_->Stalled();
  if (stalled.ok()) return;
  for (const Held& h : held_) {
    MessageHeader request;
    request.type = h.request_type;
    request.request_id = h.reply.request_id;
    request.model_id = h.reply.model_id;
    refuse(h.peer, request,
           IoError("server {}: the write-ahead log failed, so the {} is not acknowledged yet: {}", o_.server_id,
                   MsgTypeName(h.request_type), stalled.message()));
  }
  held_.clear();
}

}  // namespace downpour
