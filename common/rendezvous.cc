// rendezvous.cc — see rendezvous.h.
#include "common/rendezvous.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "common/random_id.h"

namespace downpour {

std::string RendezvousClient::ToAddress(const std::string& host_port) {
  if (host_port.find("://") != std::string::npos) return host_port;
  return "tcp://" + host_port;
}

Status RendezvousClient::Exchange(const MessageHeader& request, MessageHeader* reply, std::chrono::milliseconds timeout,
                                  bool say_waiting) {
  std::lock_guard<std::mutex> lock(endpoint_mu_);
  MessageHeader h = request;
  h.request_id = next_request_++;
  Frames frames(1);
  DP_RETURN_IF_ERROR(HeaderFrame(h, &frames[0]));
  DP_RETURN_IF_ERROR(endpoint_->Send(std::move(frames)));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  // ZeroMQ delivers the request once the coordinator is up; until then, say every few seconds
  // what this process is waiting for, so a missing coordinator is not a silent stall.
  constexpr std::chrono::seconds kSayEvery{5};
  auto next_say = start + kSayEvery;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (left.count() <= 0) {
      return Timeout(
          "coordinator {}: no reply to {} within {} ms (is the coordinator running, and is "
          "cluster.coordinator its address?)",
          options_.coordinator, MsgTypeName(h.type), timeout.count());
    }
    if (say_waiting && now >= next_say) {
      spdlog::info("waiting for the coordinator at {} ({:.0f} s so far; giving up after {:.0f} s)",
                   options_.coordinator, std::chrono::duration<double>(now - start).count(),
                   std::chrono::duration<double>(timeout).count());
      next_say += kSayEvery;
    }
    if (say_waiting && options_.stop_requested && options_.stop_requested()) {
      return Unavailable("stopped while waiting for the coordinator at {}", options_.coordinator);
    }
    Frames got;
    // Waiting to register: short slices, to say what it waits for and to notice a stop.
    const auto slice = std::min(left, std::chrono::milliseconds(options_.stop_requested ? 100 : 5000));
    Status s = endpoint_->Receive(&got, say_waiting ? slice : left);
    if (s.code() == StatusCode::kTimeout) continue;
    DP_RETURN_IF_ERROR(s);
    DP_RETURN_IF_ERROR(ParseHeader(got, reply));
    if (reply->request_id != h.request_id) continue;  // late reply to an earlier request
    return StatusFromReply(*reply);
  }
}

MessageHeader RendezvousClient::RegisterRequest() const {
  MessageHeader h;
  h.type = MsgType::kRegister;
  h.role = options_.role;
  h.sender = id_ >= 0 ? id_ : options_.requested_id;
  h.layout_hash = options_.layout_hash;
  h.model_id = options_.model_id;
  h.text = options_.address;
  h.token = options_.token;
  h.session = session_;
  return h;
}

Status RendezvousClient::Register(Transport* transport, RendezvousOptions options, std::chrono::milliseconds timeout,
                                  std::unique_ptr<RendezvousClient>* out, RendezvousInfo* info) {
  std::unique_ptr<RendezvousClient> c(new RendezvousClient());
  c->options_ = std::move(options);
  c->session_ = RandomId();
  DP_RETURN_IF_ERROR(transport->Connect(ToAddress(c->options_.coordinator), &c->endpoint_));
  MessageHeader reply;
  // A process restarted in place (a server the launcher brought back) may ask for its id while
  // the coordinator still counts its previous connection as live: that holder is released after
  // a few silent heartbeat intervals (server/coordinator.h), so the refusal is waited out, up to
  // `timeout`, instead of ending the process.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status refused = Status::Ok();  // the last "held" refusal, once there was one
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const Status s = c->Exchange(c->RegisterRequest(), &reply, std::max(left, std::chrono::milliseconds(1)),
                                 /*say_waiting=*/true);
    if (s.ok()) break;
    // A retry that ran out of time (the sleep below overshot on a loaded machine) says why it
    // was retrying, not that the coordinator is missing: it answered every earlier try.
    if (s.code() == StatusCode::kTimeout && !refused.ok()) return refused;
    const bool held = s.code() == StatusCode::kFailedPrecondition &&
                      s.message().find("held by another connection") != std::string::npos;
    if (!held || std::chrono::steady_clock::now() + c->options_.heartbeat_interval >= deadline) return s;
    if (refused.ok()) {
      spdlog::info("coordinator {}: {}; waiting for it to be released", c->options_.coordinator, s.message());
    }
    refused = s;
    std::this_thread::sleep_for(c->options_.heartbeat_interval);
  }
  if (reply.type != MsgType::kRegisterReply) {
    return Corrupt("coordinator {}: register answered with {}", c->options_.coordinator, MsgTypeName(reply.type));
  }
  c->id_ = reply.assigned_id;
  c->incarnation_.store(reply.incarnation);
  c->servers_ = reply.server_addresses;
  info->id = reply.assigned_id;
  info->server_addresses = reply.server_addresses;
  info->workers = reply.worker_count;
  *out = std::move(c);
  return Status::Ok();
}

Status RendezvousClient::Reregister(std::chrono::milliseconds timeout) {
  MessageHeader reply;
  DP_RETURN_IF_ERROR(Exchange(RegisterRequest(), &reply, timeout));
  if (reply.type != MsgType::kRegisterReply || reply.assigned_id != id_) {
    return Corrupt("coordinator {}: registering again as {} answered with {} (id {})", options_.coordinator, id_,
                   MsgTypeName(reply.type), reply.assigned_id);
  }
  const uint64_t before = incarnation_.exchange(reply.incarnation);
  ++reregistrations_;
  spdlog::info("registered again with the coordinator at {} (id {}){}", options_.coordinator, id_,
               before != reply.incarnation ? fmt::format(": a new coordinator (incarnation {:#x}, was {:#x})",
                                                         reply.incarnation, before)
                                           : std::string());
  std::lock_guard<std::mutex> lock(gone_mu_);
  gone_seq_ = 0;  // the next heartbeat gets the new coordinator's whole gone list
  NoteAddressesLocked(reply.server_addresses);
  return Status::Ok();
}

RendezvousClient::~RendezvousClient() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void RendezvousClient::StartHeartbeats(std::function<void(int32_t, bool)> on_gone) {
  thread_ = std::thread([this, cb = std::move(on_gone)] { HeartbeatLoop(cb); });
}

bool RendezvousClient::data_slice(int* index, int* count) const {
  const int64_t v = slice_.load();
  if (v < 0) return false;
  *index = static_cast<int>(v >> 32);
  *count = static_cast<int>(v & 0xffffffff);
  return true;
}

void RendezvousClient::OnServerMoved(std::function<void(int32_t, const std::string&)> moved) {
  std::lock_guard<std::mutex> lock(gone_mu_);
  on_server_moved_ = std::move(moved);
}

void RendezvousClient::HeartbeatLoop(std::function<void(int32_t, bool)> on_gone) {
  using Clock = std::chrono::steady_clock;
  constexpr std::chrono::seconds kSayEvery{5};
  auto last_heard = Clock::now();
  auto next_say = last_heard + kSayEvery;
  while (!stop_.load()) {
    MessageHeader reply;
    Status s = SendHeartbeat(options_.heartbeat_interval * 4, &reply);
    const auto now = Clock::now();
    if (s.ok()) {
      last_heard = now;
      if (reply.shutdown) shutdown_.store(true);
      if ((reply.flags & kFlagRemoved) != 0 && !removed_.exchange(true)) {
        if (options_.role == Role::kServer) {
          spdlog::error("coordinator {}: another process took server {}'s id while this one was stopped or cut off, "
                        "and serves in its place; this process is out of the run and stops without writing anything",
                        options_.coordinator, id_);
        } else {
          spdlog::error("coordinator {}: it declared worker {} dead (silent past cluster.heartbeat_timeout_ms: this "
                        "process was stopped or cut off) and removed it from the run; stopping (a restart with "
                        "--resume joins again)",
                        options_.coordinator, id_);
        }
        std::lock_guard<std::mutex> lock(removed_mu_);
        if (on_removed_) on_removed_();
      }
    } else if (s.code() == StatusCode::kTimeout || s.code() == StatusCode::kUnavailable) {
      // No coordinator (dead, restarting): not fatal; keep heartbeating, say so now and then. Once
      // it has announced the end of the run it is expected to go: nothing to say.
      if (!shutdown_.load() && now - last_heard > 2 * options_.heartbeat_interval && now >= next_say) {
        spdlog::warn("coordinator {} unreachable for {:.0f} s; still heartbeating (a restarted coordinator is joined "
                     "again)",
                     options_.coordinator, std::chrono::duration<double>(now - last_heard).count());
        next_say = now + kSayEvery;
      }
    } else {
      last_heard = now;
      // Refused as not registered on this connection: a new coordinator that knows nobody, or
      // the id was taken over while this process was silent. Register again, same role and id.
      if (s.code() == StatusCode::kFailedPrecondition &&
          s.message().find("not registered on this connection") != std::string::npos) {
        const Status r = Reregister(options_.heartbeat_interval * 4);
        if (!r.ok() && now >= next_say) {
          spdlog::warn("coordinator {}: registering again failed (will retry): {}", options_.coordinator,
                       r.ToString());
          next_say = now + kSayEvery;
        }
      }
    }
    // Callbacks run here, on this thread, outside the locks.
    std::vector<std::pair<int32_t, bool>> gone;
    std::vector<std::pair<int32_t, std::string>> moves;
    std::function<void(int32_t, const std::string&)> moved;
    {
      std::lock_guard<std::mutex> lock(gone_mu_);
      gone.swap(undelivered_gone_);
      moves.swap(undelivered_moves_);
      moved = on_server_moved_;
    }
    if (on_gone) {
      for (const auto& [w, finished] : gone) on_gone(w, finished);
    }
    if (moved) {
      for (const auto& [server, address] : moves) moved(server, address);
    }
    // Sleep in small steps so destruction is prompt.
    const auto until = std::chrono::steady_clock::now() + options_.heartbeat_interval;
    while (!stop_.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void RendezvousClient::SetOnRemoved(std::function<void()> on_removed) {
  std::lock_guard<std::mutex> lock(removed_mu_);
  on_removed_ = std::move(on_removed);
}

Status RendezvousClient::RequestShutdown(std::chrono::milliseconds timeout) {
  MessageHeader h;
  h.type = MsgType::kShutdown;
  h.role = options_.role;
  h.sender = id_;
  h.layout_hash = options_.layout_hash;
  h.token = options_.token;
  MessageHeader reply;
  return Exchange(h, &reply, timeout);
}

Status RendezvousClient::SendHeartbeat(std::chrono::milliseconds timeout, MessageHeader* reply) {
  std::lock_guard<std::mutex> hb(heartbeat_mu_);
  MessageHeader h;
  h.type = MsgType::kHeartbeat;
  h.role = options_.role;
  h.sender = id_;
  h.clock = clock_.load();
  h.layout_hash = options_.layout_hash;
  h.incarnation = incarnation_.load();  // the coordinator this client knows
  h.session = session_;
  if (finished_.load()) h.flags |= kFlagFinished;
  if (done_.load()) h.flags |= kFlagDone;
  {
    std::lock_guard<std::mutex> lock(gone_mu_);
    h.gone_seq = gone_seq_;
  }
  DP_RETURN_IF_ERROR(Exchange(h, reply, timeout));
  std::lock_guard<std::mutex> lock(gone_mu_);
  ApplyReplyLocked(*reply);
  return Status::Ok();
}

void RendezvousClient::ApplyReplyLocked(const MessageHeader& reply) {
  auto finished = [&](int32_t w) {
    return std::find(reply.finished_workers.begin(), reply.finished_workers.end(), w) != reply.finished_workers.end();
  };
  if ((reply.flags & kFlagGoneListFull) != 0) {
    std::map<int32_t, bool> now;
    for (int32_t w : reply.dead_workers) now[w] = finished(w);
    for (const auto& [w, f] : now) {
      if (!gone_.count(w)) undelivered_gone_.emplace_back(w, f);
    }
    gone_ = std::move(now);
  } else {
    for (int32_t w : reply.dead_workers) {
      const bool f = finished(w);
      if (gone_.emplace(w, f).second) undelivered_gone_.emplace_back(w, f);
    }
  }
  gone_seq_ = reply.gone_seq;
  if (reply.incarnation != 0) incarnation_.store(reply.incarnation);
  if ((options_.role == Role::kWorker || options_.role == Role::kEvaluator) && reply.type == MsgType::kHeartbeat) {
    live_workers_.store(reply.worker_count);
    slice_.store(reply.slice_index >= 0 && reply.worker_count > reply.slice_index
                     ? (int64_t{reply.slice_index} << 32) | reply.worker_count
                     : -1);
  }
  NoteAddressesLocked(reply.server_addresses);
}

void RendezvousClient::NoteAddressesLocked(const std::vector<std::string>& addresses) {
  if (servers_.size() < addresses.size()) servers_.resize(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i].empty() || addresses[i] == servers_[i]) continue;
    if (!servers_[i].empty()) {
      spdlog::info("coordinator: server {} moved from {} to {}", i, servers_[i], addresses[i]);
      undelivered_moves_.emplace_back(static_cast<int32_t>(i), addresses[i]);
    }
    servers_[i] = addresses[i];
  }
}

Status RendezvousClient::AnnounceFinished(std::chrono::milliseconds timeout) {
  finished_.store(true);
  MessageHeader reply;
  return SendHeartbeat(timeout, &reply);
}

Status RendezvousClient::AnnounceDone(std::chrono::milliseconds timeout) {
  finished_.store(true);  // done implies finished
  done_.store(true);
  MessageHeader reply;
  return SendHeartbeat(timeout, &reply);
}

std::vector<int32_t> RendezvousClient::gone_workers() const {
  std::lock_guard<std::mutex> lock(gone_mu_);
  std::vector<int32_t> out;
  out.reserve(gone_.size());
  for (const auto& [w, finished] : gone_) out.push_back(w);
  return out;
}

}  // namespace downpour
