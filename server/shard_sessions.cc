// shard_sessions.cc — see shard_sessions.h.
#include "server/shard_sessions.h"

#include <spdlog/spdlog.h>

namespace downpour {

ShardSessions::ShardSessions(ShardSessionsOptions options, const ShmShare& share)
    : o_(std::move(options)),
      share_(share),
      boot_id_(HostBootId()),
      duplicates_(o_.max_workers),
      fence_(o_.max_workers),
      peers_(o_.max_workers),
      logged_session_(static_cast<size_t>(o_.max_workers)) {}

Status ShardSessions::CheckRegister(const PeerInfo& info, const MessageHeader& h, RejectReason* reason) const {
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(o_.access, info, h, Privilege::kRegisterWorker));
  *reason = RejectReason::kLayoutHash;
  if (h.layout_hash != o_.layout_hash) {
    return FailedPrecondition(
        "register: layout hash mismatch: worker {} has {:#018x}, server {} has "
        "{:#018x} (different model, server count or chunk size)",
        h.sender, h.layout_hash, o_.server_id, o_.layout_hash);
  }
  *reason = RejectReason::kNotRegistered;
  if (h.sender < 0 || h.sender >= o_.max_workers) {
    return InvalidArgument("register: worker id {} is outside 0..{} (cluster.max_workers = {})", h.sender,
                           o_.max_workers - 1, o_.max_workers);
  }
  *reason = RejectReason::kModelId;
  if (h.model_id != o_.model_id) {
    return InvalidArgument("register: model id {} is not served here (server serves {})", h.model_id, o_.model_id);
  }
  return CheckNotRemoved(h.sender, h.session, reason);
}

Status ShardSessions::RegisterWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                     MessageHeader* reply) {
  if (peers_.RegisterWorker(peer, h.sender)) {
    fence_.Registered(h.sender, h.session, std::chrono::steady_clock::now());
    // One line a worker process: its further connections (cluster.connections_per_server) and
    // reconnects register under the same session.
    std::optional<uint64_t>& logged = logged_session_[static_cast<size_t>(h.sender)];
    if (logged != h.session) {
      spdlog::info("server {}: worker {} registered from {}", o_.server_id, h.sender, DescribePeer(info));
      logged = h.session;
    } else {
      spdlog::debug("server {}: worker {}: another connection of its process from {}", o_.server_id, h.sender,
                    DescribePeer(info));
    }
  }
  return OfferRegion(peer, h, reply);
}

Status ShardSessions::OfferRegion(const PeerId& peer, const MessageHeader& h, MessageHeader* reply) {
  peers_.DropRegion(peer);  // a register starts over: a region from before is not in use any more
  const bool asked = (h.flags & kFlagShm) != 0;
  if (!asked || !o_.shared_memory || share_.floats == 0) return Status::Ok();
  if (h.boot_id.empty() || h.boot_id != boot_id_) return Status::Ok();  // another machine: the socket it is
  std::unique_ptr<SharedRegion> region;
  DP_RETURN_IF_ERROR(
      SharedRegion::Create(fmt::format("downpour-s{}-w{}", o_.server_id, h.sender), share_.region_bytes(), &region));
  reply->shm_path = region->path();
  reply->shm_bytes = region->payload_bytes();
  reply->shm_nonce = region->nonce();
  peers_.SetRegion(peer, std::move(region));
  return Status::Ok();
}

Status ShardSessions::RegisterReader(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                     RejectReason* reason) {
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(o_.access, info, h, Privilege::kEvaluate));
  *reason = RejectReason::kLayoutHash;
  if (h.layout_hash != o_.layout_hash) {
    return FailedPrecondition("register: layout hash mismatch: the evaluator has {:#018x}, server {} has {:#018x}",
                              h.layout_hash, o_.server_id, o_.layout_hash);
  }
  *reason = RejectReason::kModelId;
  if (h.model_id != o_.model_id) {
    return InvalidArgument("register: model id {} is not served here (server serves {})", h.model_id, o_.model_id);
  }
  if (peers_.RegisterReader(peer)) {
    spdlog::info("server {}: the evaluator registered from {}", o_.server_id, DescribePeer(info));
  }
  return Status::Ok();
}

Status ShardSessions::CheckWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                  RejectReason* reason) const {
  if (Status s = Authorize(o_.access, info, h, Privilege::kWorkerTraffic); !s.ok()) {
    *reason = RejectReason::kUnauthorized;
    return s;
  }
  DP_RETURN_IF_ERROR(CheckNotRemoved(h.sender, h.session, reason));
  if (!peers_.IsWorker(peer, h.sender)) {
    *reason = RejectReason::kNotRegistered;
    return FailedPrecondition("{}: sender {} is not registered with server {} on this connection", MsgTypeName(h.type),
                              h.sender, o_.server_id);
  }
  DP_RETURN_IF_ERROR(CheckLayoutAndModel(h, reason));
  // A clock is a count of iterations: the consistency arithmetic (clock + 1, clock - s) must not
  // overflow on a forged one.
  if (h.clock < 0 || h.clock > kMaxClock) {
    *reason = RejectReason::kClock;
    return InvalidArgument("{}: clock {} is outside 0..{}", MsgTypeName(h.type), h.clock, kMaxClock);
  }
  return Status::Ok();
}

Status ShardSessions::CheckReader(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const {
  if (!peers_.IsReader(peer)) {
    *reason = RejectReason::kNotRegistered;
    return FailedPrecondition("pull: this connection is not registered as the evaluator with server {}", o_.server_id);
  }
  return CheckLayoutAndModel(h, reason);
}

Status ShardSessions::CheckLayoutAndModel(const MessageHeader& h, RejectReason* reason) const {
  if (h.layout_hash != o_.layout_hash) {
    *reason = RejectReason::kLayoutHash;
    return FailedPrecondition("{}: layout hash {:#018x} differs from server {}'s {:#018x}", MsgTypeName(h.type),
                              h.layout_hash, o_.server_id, o_.layout_hash);
  }
  if (h.model_id != o_.model_id) {
    *reason = RejectReason::kModelId;
    return InvalidArgument("{}: model id {} is not served by server {} (serves {})", MsgTypeName(h.type), h.model_id,
                           o_.server_id, o_.model_id);
  }
  return Status::Ok();
}

Status ShardSessions::CheckNotRemoved(int32_t worker, uint64_t session, RejectReason* reason) const {
  if (!fence_.Removed(worker, session)) return Status::Ok();
  *reason = RejectReason::kRemoved;
  return FailedPrecondition(
      "worker {} was declared dead by the coordinator (silent past cluster.heartbeat_timeout_ms: the process was "
      "stopped or cut off), so this process is out of the run; a restarted one (--resume) joins again",
      worker);
}

void ShardSessions::DeclaredDead(int32_t worker) {
  // It registered before its silence began, at least the timeout before this notice; a process
  // restarted under the same id registers later, after the coordinator took the id back.
  const auto cutoff = std::chrono::steady_clock::now() - o_.heartbeat_timeout / 2;
  for (uint64_t session : fence_.Fence(worker, cutoff)) {
    spdlog::info("server {}: worker {} declared dead: its process (client session {:016x}) is out of the run",
                 o_.server_id, worker, session);
  }
}

}  // namespace downpour
