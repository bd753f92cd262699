// release_counting_endpoint.h — a server's endpoint that counts the loop's ReleaseDue calls and
// passes everything else on: a shard must never call into its transport in the middle of a
// message (an update, a factor push's expansion).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "common/transport.h"

namespace downpour::test {

class ReleaseCountingEndpoint : public ServerEndpoint {
 public:
  ReleaseCountingEndpoint(std::unique_ptr<ServerEndpoint> inner, std::atomic<int>* releases)
      : inner_(std::move(inner)), releases_(releases) {}
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    return inner_->Receive(from, frames, timeout, info);
  }
  Status Send(const PeerId& to, Frames frames) override { return inner_->Send(to, std::move(frames)); }
  void ReleaseDue() override { releases_->fetch_add(1); }
  void Wake() override { inner_->Wake(); }
  std::string address() const override { return inner_->address(); }

 private:
  std::unique_ptr<ServerEndpoint> inner_;
  std::atomic<int>* releases_;
};

}  // namespace downpour::test
