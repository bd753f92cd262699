// stamping_endpoint.h — a server's endpoint as one server process sees it, for tests of what a
// client does across a server's restart: every reply carries this process's incarnation; with
// drop_acks set, acks are lost (the server applied and logged the push, then "died" before its
// reply left).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/codec.h"
#include "common/transport.h"

namespace downpour::test {

class StampingEndpoint : public ServerEndpoint {
 public:
  StampingEndpoint(std::unique_ptr<ServerEndpoint> inner, uint64_t incarnation)
      : inner_(std::move(inner)), incarnation_(incarnation) {}
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    return inner_->Receive(from, frames, timeout, info);
  }
  Status Send(const PeerId& to, Frames frames) override {
    MessageHeader h;
    DP_RETURN_IF_ERROR(ParseHeader(frames, &h));
    if (h.type == MsgType::kAck && drop_acks.load()) {
      dropped_acks.fetch_add(1);
      return Status::Ok();
    }
    h.incarnation = incarnation_;
    DP_RETURN_IF_ERROR(HeaderFrame(h, &frames[0]));
    return inner_->Send(to, std::move(frames));
  }
  std::string address() const override { return inner_->address(); }
  void Wake() override { inner_->Wake(); }

  std::atomic<bool> drop_acks{false};
  std::atomic<int> dropped_acks{0};

 private:
  std::unique_ptr<ServerEndpoint> inner_;
  uint64_t incarnation_;
};

}  // namespace downpour::test
