// Coordinator + RendezvousClient in one process over the inproc transport: registration,
// gone workers (finished at once, silent after the heartbeat timeout), the coordinator's
// membership events, who may register / shut down (tokens, keys via ConnectAs), ids bound to
// their connection, and the end of a run once every worker is done. Every wait is bounded.
#include "server/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/inproc_transport.h"
#include "common/rendezvous.h"

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
  void SetUp() override { Start(AccessPolicy{}); }
  // Restarts the coordinator with `access` (and `workers`, `servers`).
  void Start(const AccessPolicy& access, int workers = 3, int servers = 1) {
    if (thread_.joinable()) TearDown();
    CoordinatorOptions o;
    o.servers = servers;
    o.workers = workers;
    o.layout_hash = 0x1234;
    o.heartbeat_timeout = 600ms;
    o.access = access;
    o.on_event = [this](const CoordinatorEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(e);
    };
    coordinator_ = std::make_unique<Coordinator>(o);
    endpoint_.reset();
    ASSERT_TRUE(transport_.Bind(Address(), &endpoint_).ok());
    thread_ = std::thread([this] { status_ = coordinator_->Serve(endpoint_.get()); });
  }
  // Each coordinator of a test binds a fresh inproc name (a stopped one's name may linger).
  std::string Address() const { return "inproc://coordinator-" + std::to_string(generation_); }
  void TearDown() override {
    clients_.clear();
    coordinator_->Stop();
    thread_.join();
    EXPECT_TRUE(status_.ok()) << status_.ToString();
    ++generation_;
  }

  RendezvousOptions Options(Role role, int32_t id, const std::string& token = "") const {
    RendezvousOptions ro;
    ro.coordinator = Address();
    ro.role = role;
    ro.requested_id = id;
    ro.layout_hash = 0x1234;
    ro.address = role == Role::kServer ? fmt::format("inproc://server-{}", id) : "";
    ro.heartbeat_interval = 50ms;
    ro.token = token;
    return ro;
  }
  RendezvousClient* Join(Role role, int32_t id, const std::string& token = "") {
    std::unique_ptr<RendezvousClient> c;
    RendezvousInfo info;
    const Status s = RendezvousClient::Register(&transport_, Options(role, id, token), 5s, &c, &info);
    EXPECT_TRUE(s.ok()) << s.ToString();
    clients_.push_back(std::move(c));
    return clients_.back().get();
  }
  Status TryJoin(Role role, int32_t id, const std::string& token) {
    std::unique_ptr<RendezvousClient> c;
    RendezvousInfo info;
    return RendezvousClient::Register(&transport_, Options(role, id, token), 2s, &c, &info);
  }

  // A hand-made peer, seen by the coordinator as `info` (a key's role, an address).
  std::unique_ptr<ClientEndpoint> Peer(const std::string& role, const std::string& address = "127.0.0.66") {
    std::unique_ptr<ClientEndpoint> ep;
    EXPECT_TRUE(transport_.ConnectAs(Address(), PeerInfo{role, address}, &ep).ok());
    return ep;
  }
  static MessageHeader Message(MsgType type, Role role, int32_t id, const std::string& token = "") {
    MessageHeader h;
    h.type = type;
    h.role = role;
    h.sender = id;
    h.layout_hash = 0x1234;
    h.token = token;
    if (type == MsgType::kRegister && role == Role::kServer) h.text = fmt::format("tcp://10.6.6.6:{}", 6000 + id);
    return h;
  }
  // Sends `h` and returns the reply (type kInvalid if none came within 2 s).
  static MessageHeader Ask(ClientEndpoint* ep, const MessageHeader& h) {
    Frames f(1);
    EXPECT_TRUE(HeaderFrame(h, &f[0]).ok());
    EXPECT_TRUE(ep->Send(std::move(f)).ok());
    Frames got;
    MessageHeader r;
    if (!ep->Receive(&got, 2s).ok()) return r;
    EXPECT_TRUE(ParseHeader(got, &r).ok());
    return r;
  }
  size_t CountEvents(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(
        std::count_if(events_.begin(), events_.end(), [&](const CoordinatorEvent& e) { return e.kind == kind; }));
  }

  std::vector<CoordinatorEvent> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  InprocTransport transport_;
  int generation_ = 0;
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
  EXPECT_TRUE(Eventually(
      [&] {
        std::lock_guard<std::mutex> lock(dead_mu);
        return Contains(server_heard_finished, 1) && Contains(server_heard_dead, 2);
      },
      2s));
  {
    std::lock_guard<std::mutex> lock(dead_mu);
    EXPECT_FALSE(Contains(server_heard_dead, 1)) << "a finished worker was reported dead";
    EXPECT_FALSE(Contains(server_heard_finished, 2)) << "a silent worker was reported finished";
  }
  const std::vector<CoordinatorEvent> ev = Events();
  auto count = [&](const std::string& kind, int32_t who) {
    return std::count_if(ev.begin(), ev.end(),
                         [&](const CoordinatorEvent& e) { return e.kind == kind && e.id == who; });
  };
  EXPECT_EQ(count("server_registered", 0), 1);
  EXPECT_EQ(count("worker_registered", 1), 1);
  EXPECT_EQ(count("worker_finished", 1), 1);
  EXPECT_EQ(count("worker_dead", 2), 1);
  EXPECT_EQ(count("worker_dead", 1), 0) << "a finished worker is not reported dead";
}

constexpr const char* kSecret = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";

TEST_F(CoordinatorTest, WithoutKeysAStrangerWithoutTheTokenCannotRegisterOrShutDown) {
  AccessPolicy access;
  access.run_secret = kSecret;
  Start(access, /*workers=*/1);
  Join(Role::kServer, 0, kSecret)->StartHeartbeats({});
  const std::vector<std::string> real = coordinator_->server_addresses();
  for (const std::string& token : std::vector<std::string>{"", "not the secret"}) {
    SCOPED_TRACE("token '" + token + "'");
    auto stranger = Peer("");
    for (const MessageHeader& h :
         {Message(MsgType::kRegister, Role::kServer, 0, token), Message(MsgType::kRegister, Role::kWorker, 0, token),
          Message(MsgType::kRegister, Role::kObserver, -1, token),
          Message(MsgType::kShutdown, Role::kWorker, 0, token)}) {
      const MessageHeader r = Ask(stranger.get(), h);
      EXPECT_EQ(r.type, MsgType::kError) << MsgTypeName(h.type) << " as role " << static_cast<int>(h.role);
      EXPECT_NE(r.error_text.find(token.empty() ? "no token" : "wrong token"), std::string::npos) << r.error_text;
    }
  }
  EXPECT_EQ(coordinator_->refused(), 8u);
  EXPECT_EQ(coordinator_->server_addresses(), real) << "a stranger re-bound a server";
  EXPECT_FALSE(coordinator_->shutting_down());
  EXPECT_EQ(CountEvents("refused"), 8u);
  EXPECT_EQ(CountEvents("worker_registered"), 0u);
  // A RendezvousClient with the wrong token hears why.
  const Status s = TryJoin(Role::kWorker, 0, "not the secret");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("wrong token"), std::string::npos) << s.message();
  // With the token: an observer, a worker, and the shutdown.
  auto tool = Peer("");
  EXPECT_EQ(Ask(tool.get(), Message(MsgType::kRegister, Role::kObserver, -1, kSecret)).type, MsgType::kRegisterReply);
  RendezvousClient* w = Join(Role::kWorker, 0, kSecret);
  ASSERT_TRUE(w->RequestShutdown(2s).ok());
  EXPECT_TRUE(coordinator_->shutting_down());
}

TEST_F(CoordinatorTest, WithKeysEachRegistrationNeedsItsRolesKeyAndShutdownTheAdminKey) {
  AccessPolicy access;
  access.keyed = true;
  access.run_secret = kSecret;  // ignored with keys
  Start(access, /*workers=*/1);
  struct Case {
    MessageHeader h;
    const char* needs;
    std::vector<std::string> wrong_keys;
  };
  const std::vector<Case> cases = {
      {Message(MsgType::kRegister, Role::kServer, 0, kSecret), "server", {"", "worker", "admin"}},
      {Message(MsgType::kRegister, Role::kWorker, 0, kSecret), "worker", {"", "server", "admin"}},
      {Message(MsgType::kRegister, Role::kObserver, -1, kSecret), "admin", {"", "server", "worker"}},
      {Message(MsgType::kShutdown, Role::kWorker, 0, kSecret), "admin", {"", "server", "worker"}},
  };
  uint64_t refused = 0;
  for (const Case& c : cases) {
    for (const std::string& key : c.wrong_keys) {
      auto p = Peer(key);
      const MessageHeader r = Ask(p.get(), c.h);
      EXPECT_EQ(r.type, MsgType::kError) << MsgTypeName(c.h.type) << " with key '" << key << "'";
      EXPECT_NE(r.error_text.find(fmt::format("needs the '{}' key", c.needs)), std::string::npos) << r.error_text;
      ++refused;
    }
  }
  EXPECT_EQ(coordinator_->refused(), refused);
  EXPECT_EQ(coordinator_->server_addresses(), std::vector<std::string>{""});
  EXPECT_FALSE(coordinator_->shutting_down());
  // The right keys.
  auto server = Peer("server", "127.0.0.3");
  EXPECT_EQ(Ask(server.get(), Message(MsgType::kRegister, Role::kServer, 0)).type, MsgType::kRegisterReply);
  EXPECT_EQ(coordinator_->server_addresses(), std::vector<std::string>{"tcp://10.6.6.6:6000"});
  auto worker = Peer("worker", "127.0.0.5");
  const MessageHeader reg = Ask(worker.get(), Message(MsgType::kRegister, Role::kWorker, 0));
  EXPECT_EQ(reg.type, MsgType::kRegisterReply);
  EXPECT_EQ(reg.server_addresses, std::vector<std::string>{"tcp://10.6.6.6:6000"});
  auto admin = Peer("admin", "127.0.0.2");
  EXPECT_EQ(Ask(admin.get(), Message(MsgType::kShutdown, Role::kUnknown, -1)).type, MsgType::kAck);
  EXPECT_TRUE(coordinator_->shutting_down());
}

TEST_F(CoordinatorTest, AServerIdCannotBeStolenWhileItsHolderHeartbeatsButCanBeTakenOverAfterSilence) {
  AccessPolicy access;
  access.keyed = true;
  Start(access, /*workers=*/1);
  auto holder = Peer("server", "127.0.0.3");
  ASSERT_EQ(Ask(holder.get(), Message(MsgType::kRegister, Role::kServer, 0)).type, MsgType::kRegisterReply);
  const std::vector<std::string> real = coordinator_->server_addresses();
  // An insider with a server key claims server 0 at an address of its choosing, again and again
  // while the holder heartbeats: refused each time.
  auto thief = Peer("server", "127.0.0.99");
  MessageHeader steal = Message(MsgType::kRegister, Role::kServer, 0);
  steal.text = "tcp://127.0.0.99:6666";
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(Ask(holder.get(), Message(MsgType::kHeartbeat, Role::kServer, 0)).type, MsgType::kHeartbeat);
    const MessageHeader r = Ask(thief.get(), steal);
    EXPECT_EQ(r.type, MsgType::kError);
    EXPECT_NE(r.error_text.find("held by another connection"), std::string::npos) << r.error_text;
    std::this_thread::sleep_for(100ms);  // 800 ms in all: longer than the 600 ms timeout
  }
  EXPECT_EQ(coordinator_->server_addresses(), real);
  // The thief's heartbeats for server 0 do not keep the id alive for it either.
  EXPECT_EQ(Ask(thief.get(), Message(MsgType::kHeartbeat, Role::kServer, 0)).type, MsgType::kError);
  // The holder falls silent: after the timeout another connection may take the id (a restarted
  // server on a new connection).
  std::this_thread::sleep_for(700ms);
  auto restarted = Peer("server", "127.0.0.4");
  MessageHeader again = Message(MsgType::kRegister, Role::kServer, 0);
  again.text = "tcp://127.0.0.4:7000";
  EXPECT_EQ(Ask(restarted.get(), again).type, MsgType::kRegisterReply);
  EXPECT_EQ(coordinator_->server_addresses(), std::vector<std::string>{"tcp://127.0.0.4:7000"});
  // Now the old holder is the stranger.
  EXPECT_EQ(Ask(holder.get(), Message(MsgType::kHeartbeat, Role::kServer, 0)).type, MsgType::kError);
}

TEST_F(CoordinatorTest, AWorkerIdIsBoundToTheConnectionThatRegisteredIt) {
  AccessPolicy access;
  access.run_secret = kSecret;
  Start(access, /*workers=*/2);
  Join(Role::kServer, 0, kSecret)->StartHeartbeats({});
  RendezvousClient* w0 = Join(Role::kWorker, 0, kSecret);
  RendezvousClient* w1 = Join(Role::kWorker, 1, kSecret);
  w0->StartHeartbeats({});
  w1->StartHeartbeats({});
  const uint64_t refused_before = coordinator_->refused();
  // A local stranger (no token needed for heartbeats) says worker 1 finished, is done, moved on.
  auto stranger = Peer("");
  MessageHeader fake = Message(MsgType::kHeartbeat, Role::kWorker, 1);
  fake.flags = kFlagFinished | kFlagDone;
  fake.clock = 1000000;
  MessageHeader r = Ask(stranger.get(), fake);
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_NE(r.error_text.find("not registered on this connection"), std::string::npos) << r.error_text;
  MessageHeader clock = Message(MsgType::kClock, Role::kWorker, 0);
  clock.clock = 99;
  EXPECT_EQ(Ask(stranger.get(), clock).type, MsgType::kError);
  // Even with the token, it cannot take a live worker's id.
  r = Ask(stranger.get(), Message(MsgType::kRegister, Role::kWorker, 1, kSecret));
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_NE(r.error_text.find("worker id 1 is held by another connection"), std::string::npos) << r.error_text;
  EXPECT_EQ(coordinator_->refused(), refused_before + 3);
  std::this_thread::sleep_for(200ms);  // a few heartbeats
  EXPECT_TRUE(coordinator_->dead_workers().empty()) << "a stranger's heartbeat made worker 1 gone";
  EXPECT_FALSE(coordinator_->shutting_down());
  EXPECT_EQ(CountEvents("worker_finished"), 0u);
  EXPECT_EQ(CountEvents("worker_done"), 0u);
  EXPECT_FALSE(Contains(w0->gone_workers(), 1));
}

TEST_F(CoordinatorTest, TheRunEndsOnceEveryWorkerIsDoneOrDead) {
  Start(AccessPolicy{}, /*workers=*/3);
  RendezvousClient* server = Join(Role::kServer, 0);
  server->StartHeartbeats({});
  RendezvousClient* w0 = Join(Role::kWorker, 0);
  RendezvousClient* w1 = Join(Role::kWorker, 1);
  RendezvousClient* w2 = Join(Role::kWorker, 2);
  w0->StartHeartbeats({});
  w1->StartHeartbeats({});
  w2->StartHeartbeats({});
  // Finished (still evaluating) is not done: the run goes on.
  ASSERT_TRUE(w0->AnnounceFinished(2s).ok());
  ASSERT_TRUE(w0->AnnounceDone(2s).ok());
  ASSERT_TRUE(w1->AnnounceFinished(2s).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(coordinator_->shutting_down());
  ASSERT_TRUE(w1->AnnounceDone(2s).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(coordinator_->shutting_down()) << "worker 2 is neither done nor dead";
  EXPECT_FALSE(server->shutdown_requested());
  // Worker 2 dies (its heartbeats stop): once it is declared dead, the run ends by itself and
  // the server hears it.
  clients_[3].reset();
  EXPECT_TRUE(Eventually([&] { return coordinator_->shutting_down(); }, 3s));
  EXPECT_TRUE(Eventually([&] { return server->shutdown_requested(); }, 2s));
  EXPECT_EQ(CountEvents("worker_done"), 2u);
  EXPECT_EQ(CountEvents("shutdown"), 1u);
}

TEST_F(CoordinatorTest, TheRunEndsWhenTheLastWorkerIsDone) {
  Start(AccessPolicy{}, /*workers=*/2);
  RendezvousClient* server = Join(Role::kServer, 0);
  server->StartHeartbeats({});
  RendezvousClient* w0 = Join(Role::kWorker, 0);
  RendezvousClient* w1 = Join(Role::kWorker, 1);
  w0->StartHeartbeats({});
  w1->StartHeartbeats({});
  ASSERT_TRUE(w1->AnnounceDone(2s).ok());
  EXPECT_FALSE(coordinator_->shutting_down());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(w0->AnnounceDone(2s).ok());
  EXPECT_TRUE(coordinator_->shutting_down()) << "the last done worker's own heartbeat ends the run";
  EXPECT_TRUE(Eventually([&] { return server->shutdown_requested(); }, 2s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 600ms) << "not a timeout's doing";
  // A done worker is also finished: the servers stopped waiting for it.
  EXPECT_TRUE(Contains(w0->gone_workers(), 0));
}

}  // namespace
}  // namespace downpour
