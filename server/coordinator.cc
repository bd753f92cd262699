// coordinator.cc — see coordinator.h.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace downpour {

namespace {

const char* RoleName(Role r) {
  switch (r) {
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
    case Role::kObserver:
      return "observer";
    case Role::kUnknown:
      break;
  }
  return "process";
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options) : options_(std::move(options)) {
  server_addresses_.assign(static_cast<size_t>(std::max(options_.servers, 0)), std::string());
  server_holders_.assign(server_addresses_.size(), Holder{});
}

std::vector<int32_t> Coordinator::dead_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {dead_.begin(), dead_.end()};
}

std::vector<std::string> Coordinator::server_addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_addresses_;
}

uint64_t Coordinator::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

bool Coordinator::RegisterPending(int32_t worker) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const PendingRegister& p) { return p.request.sender == worker; });
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
    PeerInfo info;
    Frames frames;
    Status s = ep->Receive(&peer, &frames, options_.poll_interval, &info);
    if (s.ok()) {
      Handle(ep, peer, info, frames);
    } else if (s.code() != StatusCode::kTimeout) {
      return s;
    }
    CheckLiveness();
    refusal_log_.Flush();
    if (shutdown_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      const bool everyone_told = told_shutdown_.size() >= peers_.size();
      if (everyone_told || Clock::now() - shutdown_at_ > options_.shutdown_grace) break;
    }
  }
  refusal_log_.FlushFinal();
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

void Coordinator::Refuse(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                         const Status& why) {
  ++refused_;
  // A stranger can provoke refusals at will: the log and the metrics get a bounded number of
  // lines; the count is exact.
  const std::string line =
      fmt::format("coordinator: refused {} from {}: {}", MsgTypeName(h.type), DescribePeer(info), why.message());
  if (refusal_log_.Log(line)) Emit("refused", h.sender, fmt::format("{} (refusal {})", line, refused_));
  Reply(ep, peer, ErrorReply(h, why));
}

void Coordinator::CheckLiveness() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& [w, holder] : worker_holders_) {
    if (silent_.count(w) || now - holder.seen <= options_.heartbeat_timeout) continue;
    if (RegisterPending(w)) continue;  // it cannot heartbeat before its register reply
    silent_.insert(w);
    if (!dead_.insert(w).second) continue;  // finished earlier: already listed as gone
    spdlog::warn("coordinator: worker {} silent for more than {} ms: declared dead", w,
                 options_.heartbeat_timeout.count());
    const auto clock = worker_clock_.find(w);
    Emit("worker_dead", w,
         fmt::format("last clock {}, silent > {} ms", clock == worker_clock_.end() ? 0 : clock->second,
                     options_.heartbeat_timeout.count()));
  }
  MaybeEndRun();
}

void Coordinator::MaybeEndRun() {
  if (shutdown_.load() || options_.workers < 1) return;
  for (int32_t w = 0; w < options_.workers; ++w) {
    if (!done_.count(w) && !silent_.count(w)) return;
  }
  spdlog::info("coordinator: every worker is done or dead ({} done of {}): ending the run", done_.size(),
               options_.workers);
  BeginShutdown(-1, "every worker done or dead");
}

void Coordinator::BeginShutdown(int32_t by, const std::string& who) {
  if (shutdown_.exchange(true)) return;
  shutdown_at_ = Clock::now();
  Emit("shutdown", by, who);
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

Status Coordinator::CheckRebind(const char* what, int32_t id, const Holder& holder, const PeerId& peer) const {
  if (!holder.bound || holder.peer == peer) return Status::Ok();
  const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - holder.seen);
  if (silent > options_.heartbeat_timeout) return Status::Ok();  // its holder is gone: take over
  return FailedPrecondition(
      "register refused: {} id {} is held by another connection, heard from {} ms ago (it can be "
      "taken over after {} ms of silence)",
      what, id, silent.count(), options_.heartbeat_timeout.count());
}

Status Coordinator::HandleRegister(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  const Privilege needed = h.role == Role::kServer   ? Privilege::kRegisterServer
                           : h.role == Role::kWorker ? Privilege::kRegisterWorker
                                                     : Privilege::kObserve;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, needed));
  if (h.layout_hash != options_.layout_hash) {
    return FailedPrecondition(
        "register refused: layout hash mismatch: {} {} has {:#018x}, coordinator has "
        "{:#018x} (different model, server count or chunk size)",
        h.role == Role::kServer ? "server" : "worker", h.sender, h.layout_hash, options_.layout_hash);
  }
  switch (h.role) {
    case Role::kServer:
      return RegisterServer(ep, peer, info, h);
    case Role::kWorker:
      return RegisterWorker(ep, peer, info, h);
    case Role::kObserver:
      ReplyRegister(ep, peer, h, -1);
      return Status::Ok();
    case Role::kUnknown:
      break;
  }
  return InvalidArgument("register refused: unknown role {}", static_cast<int>(h.role));
}

Status Coordinator::RegisterServer(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  if (h.sender < 0 || h.sender >= options_.servers) {
    return InvalidArgument("register refused: server id {} outside 0..{}", h.sender, options_.servers - 1);
  }
  if (h.text.empty()) return InvalidArgument("register refused: server {} sent no address", h.sender);
  Holder& holder = server_holders_[static_cast<size_t>(h.sender)];
  DP_RETURN_IF_ERROR(CheckRebind("server", h.sender, holder, peer));
  holder = Holder{true, peer, Clock::now()};
  server_addresses_[static_cast<size_t>(h.sender)] = h.text;  // a restarted server re-registers
  peers_.insert(peer);
  spdlog::info("coordinator: server {} at {} registered from {}", h.sender, h.text, DescribePeer(info));
  Emit("server_registered", h.sender, h.text);
  ReplyRegister(ep, peer, h, h.sender);
  if (AllServersRegistered()) {
    for (const auto& p : pending_) {
      ReplyRegister(ep, p.peer, p.request, p.request.sender);
      worker_holders_[p.request.sender].seen = Clock::now();  // its heartbeats start now
    }
    pending_.clear();
  }
  return Status::Ok();
}

Status Coordinator::RegisterWorker(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  int32_t id = h.sender;
  if (id < 0) {
    while (worker_holders_.count(next_worker_)) ++next_worker_;
    id = next_worker_++;
  }
  if (id >= options_.workers) {
    return InvalidArgument("register refused: worker id {} outside 0..{} (cluster.workers = {})", id,
                           options_.workers - 1, options_.workers);
  }
  Holder& holder = worker_holders_[id];
  DP_RETURN_IF_ERROR(CheckRebind("worker", id, holder, peer));
  holder = Holder{true, peer, Clock::now()};
  dead_.erase(id);  // a worker that comes back is alive again
  silent_.erase(id);
  finished_.erase(id);
  done_.erase(id);
  peers_.insert(peer);
  spdlog::info("coordinator: worker {} registered from {}", id, DescribePeer(info));
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

Status Coordinator::NoteHeartbeat(const PeerId& peer, const MessageHeader& h) {
  if (h.sender < 0 || (h.role != Role::kWorker && h.role != Role::kServer)) return Status::Ok();  // read-only
  Holder* holder = nullptr;
  if (h.role == Role::kServer) {
    if (h.sender < options_.servers) holder = &server_holders_[static_cast<size_t>(h.sender)];
  } else {
    auto it = worker_holders_.find(h.sender);
    if (it != worker_holders_.end()) holder = &it->second;
  }
  if (holder == nullptr || !holder->bound || holder->peer != peer) {
    return FailedPrecondition("{} for {} {}: that id is not registered on this connection", MsgTypeName(h.type),
                              RoleName(h.role), h.sender);
  }
  holder->seen = Clock::now();
  if (h.role == Role::kServer) return Status::Ok();
  const int32_t w = h.sender;
  worker_clock_[w] = std::max(worker_clock_[w], h.clock);
  // A finished worker is gone at once (not after the heartbeat timeout): listed with the dead,
  // so servers stop waiting for it and the evaluating worker knows it is done.
  if ((h.flags & kFlagFinished) != 0 && finished_.insert(w).second) {
    dead_.insert(w);
    spdlog::info("coordinator: worker {} finished at clock {}", w, h.clock);
    Emit("worker_finished", w, fmt::format("clock {}", h.clock));
  }
  if ((h.flags & kFlagDone) != 0 && done_.insert(w).second) {
    spdlog::info("coordinator: worker {} done", w);
    Emit("worker_done", w, fmt::format("clock {}", h.clock));
    MaybeEndRun();
  }
  return Status::Ok();
}

void Coordinator::Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const Frames& frames) {
  std::lock_guard<std::mutex> lock(mu_);
  MessageHeader h;
  Status s = ParseHeader(frames, &h);
  if (!s.ok()) {
    Refuse(ep, peer, info, MessageHeader{}, s);
    return;
  }
  MessageHeader r;
  r.request_id = h.request_id;
  r.model_id = options_.model_id;
  switch (h.type) {
    case MsgType::kRegister:
      s = HandleRegister(ep, peer, info, h);
      if (s.ok()) return;
      break;
    case MsgType::kHeartbeat:
    case MsgType::kClock:
      s = NoteHeartbeat(peer, h);
      if (!s.ok()) break;
      r.type = h.type == MsgType::kClock ? MsgType::kAck : MsgType::kHeartbeat;
      r.dead_workers.assign(dead_.begin(), dead_.end());
      r.finished_workers.assign(finished_.begin(), finished_.end());
      r.shutdown = shutdown_.load();
      // Only registered processes count towards "everyone heard it" (a stranger's heartbeat
      // must not end the wait early).
      if (r.shutdown && peers_.count(peer)) told_shutdown_.insert(peer);
      Reply(ep, peer, r);
      return;
    case MsgType::kShutdown:
      s = Authorize(options_.access, info, h, Privilege::kAdmin);
      if (!s.ok()) break;
      if (!shutdown_.load()) {
        // The peer's authenticated identity first; role and id are only what the message says.
        spdlog::info("coordinator: shutdown requested from {} (the message says {} {})", DescribePeer(info),
                     RoleName(h.role), h.sender);
        BeginShutdown(h.sender, RoleName(h.role));
      }
      if (peers_.count(peer)) told_shutdown_.insert(peer);
      r.type = MsgType::kAck;
      Reply(ep, peer, r);
      return;
    default:
      s = InvalidArgument("coordinator does not serve message type {}", MsgTypeName(h.type));
      break;
  }
  Refuse(ep, peer, info, h, s);
}

}  // namespace downpour
