// coordinator.cc — see coordinator.h.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

namespace downpour {

using Clock = std::chrono::steady_clock;

Coordinator::Coordinator(CoordinatorOptions options) : options_(std::move(options)) {
  server_addresses_.assign(static_cast<size_t>(std::max(options_.servers, 0)), std::string());
}

std::vector<int32_t> Coordinator::dead_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {dead_.begin(), dead_.end()};
}

std::vector<std::string> Coordinator::server_addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_addresses_;
}

bool Coordinator::AllServersRegistered() const {
  for (const auto& a : server_addresses_) {
    if (a.empty()) return false;
  }
  return true;
}

Status Coordinator::Serve(ServerEndpoint* ep) {
  while (!stop_.load()) {
    PeerId peer;
    Frames frames;
    Status s = ep->Receive(&peer, &frames, options_.poll_interval);
    if (s.ok()) {
      Handle(ep, peer, frames);
    } else if (s.code() != StatusCode::kTimeout) {
      return s;
    }
    CheckLiveness();
    if (shutdown_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      const bool everyone_told = told_shutdown_.size() >= peers_.size();
      if (everyone_told || Clock::now() - shutdown_at_ > options_.shutdown_grace) break;
    }
  }
  return Status::Ok();
}

void Coordinator::Reply(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h) {
  Frames frames(1);
  Status s = HeaderFrame(h, &frames[0]);
  if (s.ok()) s = ep->Send(peer, std::move(frames));
  if (!s.ok()) spdlog::warn("coordinator: reply {} failed: {}", MsgTypeName(h.type), s.ToString());
}

void Coordinator::Emit(const char* kind, int32_t id, std::string detail) {
  if (options_.on_event) options_.on_event(CoordinatorEvent{kind, id, std::move(detail)});
}

void Coordinator::CheckLiveness() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& [w, seen] : worker_seen_) {
    if (!dead_.count(w) && now - seen > options_.heartbeat_timeout) {
      dead_.insert(w);
      spdlog::warn("coordinator: worker {} silent for more than {} ms: declared dead", w,
                   options_.heartbeat_timeout.count());
      const auto clock = worker_clock_.find(w);
      Emit("worker_dead", w, fmt::format("last clock {}, silent > {} ms", clock == worker_clock_.end() ? 0 : clock->second,
                                         options_.heartbeat_timeout.count()));
    }
  }
}

void Coordinator::ReplyRegister(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h, int32_t id) {
  MessageHeader r;
  r.type = MsgType::kRegisterReply;
  r.request_id = h.request_id;
  r.model_id = options_.model_id;
  r.layout_hash = options_.layout_hash;
  r.assigned_id = id;
  r.server_addresses = server_addresses_;
  r.server_count = options_.servers;
  r.worker_count = options_.workers;
  Reply(ep, peer, r);
}

Status Coordinator::HandleRegister(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h) {
  if (h.layout_hash != options_.layout_hash) {
    return FailedPrecondition(
        "register refused: layout hash mismatch: {} {} has {:#018x}, coordinator has "
        "{:#018x} (different model, server count or chunk size)",
        h.role == Role::kServer ? "server" : "worker", h.sender, h.layout_hash, options_.layout_hash);
  }
  if (h.role == Role::kServer) {
    if (h.sender < 0 || h.sender >= options_.servers) {
      return InvalidArgument("register refused: server id {} outside 0..{}", h.sender, options_.servers - 1);
    }
    if (h.text.empty()) return InvalidArgument("register refused: server {} sent no address", h.sender);
    server_addresses_[static_cast<size_t>(h.sender)] = h.text;  // a restarted server re-registers
    peers_.insert(peer);
    spdlog::info("coordinator: server {} at {}", h.sender, h.text);
    Emit("server_registered", h.sender, h.text);
    ReplyRegister(ep, peer, h, h.sender);
    if (AllServersRegistered()) {
      for (const auto& p : pending_) ReplyRegister(ep, p.peer, p.request, p.request.sender);
      pending_.clear();
    }
    return Status::Ok();
  }
  if (h.role != Role::kWorker) {
    if (h.role == Role::kObserver) {
      ReplyRegister(ep, peer, h, -1);
      return Status::Ok();
    }
    return InvalidArgument("register refused: unknown role {}", static_cast<int>(h.role));
  }
  int32_t id = h.sender;
  if (id < 0) {
    while (worker_seen_.count(next_worker_)) ++next_worker_;
    id = next_worker_++;
  }
  if (id >= options_.workers) {
    return InvalidArgument("register refused: worker id {} outside 0..{} (cluster.workers = {})", id,
                           options_.workers - 1, options_.workers);
  }
  worker_seen_[id] = Clock::now();
  dead_.erase(id);  // a worker that comes back is alive again
  finished_.erase(id);
  peers_.insert(peer);
  spdlog::info("coordinator: worker {} registered", id);
  Emit("worker_registered", id, "");
  MessageHeader assigned = h;
  assigned.sender = id;
  if (AllServersRegistered()) {
    ReplyRegister(ep, peer, assigned, id);
  } else {
    pending_.push_back({peer, assigned});
  }
  return Status::Ok();
}

void Coordinator::Handle(ServerEndpoint* ep, const PeerId& peer, const Frames& frames) {
  std::lock_guard<std::mutex> lock(mu_);
  MessageHeader h;
  Status s = ParseHeader(frames, &h);
  if (!s.ok()) {
    spdlog::warn("coordinator: undecodable message: {}", s.ToString());
    Reply(ep, peer, ErrorReply(MessageHeader{}, s));
    return;
  }
  MessageHeader r;
  r.request_id = h.request_id;
  r.model_id = options_.model_id;
  switch (h.type) {
    case MsgType::kRegister:
      s = HandleRegister(ep, peer, h);
      if (s.ok()) return;
      break;
    case MsgType::kHeartbeat:
    case MsgType::kClock:
      if (h.role == Role::kWorker && h.sender >= 0) {
        worker_seen_[h.sender] = Clock::now();
        worker_clock_[h.sender] = std::max(worker_clock_[h.sender], h.clock);
        // A finished worker is gone at once (not after the heartbeat timeout): listed with the
        // dead, so servers stop waiting for it and the evaluating worker knows it is done.
        if ((h.flags & kFlagFinished) != 0 && finished_.insert(h.sender).second) {
          dead_.insert(h.sender);
          spdlog::info("coordinator: worker {} finished at clock {}", h.sender, h.clock);
          Emit("worker_finished", h.sender, fmt::format("clock {}", h.clock));
        }
      }
      r.type = h.type == MsgType::kClock ? MsgType::kAck : MsgType::kHeartbeat;
      r.dead_workers.assign(dead_.begin(), dead_.end());
      r.finished_workers.assign(finished_.begin(), finished_.end());
      r.shutdown = shutdown_.load();
      if (r.shutdown) told_shutdown_.insert(peer);
      Reply(ep, peer, r);
      return;
    case MsgType::kShutdown:
      if (!shutdown_.exchange(true)) {
        shutdown_at_ = Clock::now();
        spdlog::info("coordinator: shutdown requested by {} {}", h.role == Role::kServer ? "server" : "process", h.sender);
        Emit("shutdown", h.sender, h.role == Role::kServer ? "server" : h.role == Role::kWorker ? "worker" : "process");
      }
      told_shutdown_.insert(peer);
      r.type = MsgType::kAck;
      Reply(ep, peer, r);
      return;
    default:
      s = InvalidArgument("coordinator does not serve message type {}", MsgTypeName(h.type));
      break;
  }
  spdlog::warn("coordinator: {}", s.message());
  Reply(ep, peer, ErrorReply(h, s));
}

}  // namespace downpour
