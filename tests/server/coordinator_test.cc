// Coordinator + RendezvousClient in one process over the inproc transport: registration,
// gone workers (finished at once, silent after the heartbeat timeout), and the coordinator's
// membership events. Every wait is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/inproc_transport.h"
#include "common/rendezvous.h"
#include "server/coordinator.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

bool Contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Polls `pred` every 10 ms for at most `limit`.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.servers = 1;
    o.workers = 3;
    o.layout_hash = 0x1234;
    o.heartbeat_timeout = 600ms;
    o.on_event = [this](const CoordinatorEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(e);
    };
    coordinator_ = std::make_unique<Coordinator>(o);
    ASSERT_TRUE(transport_.Bind("inproc://coordinator", &endpoint_).ok());
    thread_ = std::thread([this] { status_ = coordinator_->Serve(endpoint_.get()); });
  }
  void TearDown() override {
    clients_.clear();
    coordinator_->Stop();
    thread_.join();
    EXPECT_TRUE(status_.ok()) << status_.ToString();
  }

  RendezvousClient* Join(Role role, int32_t id) {
    RendezvousOptions ro;
    ro.coordinator = "inproc://coordinator";
    ro.role = role;
    ro.requested_id = id;
    ro.layout_hash = 0x1234;
    ro.address = role == Role::kServer ? "inproc://server-0" : "";
    ro.heartbeat_interval = 50ms;
    std::unique_ptr<RendezvousClient> c;
    RendezvousInfo info;
    const Status s = RendezvousClient::Register(&transport_, ro, 5s, &c, &info);
    EXPECT_TRUE(s.ok()) << s.ToString();
    clients_.push_back(std::move(c));
    return clients_.back().get();
  }

  std::vector<CoordinatorEvent> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  InprocTransport transport_;
  std::unique_ptr<ServerEndpoint> endpoint_;
  std::unique_ptr<Coordinator> coordinator_;
  std::thread thread_;
  Status status_;
  std::vector<std::unique_ptr<RendezvousClient>> clients_;
  std::mutex mu_;
  std::vector<CoordinatorEvent> events_;
};

TEST_F(CoordinatorTest, FinishedWorkerIsGoneAtOnceSilentOneAfterTheTimeout) {
  RendezvousClient* server = Join(Role::kServer, 0);
  std::mutex dead_mu;
  std::vector<int32_t> server_heard_dead, server_heard_finished;
  server->StartHeartbeats([&](int32_t worker, bool finished) {
    std::lock_guard<std::mutex> lock(dead_mu);
    (finished ? server_heard_finished : server_heard_dead).push_back(worker);
  });
  RendezvousClient* w0 = Join(Role::kWorker, 0);
  RendezvousClient* w1 = Join(Role::kWorker, 1);
  RendezvousClient* w2 = Join(Role::kWorker, 2);
  w0->StartHeartbeats({});
  w1->StartHeartbeats({});
  (void)w2;  // registers, then never heartbeats: silent

  // Worker 1 finishes: the very reply to its announcement lists it, long before any timeout.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(w1->AnnounceFinished(2s).ok());
  EXPECT_TRUE(Contains(w1->gone_workers(), 1));
  EXPECT_FALSE(Contains(w1->gone_workers(), 0));
  EXPECT_TRUE(Eventually([&] { return Contains(w0->gone_workers(), 1); }, 400ms))
      << "worker 0 did not hear of worker 1 within a few heartbeats";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 600ms);
  // Worker 2 never heartbeat: gone after the 600 ms timeout; worker 0 (heartbeating) never.
  EXPECT_TRUE(Eventually([&] { return Contains(w0->gone_workers(), 2); }, 3s));
  EXPECT_FALSE(Contains(w0->gone_workers(), 0));
  // The server heard both, so its consistency accounting drops them — worker 1 as finished,
  // worker 2 as dead (its log says which).
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(dead_mu);
    return Contains(server_heard_finished, 1) && Contains(server_heard_dead, 2);
  }, 2s));
  {
    std::lock_guard<std::mutex> lock(dead_mu);
    EXPECT_FALSE(Contains(server_heard_dead, 1)) << "a finished worker was reported dead";
    EXPECT_FALSE(Contains(server_heard_finished, 2)) << "a silent worker was reported finished";
  }
  const std::vector<CoordinatorEvent> ev = Events();
  auto count = [&](const std::string& kind, int32_t who) {
    return std::count_if(ev.begin(), ev.end(), [&](const CoordinatorEvent& e) { return e.kind == kind && e.id == who; });
  };
  EXPECT_EQ(count("server_registered", 0), 1);
  EXPECT_EQ(count("worker_registered", 1), 1);
  EXPECT_EQ(count("worker_finished", 1), 1);
  EXPECT_EQ(count("worker_dead", 2), 1);
  EXPECT_EQ(count("worker_dead", 1), 0) << "a finished worker is not reported dead";
}

}  // namespace
}  // namespace downpour
