// coordinator.cc — see coordinator.h.
#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/random_id.h"
#include "common/rendezvous.h"

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
    case Role::kEvaluator:
      return "evaluator";
    case Role::kUnknown:
      break;
  }
  return "process";
}

// Whether the register message's sender proved its role cryptographically (keys) or with the
// run's secret (no keys); Authorize has already checked it. A run with neither proves nothing.
bool Authenticated(const AccessPolicy& access, const PeerInfo& info) {
  return access.keyed ? !info.user_id.empty() : !access.run_secret.empty();
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      max_workers_(std::max({options_.cluster.max_workers, options_.cluster.workers, 0})),
      incarnation_(RandomId()),
      started_(Clock::now()) {
  server_addresses_.assign(static_cast<size_t>(std::max(options_.cluster.servers, 0)), std::string());
  server_holders_.assign(server_addresses_.size(), Holder{});
  workers_.assign(static_cast<size_t>(max_workers_), WorkerSlot{});
}

std::vector<int32_t> Coordinator::dead_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {gone_listed_.begin(), gone_listed_.end()};
}

std::vector<std::string> Coordinator::server_addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_addresses_;
}

uint64_t Coordinator::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

uint64_t Coordinator::gone_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_seq_;
}

Coordinator::TableSizes Coordinator::table_sizes() const {
  std::lock_guard<std::mutex> lock(mu_);
  TableSizes t;
  t.worker_slots = workers_.size();
  t.registered = static_cast<size_t>(std::count_if(workers_.begin(), workers_.end(), [](const WorkerSlot& w) { return w.used; }));
  t.live = live_.size();
  t.gone_listed = gone_listed_.size();
  t.change_log = changes_.size();
  t.pending = pending_.size();
  return t;
}

bool Coordinator::AllServersRegistered() const {
  for (const auto& a : server_addresses_) {
    if (a.empty()) return false;
  }
  return true;
}

// Every bound holder (server or worker) has heard the shutdown. Runs once per poll while
// shutting down only.
bool Coordinator::EveryoneTold() const {
  for (const Holder& h : server_holders_) {
    if (h.bound && !told_shutdown_.count(h.peer)) return false;
  }
  for (int32_t w : live_) {
    const Holder& h = workers_[static_cast<size_t>(w)].holder;
    if (h.bound && !told_shutdown_.count(h.peer)) return false;
  }
  const Holder& e = evaluator_.holder;
  if (e.bound && !evaluator_.silent && !evaluator_.done && !told_shutdown_.count(e.peer)) return false;
  return true;
}

Status Coordinator::Serve(ServerEndpoint* ep) {
  // The loop turns at least every poll_interval. A longer gap is time this process did not run
  // (stopped, swapped out, starved of CPU): its own silence, which must not be counted as its
  // peers' (their heartbeats of that time are still queued).
  const auto stall_limit = std::max<std::chrono::milliseconds>(heartbeat_interval(), 10 * options_.poll_interval);
  auto last_turn = Clock::now();
  while (!stop_.load()) {
    PeerId peer;
    PeerInfo info;
    Frames frames;
    Status s = ep->Receive(&peer, &frames, options_.poll_interval, &info);
    if (const auto gap = Clock::now() - last_turn; gap > stall_limit) ForgiveStall(gap - options_.poll_interval);
    if (s.ok()) {
      Handle(ep, peer, info, frames);
    } else if (s.code() != StatusCode::kTimeout) {
      return s;
    }
    // Liveness (the one walk over the live workers) once per poll interval, not per message.
    if (Clock::now() >= next_liveness_check_) {
      CheckLiveness();
      next_liveness_check_ = Clock::now() + options_.poll_interval;
    }
    refusal_log_.Flush();
    if (shutdown_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (EveryoneTold() || Clock::now() - shutdown_at_ > options_.shutdown_grace) break;
    }
    last_turn = Clock::now();
  }
  refusal_log_.FlushFinal();
  return Status::Ok();
}

void Coordinator::ForgiveLocked(Clock::duration span) {
  const auto now = Clock::now();
  auto forgive = [&](Holder& h) {
    if (h.bound) h.seen = std::min(now, h.seen + span);
  };
  for (Holder& h : server_holders_) forgive(h);
  for (WorkerSlot& slot : workers_) forgive(slot.holder);
  forgive(evaluator_.holder);
  started_ += span;
  if (workers_ended_) workers_ended_at_ += span;
}

bool Coordinator::CutOff(Clock::time_point now) {
  const auto quiet = std::max<std::chrono::milliseconds>(4 * heartbeat_interval(), heartbeat_timeout() / 2);
  bool any = false, heard = false;
  for (const Holder& h : server_holders_) {
    if (!h.bound) continue;
    any = true;
    heard |= now - h.seen <= quiet;
  }
  const bool cut = any && !heard;
  if (cut && cut_off_since_ == Clock::time_point{}) {
    cut_off_since_ = now;
    spdlog::warn("coordinator: no server heard for {} ms: this process is taken to be cut off, and nobody is declared "
                 "dead while it hears no server (for {} s at most)",
                 quiet.count(), options_.cut_off_limit.count() / 1000);
    Emit("cut_off", -1, "");
  } else if (!cut && cut_off_since_ != Clock::time_point{}) {
    spdlog::info("coordinator: servers heard again after {:.1f} s cut off",
                 std::chrono::duration<double>(now - cut_off_since_).count());
    cut_off_since_ = {};
  }
  return cut && now - cut_off_since_ < options_.cut_off_limit;
}

void Coordinator::ForgiveStall(Clock::duration stalled) {
  std::lock_guard<std::mutex> lock(mu_);
  ForgiveLocked(stalled);
  const double seconds = std::chrono::duration<double>(stalled).count();
  spdlog::warn("coordinator: this process did not run for {:.1f} s (stopped, swapped out or starved of CPU); that "
               "time is not counted as anyone's silence",
               seconds);
  Emit("stalled", -1, fmt::format("{:.1f} s", seconds));
}

void Coordinator::Reply(ServerEndpoint* ep, const PeerId& peer, MessageHeader h) {
  h.incarnation = incarnation_;
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

void Coordinator::MarkGone(int32_t w, bool finished) {
  WorkerSlot& slot = workers_[static_cast<size_t>(w)];
  slot.gone = true;
  slot.gone_at = Clock::now();
  gone_listed_.insert(w);
  changes_.push_back(Change{++gone_seq_, w, finished});
  if (changes_.size() > kChangeLog) {
    log_lost_through_ = changes_.front().seq;
    changes_.pop_front();
  }
  if (w >= options_.cluster.workers) expiry_.emplace_back(slot.gone_at, w);
}

// The sender's rank among the live workers (registered, heard from, not gone), ids ascending,
// and their number: the data slice it reads from its next epoch on, so that when a worker joins
// or leaves the slices are dealt again over the living (rank -1 for a sender that is no longer
// live, which still hears how many are). O(live workers) per heartbeat.
void Coordinator::FillSlice(int32_t worker, MessageHeader* r) const {
  int32_t rank = -1, count = 0;
  for (int32_t w : live_) {
    if (workers_[static_cast<size_t>(w)].gone) continue;
    if (w == worker) rank = count;
    ++count;
  }
  r->slice_index = rank;
  r->worker_count = count;  // also to a worker that is no longer live: how many still are
}

void Coordinator::CheckLiveness() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  const auto since_last = last_liveness_check_ == Clock::time_point{} ? Clock::duration{} : now - last_liveness_check_;
  last_liveness_check_ = now;
  // Cut off from every server: the others' silence is this process's own, as in a stall. Not once
  // the run is ending: the servers leave then.
  if (!shutdown_.load() && CutOff(now)) ForgiveLocked(since_last);
  for (auto it = live_.begin(); it != live_.end();) {
    const int32_t w = *it;
    WorkerSlot& slot = workers_[static_cast<size_t>(w)];
    // A pending worker cannot heartbeat before its register reply.
    if (slot.pending || now - slot.holder.seen <= heartbeat_timeout()) {
      ++it;
      continue;
    }
    it = live_.erase(it);
    slot.silent = true;
    if (slot.gone) continue;  // finished earlier: already listed as gone
    MarkGone(w, /*finished=*/false);
    spdlog::warn("coordinator: worker {} silent for more than {} ms: declared dead", w,
                 options_.cluster.heartbeat_timeout_ms);
    Emit("worker_dead", w,
         fmt::format("last clock {}, silent > {} ms", slot.clock, options_.cluster.heartbeat_timeout_ms));
  }
  // A restarted coordinator: a worker of 0..W-1 that has not re-registered within the timeout
  // died (or ended) while there was no coordinator. Checked once, right after the timeout.
  if (options_.rejoin && now - started_ > heartbeat_timeout() && !rejoin_checked_) {
    rejoin_checked_ = true;
    for (int32_t w = 0; w < options_.cluster.workers; ++w) {
      WorkerSlot& slot = workers_[static_cast<size_t>(w)];
      if (slot.used) continue;
      slot.silent = true;
      MarkGone(w, /*finished=*/false);
      spdlog::warn("coordinator: worker {} not heard from within {} ms of this coordinator's start: counted as dead", w,
                   options_.cluster.heartbeat_timeout_ms);
      Emit("worker_dead", w,
           fmt::format("not heard from within {} ms of a restart", options_.cluster.heartbeat_timeout_ms));
    }
  }
  if (evaluator_.holder.bound && !evaluator_.pending && !evaluator_.silent && !evaluator_.done &&
      now - evaluator_.holder.seen > heartbeat_timeout()) {
    evaluator_.silent = true;
    spdlog::warn("coordinator: the evaluator silent for more than {} ms: declared dead",
                 options_.cluster.heartbeat_timeout_ms);
    Emit("evaluator_dead", 0, fmt::format("silent > {} ms", options_.cluster.heartbeat_timeout_ms));
  }
  // Gone joiners leave the gone list after gone_retention (their ids stay used).
  while (!expiry_.empty() && now - expiry_.front().first > options_.gone_retention) {
    const auto [at, w] = expiry_.front();
    expiry_.pop_front();
    WorkerSlot& slot = workers_[static_cast<size_t>(w)];
    if (!slot.gone || slot.gone_at != at) continue;  // came back since
    gone_listed_.erase(w);
    slot.holder = Holder{};
  }
  MaybeEndRun();
}

void Coordinator::MaybeEndRun() {
  if (shutdown_.load() || options_.cluster.workers < 1) return;
  // Every id of 0..W-1 and every joiner that registered: done or silent.
  size_t done = 0;
  for (int32_t w = 0; w < max_workers_; ++w) {
    const WorkerSlot& slot = workers_[static_cast<size_t>(w)];
    if (w >= options_.cluster.workers && !slot.used) continue;
    if (!slot.done && !slot.silent) return;
    if (slot.done) ++done;
  }
  if (!options_.evaluator) {
    spdlog::info("coordinator: every worker is done or dead ({} done): ending the run", done);
    BeginShutdown(-1, "every worker done or dead");
    return;
  }
  // The evaluator makes the final evaluation after the workers: wait for it, unless it died, or
  // never registered and has not within the timeout since.
  const auto now = Clock::now();
  if (!workers_ended_) {
    workers_ended_ = true;
    workers_ended_at_ = now;
    if (!evaluator_.done) {
      spdlog::info("coordinator: every worker is done or dead ({} done): waiting for the evaluator's final evaluation",
                   done);
    }
  }
  std::string how;
  if (evaluator_.done) {
    how = "the evaluator done";
  } else if (evaluator_.silent) {
    how = "the evaluator dead";
  } else if (!evaluator_.holder.bound && now - workers_ended_at_ > heartbeat_timeout()) {
    how = "no evaluator registered";
  } else {
    return;
  }
  spdlog::info("coordinator: every worker is done or dead ({} done), {}: ending the run", done, how);
  BeginShutdown(-1, "every worker done or dead, " + how);
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
  r.server_count = options_.cluster.servers;
  r.worker_count = options_.cluster.workers;
  Reply(ep, peer, r);
}

std::chrono::milliseconds Coordinator::TakeoverSilence(const PeerInfo& info) const {
  return Authenticated(options_.access, info) ? std::min(2 * heartbeat_interval(), heartbeat_timeout())
                                              : heartbeat_timeout();
}

Coordinator::Replaced* Coordinator::FindReplaced(int32_t server, uint64_t session) {
  if (session == 0) return nullptr;
  const auto it = std::find_if(replaced_servers_.begin(), replaced_servers_.end(),
                               [&](const Replaced& r) { return r.server == server && r.session == session; });
  return it == replaced_servers_.end() ? nullptr : &*it;
}

Status Coordinator::CheckRebind(const char* what, int32_t id, const Holder& holder, const PeerId& peer,
                                std::chrono::milliseconds silence) const {
  if (!holder.bound || holder.peer == peer) return Status::Ok();
  const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - holder.seen);
  if (silent > silence) return Status::Ok();  // its holder is gone: take over
  return FailedPrecondition(
      "register refused: {} id {} is held by another connection, heard from {} ms ago (it can be "
      "taken over after {} ms of silence)",
      what, id, silent.count(), silence.count());
}

Status Coordinator::HandleRegister(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  const Privilege needed = h.role == Role::kServer      ? Privilege::kRegisterServer
                           : h.role == Role::kWorker    ? Privilege::kRegisterWorker
                           : h.role == Role::kEvaluator ? Privilege::kEvaluate
                                                        : Privilege::kObserve;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, needed));
  if (h.layout_hash != options_.layout_hash) {
    return FailedPrecondition(
        "register refused: layout hash mismatch: {} {} has {:#018x}, coordinator has "
        "{:#018x} (different model, server count or chunk size)",
        RoleName(h.role), h.sender, h.layout_hash, options_.layout_hash);
  }
  switch (h.role) {
    case Role::kServer:
      return RegisterServer(ep, peer, info, h);
    case Role::kWorker:
      return RegisterWorker(ep, peer, info, h);
    case Role::kObserver:
      ReplyRegister(ep, peer, h, -1);
      return Status::Ok();
    case Role::kEvaluator:
      return RegisterEvaluator(ep, peer, info, h);
    case Role::kUnknown:
      break;
  }
  return InvalidArgument("register refused: unknown role {}", static_cast<int>(h.role));
}

Status Coordinator::RegisterServer(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  if (h.sender < 0 || h.sender >= options_.cluster.servers) {
    return InvalidArgument("register refused: server id {} outside 0..{}", h.sender, options_.cluster.servers - 1);
  }
  if (h.text.empty()) return InvalidArgument("register refused: server {} sent no address", h.sender);
  Holder& holder = server_holders_[static_cast<size_t>(h.sender)];
  if (FindReplaced(h.sender, h.session) != nullptr) {
    return FailedPrecondition("register refused: another process took server {}'s id while this one was silent: "
                              "this process is out of the run",
                              h.sender);
  }
  // The same process on a new connection (its old one dropped with a cut link) takes its id back
  // at once. A restarted server, proven a server, takes its id over as soon as the old holder has
  // missed two heartbeats; anyone else waits for the full timeout of silence.
  const bool same_process = holder.bound && h.session != 0 && h.session == holder.session;
  if (!same_process) DP_RETURN_IF_ERROR(CheckRebind("server", h.sender, holder, peer, TakeoverSilence(info)));
  if (holder.bound && !same_process && holder.peer != peer && holder.session != 0) {
    // Another process takes the id over: the old one, if it comes back, is told it is out.
    replaced_servers_.push_back(Replaced{h.sender, holder.session});
    if (replaced_servers_.size() > kReplacedKept) replaced_servers_.pop_front();
    spdlog::warn("coordinator: server {} is taken over by another process (its previous one, silent for {} ms, is "
                 "out of the run and told so if it is heard from again)",
                 h.sender, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - holder.seen).count());
  }
  holder = Holder{true, peer, Clock::now(), h.session};
  server_addresses_[static_cast<size_t>(h.sender)] = h.text;  // a restarted server re-registers
  spdlog::info("coordinator: server {} at {} registered from {}", h.sender, h.text, DescribePeer(info));
  Emit("server_registered", h.sender, h.text);
  ReplyRegister(ep, peer, h, h.sender);
  if (AllServersRegistered()) {
    for (const auto& p : pending_) {
      ReplyRegister(ep, p.peer, p.request, p.request.sender);
      WorkerSlot& slot = workers_[static_cast<size_t>(p.request.sender)];
      slot.pending = false;
      slot.holder.seen = Clock::now();  // its heartbeats start now
    }
    pending_.clear();
    for (const auto& p : pending_evaluator_) ReplyRegister(ep, p.peer, p.request, 0);
    if (!pending_evaluator_.empty()) {
      evaluator_.pending = false;
      evaluator_.holder.seen = Clock::now();  // its heartbeats start now
    }
    pending_evaluator_.clear();
  }
  return Status::Ok();
}

Status Coordinator::RegisterEvaluator(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                      const MessageHeader& h) {
  if (!options_.evaluator) {
    return FailedPrecondition("register refused: this run has no evaluator process (eval.evaluator = false)");
  }
  if (h.sender != 0 && h.sender != -1) {
    return InvalidArgument("register refused: evaluator id {}: a run has one evaluator, id 0", h.sender);
  }
  // A restarted evaluator that proves its role takes the id over after two missed heartbeats.
  DP_RETURN_IF_ERROR(CheckRebind("evaluator", 0, evaluator_.holder, peer, TakeoverSilence(info)));
  evaluator_.holder = Holder{true, peer, Clock::now()};
  evaluator_.silent = false;
  spdlog::info("coordinator: the evaluator registered from {}", DescribePeer(info));
  Emit("evaluator_registered", 0, "");
  MessageHeader assigned = h;
  assigned.sender = 0;
  if (AllServersRegistered()) {
    evaluator_.pending = false;
    ReplyRegister(ep, peer, assigned, 0);
  } else {
    pending_evaluator_.assign(1, PendingRegister{peer, assigned});
    evaluator_.pending = true;
  }
  return Status::Ok();
}

Status Coordinator::RegisterWorker(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info,
                                   const MessageHeader& h) {
  int32_t id = h.sender;
  if (id < 0) {
    // The next of 0..W-1 never registered, then the lowest id >= W never used (a joiner).
    while (next_worker_ < max_workers_ && workers_[static_cast<size_t>(next_worker_)].used) ++next_worker_;
    id = next_worker_;
    if (id >= max_workers_) {
      return FailedPrecondition("register refused: every worker id 0..{} is taken (cluster.max_workers = {})",
                               max_workers_ - 1, max_workers_);
    }
  }
  if (id >= max_workers_) {
    return InvalidArgument("register refused: worker id {} outside 0..{} (cluster.workers = {}, max_workers = {})", id,
                           max_workers_ - 1, options_.cluster.workers, max_workers_);
  }
  if (shutdown_.load()) {
    return FailedPrecondition("register refused: the run is over (the coordinator has ended it)");
  }
  WorkerSlot& slot = workers_[static_cast<size_t>(id)];
  // A worker declared dead is out of the run: a new process (a restart with --resume) takes its id
  // at once, whatever the old process still sends (it is told it is out).
  if (!slot.silent) DP_RETURN_IF_ERROR(CheckRebind("worker", id, slot.holder, peer, heartbeat_timeout()));
  if (slot.gone) {  // a worker that comes back is alive again; senders' gone lists are redone
    gone_listed_.erase(id);
    revived_seq_ = ++gone_seq_;
  }
  const bool was_used = slot.used;
  const int64_t clock = slot.clock;
  slot = WorkerSlot{};
  slot.used = true;
  slot.clock = clock;
  slot.holder = Holder{true, peer, Clock::now()};
  live_.insert(id);
  spdlog::info("coordinator: worker {} registered from {}{}", id, DescribePeer(info),
               id >= options_.cluster.workers && !was_used ? " (joins the running job)" : "");
  Emit("worker_registered", id, id >= options_.cluster.workers ? "joiner" : "");
  MessageHeader assigned = h;
  assigned.sender = id;
  if (AllServersRegistered()) {
    ReplyRegister(ep, peer, assigned, id);
  } else {
    // One waiting reply per id: a re-registration replaces the earlier one.
    auto it = std::find_if(pending_.begin(), pending_.end(),
                           [&](const PendingRegister& p) { return p.request.sender == id; });
    if (it != pending_.end()) {
      *it = PendingRegister{peer, assigned};
    } else {
      pending_.push_back({peer, assigned});
    }
    slot.pending = true;
  }
  return Status::Ok();
}

Status Coordinator::NoteHeartbeat(const PeerId& peer, const MessageHeader& h, bool* removed) {
  if (h.role == Role::kEvaluator) {
    if (h.sender != 0 || !evaluator_.holder.bound || evaluator_.holder.peer != peer) {
      return FailedPrecondition("{} for the evaluator: it is not registered on this connection", MsgTypeName(h.type));
    }
    evaluator_.holder.seen = Clock::now();
    evaluator_.silent = false;
    if ((h.flags & kFlagDone) != 0 && !evaluator_.done) {
      evaluator_.done = true;
      spdlog::info("coordinator: the evaluator is done");
      Emit("evaluator_done", 0, "");
      MaybeEndRun();
    }
    return Status::Ok();
  }
  if (h.sender < 0 || (h.role != Role::kWorker && h.role != Role::kServer)) return Status::Ok();  // read-only
  Holder* holder = nullptr;
  if (h.role == Role::kServer) {
    if (h.sender < options_.cluster.servers) holder = &server_holders_[static_cast<size_t>(h.sender)];
  } else if (h.sender < max_workers_) {
    holder = &workers_[static_cast<size_t>(h.sender)].holder;
  }
  Replaced* replaced = h.role == Role::kServer && holder != nullptr ? FindReplaced(h.sender, h.session) : nullptr;
  if (replaced != nullptr) {
    // Fencing: a server process whose id another process took while it was stopped or cut off.
    // It must take and answer nothing more; it stops on this reply (common/rendezvous.h).
    *removed = true;
    if (!replaced->told) {
      replaced->told = true;
      spdlog::warn("coordinator: server {}'s previous process is heard from again after another took its id: "
                   "told it is out of the run",
                   h.sender);
      Emit("server_removed", h.sender, "heard from after another process took its id");
    }
    return Status::Ok();
  }
  if (holder == nullptr || !holder->bound || holder->peer != peer) {
    return FailedPrecondition("{} for {} {}: that id is not registered on this connection", MsgTypeName(h.type),
                              RoleName(h.role), h.sender);
  }
  const int32_t w = h.sender;
  if (h.role == Role::kServer || !workers_[static_cast<size_t>(w)].silent) holder->seen = Clock::now();
  if (h.role == Role::kServer) return Status::Ok();
  WorkerSlot& slot = workers_[static_cast<size_t>(w)];
  if (slot.silent && !slot.finished) {
    // (Its heartbeats do not count as the holder heard from: a restart takes the id at once.)
    // Declared dead while it was stopped or cut off, and the servers have fenced it: it is out,
    // and told so (a restart registers a new process, which takes the id back).
    *removed = true;
    if (!slot.told_removed) {
      slot.told_removed = true;
      spdlog::warn("coordinator: worker {}, declared dead, is heard from again: told it is out of the run", w);
      Emit("worker_removed", w, "heard from after it was declared dead");
    }
    return Status::Ok();
  }
  slot.clock = std::max(slot.clock, h.clock);
  // A finished worker is gone at once (not after the heartbeat timeout): listed with the dead,
  // so servers stop waiting for it and the evaluating worker knows it is done.
  if ((h.flags & kFlagFinished) != 0 && !slot.finished) {
    slot.finished = true;
    if (!slot.gone) MarkGone(w, /*finished=*/true);
    spdlog::info("coordinator: worker {} finished at clock {}", w, h.clock);
    Emit("worker_finished", w, fmt::format("clock {}", h.clock));
  }
  if ((h.flags & kFlagDone) != 0 && !slot.done) {
    slot.done = true;
    spdlog::info("coordinator: worker {} done", w);
    Emit("worker_done", w, fmt::format("clock {}", h.clock));
    MaybeEndRun();
  }
  return Status::Ok();
}

void Coordinator::FillChanges(const MessageHeader& h, MessageHeader* r) const {
  r->gone_seq = gone_seq_;
  const uint64_t seen = h.gone_seq;
  const bool full = h.incarnation != incarnation_ || seen == 0 || seen > gone_seq_ || seen < revived_seq_ ||
                    seen < log_lost_through_;
  if (full) {
    r->flags |= kFlagGoneListFull;
    r->dead_workers.assign(gone_listed_.begin(), gone_listed_.end());
    for (int32_t w : gone_listed_) {
      if (workers_[static_cast<size_t>(w)].finished) r->finished_workers.push_back(w);
    }
    return;
  }
  // Only the changes after `seen`: walk back from the newest.
  auto it = changes_.end();
  while (it != changes_.begin() && std::prev(it)->seq > seen) --it;
  for (; it != changes_.end(); ++it) {
    r->dead_workers.push_back(it->worker);
    if (it->finished) r->finished_workers.push_back(it->worker);
  }
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
    case MsgType::kClock: {
      bool removed = false;
      s = NoteHeartbeat(peer, h, &removed);
      if (!s.ok()) break;
      r.type = h.type == MsgType::kClock ? MsgType::kAck : MsgType::kHeartbeat;
      if (removed) r.flags |= kFlagRemoved;
      FillChanges(h, &r);
      if (h.role == Role::kWorker || h.role == Role::kEvaluator) {
        r.server_addresses = server_addresses_;  // a moved server's new one
        FillSlice(h.role == Role::kWorker ? h.sender : -1, &r);  // the evaluator: how many are live
      }
      r.shutdown = shutdown_.load();
      if (r.shutdown) told_shutdown_.insert(peer);
      Reply(ep, peer, r);
      return;
    }
    case MsgType::kShutdown:
      s = Authorize(options_.access, info, h, Privilege::kAdmin);
      if (!s.ok()) break;
      if (!shutdown_.load()) {
        // The peer's authenticated identity first; role and id are only what the message says.
        spdlog::info("coordinator: shutdown requested from {} (the message says {} {})", DescribePeer(info),
                     RoleName(h.role), h.sender);
        BeginShutdown(h.sender, RoleName(h.role));
      }
      told_shutdown_.insert(peer);
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
