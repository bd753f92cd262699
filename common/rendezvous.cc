// rendezvous.cc — see rendezvous.h.
#include "common/rendezvous.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

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
    Frames got;
    const auto slice = std::min(left, std::chrono::duration_cast<std::chrono::milliseconds>(kSayEvery));
    Status s = endpoint_->Receive(&got, say_waiting ? slice : left);
    if (s.code() == StatusCode::kTimeout) continue;
    DP_RETURN_IF_ERROR(s);
    DP_RETURN_IF_ERROR(ParseHeader(got, reply));
    if (reply->request_id != h.request_id) continue;  // late reply to an earlier request
    return StatusFromReply(*reply);
  }
}

Status RendezvousClient::Register(Transport* transport, RendezvousOptions options, std::chrono::milliseconds timeout,
                                  std::unique_ptr<RendezvousClient>* out, RendezvousInfo* info) {
  std::unique_ptr<RendezvousClient> c(new RendezvousClient());
  c->options_ = std::move(options);
  DP_RETURN_IF_ERROR(transport->Connect(ToAddress(c->options_.coordinator), &c->endpoint_));
  MessageHeader h;
  h.type = MsgType::kRegister;
  h.role = c->options_.role;
  h.sender = c->options_.requested_id;
  h.layout_hash = c->options_.layout_hash;
  h.model_id = c->options_.model_id;
  h.text = c->options_.address;
  h.token = c->options_.token;
  MessageHeader reply;
  DP_RETURN_IF_ERROR(c->Exchange(h, &reply, timeout, /*say_waiting=*/true));
  if (reply.type != MsgType::kRegisterReply) {
    return Corrupt("coordinator {}: register answered with {}", c->options_.coordinator, MsgTypeName(reply.type));
  }
  c->id_ = reply.assigned_id;
  info->id = reply.assigned_id;
  info->server_addresses = reply.server_addresses;
  info->workers = reply.worker_count;
  *out = std::move(c);
  return Status::Ok();
}

RendezvousClient::~RendezvousClient() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void RendezvousClient::StartHeartbeats(std::function<void(int32_t, bool)> on_gone) {
  thread_ = std::thread([this, cb = std::move(on_gone)] { HeartbeatLoop(cb); });
}

void RendezvousClient::HeartbeatLoop(std::function<void(int32_t, bool)> on_gone) {
  std::set<int32_t> known_gone;
  while (!stop_.load()) {
    MessageHeader reply;
    Status s = SendHeartbeat(options_.heartbeat_interval * 4, &reply);
    if (s.ok()) {
      for (int32_t w : reply.dead_workers) {
        if (!known_gone.insert(w).second || !on_gone) continue;
        const bool finished =
            std::find(reply.finished_workers.begin(), reply.finished_workers.end(), w) != reply.finished_workers.end();
        on_gone(w, finished);
      }
      if (reply.shutdown) shutdown_.store(true);
    }
    // Sleep in small steps so destruction is prompt.
    const auto until = std::chrono::steady_clock::now() + options_.heartbeat_interval;
    while (!stop_.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
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
  MessageHeader h;
  h.type = MsgType::kHeartbeat;
  h.role = options_.role;
  h.sender = id_;
  h.clock = clock_.load();
  h.layout_hash = options_.layout_hash;
  if (finished_.load()) h.flags |= kFlagFinished;
  if (done_.load()) h.flags |= kFlagDone;
  DP_RETURN_IF_ERROR(Exchange(h, reply, timeout));
  std::lock_guard<std::mutex> lock(gone_mu_);
  gone_ = reply->dead_workers;
  return Status::Ok();
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
  return gone_;
}

}  // namespace downpour
