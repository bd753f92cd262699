// shard_sessions_test.cc — ShardSessions (server/shard_sessions.h) on its own: a register is
// refused by the field that is wrong (token, layout, id, model) with its reason; a worker's later
// message passes only from the connection that registered, with a clock in range; a process
// declared dead is fenced and a restarted one is not; a worker process's connections are logged
// once; the evaluator's connection is its own; a region is offered only to a same-host
// connection that asks.
#include "server/shard_sessions.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <thread>

namespace downpour {
namespace {

class ShardSessionsTest : public ::testing::Test {
 protected:
  ShardSessionsTest() : share_(Layout(), 0) {}
  static const ParamLayout& Layout() {
    static const ParamLayout layout = [] {
      ParamLayout l;
      EXPECT_TRUE(ParamLayout::Build({{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}}, 2, 8, &l).ok());
      return l;
    }();
    return layout;
  }
  ShardSessionsOptions Options() const {
    ShardSessionsOptions o;
    o.server_id = 0;
    o.model_id = 3;
    o.layout_hash = Layout().hash();
    o.max_workers = 2;
    o.access.run_secret = "secret";
    return o;
  }
  static MessageHeader Register(int32_t worker, uint64_t session) {
    MessageHeader h;
    h.type = MsgType::kRegister;
    h.sender = worker;
    h.session = session;
    h.model_id = 3;
    h.layout_hash = Layout().hash();
    h.token = "secret";
    return h;
  }
  static MessageHeader Traffic(const MessageHeader& reg, MsgType type = MsgType::kPush) {
    MessageHeader h = reg;
    h.type = type;
    h.token.clear();
    h.clock = 5;
    return h;
  }
  // The reason a refused call gave (read after the call: the pointer, not a copy).
  static RejectReason Refusal(const Status& s, const RejectReason* reason) {
    EXPECT_FALSE(s.ok());
    return *reason;
  }
  ShmShare share_;
};

TEST_F(ShardSessionsTest, ARegisterIsRefusedByTheFieldThatIsWrong) {
  ShardSessions sessions(Options(), share_);
  RejectReason reason = RejectReason::kBadType;
  EXPECT_TRUE(sessions.CheckRegister(PeerInfo{}, Register(1, 11), &reason).ok());
  MessageHeader h = Register(1, 11);
  h.token = "guess";
  EXPECT_EQ(Refusal(sessions.CheckRegister(PeerInfo{}, h, &reason), &reason), RejectReason::kUnauthorized);
  h = Register(1, 11);
  h.layout_hash ^= 1;
  Status s = sessions.CheckRegister(PeerInfo{}, h, &reason);
  EXPECT_EQ(Refusal(s, &reason), RejectReason::kLayoutHash);
  EXPECT_NE(s.message().find("layout hash"), std::string::npos) << s.ToString();
  s = sessions.CheckRegister(PeerInfo{}, Register(2, 11), &reason);
  EXPECT_EQ(Refusal(s, &reason), RejectReason::kNotRegistered);
  EXPECT_NE(s.message().find("cluster.max_workers"), std::string::npos) << s.ToString();
  h = Register(1, 11);
  h.model_id = 4;
  s = sessions.CheckRegister(PeerInfo{}, h, &reason);
  EXPECT_EQ(Refusal(s, &reason), RejectReason::kModelId);
  EXPECT_NE(s.message().find("model id 4"), std::string::npos) << s.ToString();
}

TEST_F(ShardSessionsTest, WorkerTrafficPassesOnlyFromItsRegisteredConnectionWithAClockInRange) {
  ShardSessions sessions(Options(), share_);
  RejectReason reason = RejectReason::kBadType;
  const MessageHeader reg = Register(0, 11);
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, Traffic(reg), &reason), &reason),
            RejectReason::kNotRegistered);
  MessageHeader reply;
  ASSERT_TRUE(sessions.RegisterWorker("conn-a", PeerInfo{}, reg, &reply).ok());
  EXPECT_TRUE(sessions.CheckWorker("conn-a", PeerInfo{}, Traffic(reg), &reason).ok());
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-b", PeerInfo{}, Traffic(reg), &reason), &reason),
            RejectReason::kNotRegistered)
      << "another connection";
  MessageHeader other = Traffic(reg);
  other.sender = 1;
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, other, &reason), &reason), RejectReason::kNotRegistered)
      << "another worker's id on this connection";
  MessageHeader forged = Traffic(reg);
  forged.clock = kMaxClock + 1;
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, forged, &reason), &reason), RejectReason::kClock);
  forged.clock = -1;
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, forged, &reason), &reason), RejectReason::kClock);
  MessageHeader wrong_model = Traffic(reg);
  wrong_model.model_id = 9;
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, wrong_model, &reason), &reason), RejectReason::kModelId);
}

TEST_F(ShardSessionsTest, AProcessDeclaredDeadIsFencedAndARestartedOneIsNot) {
  ShardSessions sessions(Options(), share_);  // heartbeat_timeout 0: every session so far
  RejectReason reason = RejectReason::kBadType;
  const MessageHeader old_process = Register(0, 11);
  MessageHeader reply;
  ASSERT_TRUE(sessions.RegisterWorker("conn-a", PeerInfo{}, old_process, &reply).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  sessions.DeclaredDead(0);
  EXPECT_EQ(Refusal(sessions.CheckWorker("conn-a", PeerInfo{}, Traffic(old_process), &reason), &reason),
            RejectReason::kRemoved);
  EXPECT_EQ(Refusal(sessions.CheckRegister(PeerInfo{}, old_process, &reason), &reason), RejectReason::kRemoved);
  const MessageHeader restarted = Register(0, 12);
  ASSERT_TRUE(sessions.CheckRegister(PeerInfo{}, restarted, &reason).ok());
  ASSERT_TRUE(sessions.RegisterWorker("conn-c", PeerInfo{}, restarted, &reply).ok());
  EXPECT_TRUE(sessions.CheckWorker("conn-c", PeerInfo{}, Traffic(restarted), &reason).ok());
}

// A worker process registers each of its connections (cluster.connections_per_server): one
// "registered" line for the process, another for a restarted one (a new session).
TEST_F(ShardSessionsTest, AWorkersConnectionsAreLoggedOnceAProcess) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(50);
  spdlog::default_logger()->sinks().push_back(sink);
  ShardSessions sessions(Options(), share_);
  MessageHeader reply;
  for (const char* conn : {"conn-a", "conn-b", "conn-c", "conn-a"})
    ASSERT_TRUE(sessions.RegisterWorker(conn, PeerInfo{}, Register(0, 11), &reply).ok());
  ASSERT_TRUE(sessions.RegisterWorker("conn-d", PeerInfo{}, Register(1, 21), &reply).ok());
  ASSERT_TRUE(sessions.RegisterWorker("conn-e", PeerInfo{}, Register(0, 12), &reply).ok());  // restarted
  spdlog::default_logger()->sinks().pop_back();
  int worker0 = 0, worker1 = 0;
  for (const std::string& line : sink->last_formatted()) {
    worker0 += line.find("worker 0 registered") != std::string::npos;
    worker1 += line.find("worker 1 registered") != std::string::npos;
  }
  EXPECT_EQ(worker0, 2) << "one line per process of worker 0 (sessions 11 and 12)";
  EXPECT_EQ(worker1, 1);
  RejectReason reason = RejectReason::kBadType;
  for (const char* conn : {"conn-a", "conn-b", "conn-c"})  // each connection still carries traffic
    EXPECT_TRUE(sessions.CheckWorker(conn, PeerInfo{}, Traffic(Register(0, 11)), &reason).ok()) << conn;
  EXPECT_TRUE(sessions.CheckWorker("conn-e", PeerInfo{}, Traffic(Register(0, 12)), &reason).ok());
}

TEST_F(ShardSessionsTest, TheEvaluatorsConnectionIsItsOwn) {
  ShardSessions sessions(Options(), share_);
  RejectReason reason = RejectReason::kBadType;
  MessageHeader reg = Register(0, 0);
  reg.role = Role::kEvaluator;
  const MessageHeader pull = Traffic(reg, MsgType::kPull);
  EXPECT_EQ(Refusal(sessions.CheckReader("eval", pull, &reason), &reason), RejectReason::kNotRegistered);
  MessageHeader bad = reg;
  bad.token.clear();
  EXPECT_EQ(Refusal(sessions.RegisterReader("eval", PeerInfo{}, bad, &reason), &reason), RejectReason::kUnauthorized);
  ASSERT_TRUE(sessions.RegisterReader("eval", PeerInfo{}, reg, &reason).ok());
  EXPECT_TRUE(sessions.CheckReader("eval", pull, &reason).ok());
  EXPECT_EQ(Refusal(sessions.CheckWorker("eval", PeerInfo{}, Traffic(reg), &reason), &reason),
            RejectReason::kNotRegistered)
      << "a reader is not a worker";
}

TEST_F(ShardSessionsTest, ARegionIsOfferedOnlyToASameHostConnectionThatAsks) {
  ShardSessions sessions(Options(), share_);
  MessageHeader reg = Register(0, 11);
  MessageHeader reply;
  ASSERT_TRUE(sessions.RegisterWorker("plain", PeerInfo{}, reg, &reply).ok());
  EXPECT_EQ(sessions.Region("plain"), nullptr) << "not asked";
  reg.flags |= kFlagShm;
  reg.boot_id = "another-host";
  ASSERT_TRUE(sessions.RegisterWorker("remote", PeerInfo{}, reg, &reply).ok());
  EXPECT_EQ(sessions.Region("remote"), nullptr) << "another machine";
  EXPECT_TRUE(reply.shm_path.empty());
  reg.boot_id = HostBootId();
  ASSERT_TRUE(sessions.RegisterWorker("local", PeerInfo{}, reg, &reply).ok());
  ASSERT_NE(sessions.Region("local"), nullptr);
  EXPECT_FALSE(reply.shm_path.empty());
  EXPECT_EQ(reply.shm_bytes, share_.region_bytes());
  EXPECT_EQ(reply.shm_nonce, sessions.Region("local")->nonce());
  ShardSessionsOptions off = Options();
  off.shared_memory = false;
  ShardSessions no_regions(off, share_);
  MessageHeader none;
  ASSERT_TRUE(no_regions.RegisterWorker("local", PeerInfo{}, reg, &none).ok());
  EXPECT_EQ(no_regions.Region("local"), nullptr) << "server.shared_memory off";
}

}  // namespace
}  // namespace downpour
