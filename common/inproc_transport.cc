// inproc_transport.cc — see inproc_transport.h.
#include "common/inproc_transport.h"

#include <condition_variable>
#include <deque>

namespace downpour {
namespace inproc_internal {

// A queue of (from, frames) with a blocking pop.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<PeerId, Frames>> queue;
  bool closed = false;
  bool woken = false;  // Wake: the next Take returns kTimeout at once

  void Put(PeerId from, Frames frames) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.emplace_back(std::move(from), std::move(frames));
    }
    cv.notify_one();
  }
  Status Take(PeerId* from, Frames* frames, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return !queue.empty() || woken; }) || queue.empty()) {
      woken = false;
      return Timeout("inproc: no message within {} ms", timeout.count());
    }
    if (from) *from = std::move(queue.front().first);
    *frames = std::move(queue.front().second);
    queue.pop_front();
    return Status::Ok();
  }
};

}  // namespace inproc_internal

using inproc_internal::Mailbox;

struct InprocTransport::Registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<Mailbox>> servers;   // address -> server mailbox
  std::map<PeerId, std::weak_ptr<Mailbox>> clients;        // peer id -> client mailbox
  std::map<PeerId, PeerInfo> client_info;                  // ConnectAs clients' PeerInfo
  uint64_t next_client = 0;
};

namespace {

class InprocServer : public ServerEndpoint {
 public:
  InprocServer(std::shared_ptr<InprocTransport::Registry> reg, std::string address,
               std::shared_ptr<Mailbox> box)
      : registry_(std::move(reg)), address_(std::move(address)), box_(std::move(box)) {}
  ~InprocServer() override {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->servers.erase(address_);
  }
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    PeerId who;
    Status s = box_->Take(&who, frames, timeout);
    if (s.ok() && info != nullptr) {
      std::lock_guard<std::mutex> lock(registry_->mu);
      auto it = registry_->client_info.find(who);
      *info = it == registry_->client_info.end() ? PeerInfo{} : it->second;
    }
    if (from != nullptr) *from = std::move(who);
    return s;
  }
  Status Send(const PeerId& to, Frames frames) override {
    std::shared_ptr<Mailbox> peer;
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      auto it = registry_->clients.find(to);
      if (it != registry_->clients.end()) peer = it->second.lock();
    }
    if (!peer) return Unavailable("inproc: peer '{}' is gone", to);
    peer->Put(address_, std::move(frames));
    return Status::Ok();
  }
  std::string address() const override { return address_; }
  void Wake() override {
    {
      std::lock_guard<std::mutex> lock(box_->mu);
      box_->woken = true;
    }
    box_->cv.notify_all();
  }

 private:
  std::shared_ptr<InprocTransport::Registry> registry_;
  std::string address_;
  std::shared_ptr<Mailbox> box_;
};

class InprocClient : public ClientEndpoint {
 public:
  InprocClient(std::shared_ptr<InprocTransport::Registry> reg, std::string address, PeerId id,
               std::shared_ptr<Mailbox> box)
      : registry_(std::move(reg)), address_(std::move(address)), id_(std::move(id)), box_(std::move(box)) {}
  ~InprocClient() override {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->clients.erase(id_);
    registry_->client_info.erase(id_);
  }
  Status Send(Frames frames) override {
    // Like a DEALER, a server that is (re)bound later under the same name is found again.
    std::shared_ptr<Mailbox> server;
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      auto it = registry_->servers.find(address_);
      if (it != registry_->servers.end()) server = it->second.lock();
    }
    if (!server) {
      return Unavailable("inproc: no server bound at '{}'", address_);
    }
    server->Put(id_, std::move(frames));
    return Status::Ok();
  }
  Status Receive(Frames* frames, std::chrono::milliseconds timeout) override {
    return box_->Take(nullptr, frames, timeout);
  }

 private:
  std::shared_ptr<InprocTransport::Registry> registry_;
  std::string address_;
  PeerId id_;
  std::shared_ptr<Mailbox> box_;
};

}  // namespace

InprocTransport::InprocTransport() : registry_(std::make_shared<Registry>()) {}
InprocTransport::~InprocTransport() = default;

Status InprocTransport::Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) {
  auto box = std::make_shared<Mailbox>();
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    auto it = registry_->servers.find(address);
    if (it != registry_->servers.end() && !it->second.expired()) {
      return InvalidArgument("inproc: address '{}' is already bound", address);
    }
    registry_->servers[address] = box;
  }
  *out = std::make_unique<InprocServer>(registry_, address, std::move(box));
  return Status::Ok();
}

Status InprocTransport::Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) {
  return ConnectAs(address, PeerInfo{}, out);
}

Status InprocTransport::ConnectAs(const std::string& address, PeerInfo peer, std::unique_ptr<ClientEndpoint>* out) {
  auto box = std::make_shared<Mailbox>();
  PeerId id;
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    id = fmt::format("inproc-client-{}", registry_->next_client++);
    registry_->clients[id] = box;
    if (!peer.user_id.empty() || !peer.address.empty()) registry_->client_info[id] = std::move(peer);
  }
  *out = std::make_unique<InprocClient>(registry_, address, std::move(id), std::move(box));
  return Status::Ok();
}

}  // namespace downpour
