// security_test.cc — issue 11's attacks, tried as an attacker would, against real
// downpour-coordinator and downpour-server processes over loopback TCP.
//
// On the build before issue 11 a peer that never registered could make a server write a
// checkpoint wherever it named (kCheckpoint takes the path from the message), shut down a
// server and the coordinator (kShutdown), register as "server 1" at an address of its choosing
// (the coordinator then handed it to every new worker), and register as a worker and push
// gradients that were applied. Each attempt must now fail:
//  * With CurveZMQ keys ([security] keys): a client without the cluster's key — plaintext, a
//    random key, another cluster's valid keys, or this cluster's key sent to another endpoint
//    key — gets no reply at all and is counted (refused_connections). A client holding one of
//    the cluster's keys is refused what its role does not allow, with an error reply, and
//    counted (the server's refused_unauthorized, the coordinator's refused_messages); even the
//    admin key cannot checkpoint outside the run directory (refused_outside_run_dir).
//  * Without keys (the loopback default): register and admin messages without the run's secret
//    (RUN_DIR/secret) are refused, and a connection that did not register cannot push.
// After the attacks a legitimate worker pulls weights byte-identical to those before, a new
// worker is handed the real server list, and every process still serves; the end metrics show
// the refusals. With the right key or secret the same messages succeed, so the refusals are not
// artefacts of malformed messages.
//
// Every message is built with the project's codec, exactly as the real clients build them
// (common/rendezvous.cc, client/ps/ps_client.cc): the attacker is assumed to know the protocol
// and the model (the layout hash), but not the keys or the secret.
#include "common/security.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/ps/ps_client.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/rendezvous.h"
#include "common/run_secret.h"
#include "common/zmq_transport.h"
#include "tests/testing/harness.h"
#include "tests/testing/job_config.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int kServers = 2;
constexpr int kWorkers = 2;  // worker 0: the legitimate one; worker 1: the one that checks the server list
// How long a client without the cluster's key is given to get any reply. A refused CurveZMQ
// handshake never lets a message through, so this only bounds the test; 2 s is thousands of
// loopback round trips even on a loaded machine.
constexpr auto kNoReplyWait = 2000ms;
// A reply that must come (a refusal or an ack); generous for a machine shared with builds.
constexpr auto kReplyWait = 10000ms;
// The reason a shard counts a refusal of who the peer is under (server_end refused_unauthorized).
constexpr RejectReason kUnauthorized = RejectReason::kUnauthorized;
// Where an attacker would have the workers send their gradients.
const char* kAttackerAddress = "tcp://127.0.0.1:9";

// ---- What an attacker sends -----------------------------------------------------------------

struct Message {
  MessageHeader header;
  Frames payload;  // owning frames
};

Message Header(MsgType type, Role role, int32_t sender, const ParamLayout& layout, const std::string& token) {
  Message m;
  m.header.type = type;
  m.header.role = role;
  m.header.sender = sender;
  m.header.layout_hash = layout.hash();
  m.header.token = token;
  return m;
}

// Register with the coordinator as server `id`, reachable at `address` (what a server sends).
Message RegisterServer(const ParamLayout& layout, int32_t id, const std::string& address, const std::string& token) {
  Message m = Header(MsgType::kRegister, Role::kServer, id, layout, token);
  m.header.text = address;
  return m;
}

// Register as worker `id` (-1: any free id) with the coordinator, or as worker `id` with a shard.
Message RegisterWorker(const ParamLayout& layout, int32_t id, const std::string& token) {
  return Header(MsgType::kRegister, Role::kWorker, id, layout, token);
}

// A heartbeat saying worker `id` is finished and done: the coordinator ends the run once every
// worker is done, so a forged one is a way to stop a run.
Message HeartbeatDone(const ParamLayout& layout, int32_t id) {
  Message m = Header(MsgType::kHeartbeat, Role::kWorker, id, layout, "");
  m.header.flags = kFlagFinished | kFlagDone;
  m.header.clock = 1000000;
  return m;
}

// Admin messages, as an operator's tool sends them (no worker or server id of its own).
Message Checkpoint(const ParamLayout& layout, const std::string& path, const std::string& token) {
  Message m = Header(MsgType::kCheckpoint, Role::kObserver, -1, layout, token);
  m.header.text = path;
  return m;
}

Message Shutdown(const ParamLayout& layout, const std::string& token) {
  return Header(MsgType::kShutdown, Role::kObserver, -1, layout, token);
}

// A gradient push from worker `sender` for every chunk server `server` owns, every element
// `value` (a well-formed push: versions, counts, byte lengths, one payload frame per chunk).
Message GradientPush(const ParamLayout& layout, int server, int32_t sender, float value) {
  Message m = Header(MsgType::kPush, Role::kWorker, sender, layout, "");
  for (const int32_t id : layout.ServerChunks(server)) {
    const Chunk& chunk = layout.chunk(id);
    const std::vector<float> grad(static_cast<size_t>(chunk.count), value);
    m.header.chunk_ids.push_back(static_cast<uint32_t>(id));
    m.header.versions.push_back(0);
    m.header.elem_counts.push_back(static_cast<uint64_t>(chunk.count));
    m.header.byte_lengths.push_back(grad.size() * sizeof(float));
    m.payload.push_back(Frame::Copy(grad.data(), grad.size() * sizeof(float)));
  }
  return m;
}

// One attacker (or the test's own admin): a ZmqTransport of its own with the key it holds (or
// none), and one connection per address it talks to. Replies on a connection come in the order
// of its requests.
class Peer {
 public:
  explicit Peer(ZmqOptions options) : transport_(std::move(options)) {}

  void Send(const std::string& address, const Message& m) {
    Frames frames(1);
    ASSERT_TRUE(HeaderFrame(m.header, &frames[0]).ok());
    for (const Frame& f : m.payload) frames.push_back(f);
    ClientEndpoint* endpoint = To(address);
    ASSERT_NE(endpoint, nullptr) << "cannot connect to " << address;
    ASSERT_TRUE(endpoint->Send(std::move(frames)).ok()) << "send to " << address;
  }
  // The next reply on the connection to `address`, or nullopt when none arrives within `wait`.
  // A reply whose header does not parse is still a reply (type kInvalid).
  std::optional<MessageHeader> Reply(const std::string& address, std::chrono::milliseconds wait) {
    ClientEndpoint* endpoint = To(address);
    Frames frames;
    if (endpoint == nullptr || !endpoint->Receive(&frames, wait).ok()) return std::nullopt;
    MessageHeader h;
    if (!ParseHeader(frames, &h).ok()) return MessageHeader{};
    return h;
  }
  std::optional<MessageHeader> Ask(const std::string& address, const Message& m) {
    Send(address, m);
    return Reply(address, kReplyWait);
  }

 private:
  ClientEndpoint* To(const std::string& address) {
    auto& endpoint = endpoints_[address];
    if (!endpoint && !transport_.Connect(address, &endpoint).ok()) return nullptr;
    return endpoint.get();
  }

  ZmqTransport transport_;
  std::map<std::string, std::unique_ptr<ClientEndpoint>> endpoints_;  // destroyed before transport_
};

// `reply` is the refusal of what was asked: an error reply, kFailedPrecondition, saying `why`;
// from a shard also with the reason it counted the refusal under (the reply's flags).
::testing::AssertionResult Refused(const std::optional<MessageHeader>& reply, const std::string& why,
                                   std::optional<RejectReason> reason = std::nullopt) {
  if (!reply) return ::testing::AssertionFailure() << "no reply at all (a refusal was expected)";
  if (reply->type != MsgType::kError) {
    return ::testing::AssertionFailure() << "it was accepted: the reply is " << MsgTypeName(reply->type);
  }
  const Status s = StatusFromReply(*reply);
  if (s.code() != StatusCode::kFailedPrecondition || s.message().find(why) == std::string::npos) {
    return ::testing::AssertionFailure() << "refused, but not as expected ('" << why << "'): " << s.ToString();
  }
  if (reason && reply->flags != static_cast<uint32_t>(*reason)) {
    return ::testing::AssertionFailure() << "refused, but counted as reason " << reply->flags << ", not "
                                         << RejectReasonName(*reason);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Accepted(const std::optional<MessageHeader>& reply, MsgType expected) {
  if (!reply) return ::testing::AssertionFailure() << "no reply";
  if (reply->type != expected) {
    return ::testing::AssertionFailure() << "reply " << MsgTypeName(reply->type) << ": "
                                         << StatusFromReply(*reply).ToString();
  }
  return ::testing::AssertionSuccess();
}

// ---- The run under attack -------------------------------------------------------------------

// A process that registered with the coordinator as a worker, heartbeating, with a PsClient on
// every server (the legitimate worker the attackers would impersonate or poison).
struct LegitWorker {
  std::unique_ptr<ZmqTransport> transport;
  std::unique_ptr<RendezvousClient> link;
  RendezvousInfo info;
  std::unique_ptr<PsClient> client;  // declared after transport: destroyed before it
};

// A coordinator and two servers as real processes, with or without CurveZMQ keys, and a
// legitimate worker that has pushed the initial weights and pulled them back.
class RunUnderAttack : public ::testing::Test {
 protected:
  void StartRun(bool keyed) {
    keyed_ = keyed;
    for (const char* p : {"downpour-server", "downpour-coordinator"}) {
      ASSERT_TRUE(fs::exists(test::Binary(p))) << test::Binary(p) << " not built";
    }
    dir_ = test::ScratchDir("security");
    run_dir_ = dir_ / "run";
    outside_ = dir_ / "outside";  // where the attackers' checkpoints would land
    fs::create_directories(run_dir_);
    fs::create_directories(outside_);
    specs_ = {{"w", {40, 25}, 1, 1}, {"b", {40}, 2, 0}, {"v", {333}, 1, 1}};
    ASSERT_TRUE(ParamLayout::Build(specs_, kServers, 128, &layout_).ok());
    test::WriteFile(dir_ / "tensors.txt", "w 40x25 1 1\nb 40 2 0\nv 333\n");
    ASSERT_NO_FATAL_FAILURE(WriteConfig());
    ASSERT_NO_FATAL_FAILURE(StartProcesses());
    ASSERT_NO_FATAL_FAILURE(StartWorker(&worker_));
    ASSERT_EQ(worker_.info.id, 0);
    ASSERT_NO_FATAL_FAILURE(InitWeights());
  }

  // run.toml, with this run's keys (and two more key directories for the strangers), or the
  // run's secret.
  void WriteConfig() {
    test::JobConfig job = test::ExactUpdateJob(kServers, kWorkers).Set("cluster.heartbeat_timeout_ms", 10000);
    if (keyed_) {
      keys_ = (dir_ / "keys").string();
      other_cluster_ = (dir_ / "other-cluster").string();
      stranger_keys_ = (dir_ / "stranger").string();
      for (const std::string& d : {keys_, other_cluster_, stranger_keys_}) {
        const Status s = MakeClusterKeys(d);
        ASSERT_TRUE(s.ok()) << d << ": " << s.ToString();
      }
      job.Set("security.keys", keys_);
    } else {
      // Made before any process starts, as downpour-launch does.
      ASSERT_TRUE(EnsureRunSecret(run_dir_.string(), &secret_).ok());
    }
    // base_lr 1, no momentum, no decay: a gradient g changes a weight by exactly -lr_mult * g.
    job.Write(dir_ / "run.toml");
  }

  // The coordinator, then the servers (told where the coordinator is), each logging to dir_.
  void StartProcesses() {
    const std::vector<std::string> common = {
        "--config",  (dir_ / "run.toml").string(),    "--run-dir", run_dir_.string(),
        "--tensors", (dir_ / "tensors.txt").string(), "--port",    "0"};
    std::vector<std::string> argv = {test::Binary("downpour-coordinator")};
    argv.insert(argv.end(), common.begin(), common.end());
    coordinator_process_ = std::make_unique<test::Child>(argv, dir_ / "coordinator.log");
    coordinator_ = test::WaitForWord(run_dir_ / "coordinator.addr", 20s);
    ASSERT_FALSE(coordinator_.empty()) << Log("coordinator.log");
    for (int s = 0; s < kServers; ++s) {
      argv = {test::Binary("downpour-server"), "--id", std::to_string(s), "--coordinator", coordinator_};
      argv.insert(argv.end(), common.begin(), common.end());
      servers_.push_back(std::make_unique<test::Child>(argv, dir_ / fmt::format("server-{}.log", s)));
    }
    for (int s = 0; s < kServers; ++s) {
      server_addresses_.push_back(test::WaitForWord(run_dir_ / fmt::format("server-{}.addr", s), 20s));
      ASSERT_FALSE(server_addresses_.back().empty()) << Log(fmt::format("server-{}.log", s));
    }
  }

  // The legitimate worker pushes the initial weights (multiples of 0.5, so every update below
  // is exact) and pulls them back: the weights and statistics every attack must leave alone.
  void InitWeights() {
    std::vector<float> init(static_cast<size_t>(layout_.total_elems()));
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.5f * static_cast<float>(i % 97);
    ASSERT_TRUE(worker_.client->Wait(worker_.client->PushInit(init), kReplyWait).ok());
    ASSERT_NO_FATAL_FAILURE(Pull(&weights_before_, &versions_before_));
    ASSERT_EQ(weights_before_, init);
    for (int s = 0; s < kServers; ++s) stats_before_.push_back(Stats(s));
  }

  // ZeroMQ options of a client holding this cluster's `role` key (plaintext in a run without
  // keys). Linger 0: what a test peer still has queued when it goes is not wanted.
  ZmqOptions Options(KeyRole role) const { return KeyOptions(keys_, role); }
  ZmqOptions KeyOptions(const std::string& key_dir, KeyRole role) const {
    ZmqOptions o;
    o.linger_ms = 0;
    if (keyed_) {
      const Status s = LoadCurveKeys(key_dir, role, /*bind=*/false, &o.curve);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return o;
  }
  // The token legitimate processes send: the run's secret without keys, none with keys.
  std::string Token() const { return keyed_ ? "" : secret_; }

  // Registers a worker with the coordinator (the worker key, or the run's secret) and connects
  // its PsClient to every server the coordinator handed it.
  void StartWorker(LegitWorker* w) {
    w->transport = std::make_unique<ZmqTransport>(Options(KeyRole::kWorker));
    RendezvousOptions ro;
    ro.coordinator = coordinator_;
    ro.token = Token();
    ro.role = Role::kWorker;
    ro.layout_hash = layout_.hash();
    ro.heartbeat_interval = 100ms;
    const Status s = RendezvousClient::Register(w->transport.get(), ro, 30s, &w->link, &w->info);
    ASSERT_TRUE(s.ok()) << s.ToString() << Log("coordinator.log");
    w->link->StartHeartbeats(nullptr);
    PsClientOptions o;
    o.server_addresses = w->info.server_addresses;
    o.worker_id = w->info.id;
    o.token = Token();
    o.reply_timeout = kReplyWait;
    ASSERT_TRUE(PsClient::Create(w->transport.get(), layout_, o, &w->client).ok());
    const Status c = w->client->Connect(kReplyWait);
    ASSERT_TRUE(c.ok()) << c.ToString();
  }

  void Pull(std::vector<float>* weights, std::vector<int64_t>* versions) {
    weights->assign(static_cast<size_t>(layout_.total_elems()), 0.0f);
    const Status s = worker_.client->Wait(worker_.client->Pull(*weights), kReplyWait);
    ASSERT_TRUE(s.ok()) << s.ToString();
    versions->assign(worker_.client->last_versions().begin(), worker_.client->last_versions().end());
  }

  ShardStatsWire Stats(int server) {
    ShardStatsWire st;
    const Status s = worker_.client->Stats(server, &st, kReplyWait);
    EXPECT_TRUE(s.ok()) << "server " << server << " does not answer: " << s.ToString();
    return st;
  }
  static uint64_t Rejected(const ShardStatsWire& st, RejectReason reason) {
    const auto i = static_cast<size_t>(reason);
    return i < st.rejected_by_reason.size() ? st.rejected_by_reason[i] : 0;
  }

  // The initial weights after one gradient `g` on every chunk of `server` (base_lr 1, no
  // momentum, no decay: each weight moves by exactly -lr_mult * g).
  std::vector<float> AfterGradient(int server, float g) const {
    std::vector<float> w = weights_before_;
    for (const int32_t id : layout_.ServerChunks(server)) {
      const Chunk& c = layout_.chunk(id);
      const float lr_mult = specs_[static_cast<size_t>(c.tensor)].lr_mult;
      for (int64_t i = c.flat_offset; i < c.flat_offset + c.count; ++i) w[static_cast<size_t>(i)] -= lr_mult * g;
    }
    return w;
  }

  // What every attack must leave as it found it: the weights and their versions (byte for
  // byte), the server list a new worker is handed, and every process alive and serving.
  void ExpectRunUntouched(const std::string& after) {
    std::vector<float> weights;
    std::vector<int64_t> versions;
    ASSERT_NO_FATAL_FAILURE(Pull(&weights, &versions));
    ASSERT_EQ(weights.size(), weights_before_.size());
    EXPECT_EQ(std::memcmp(weights.data(), weights_before_.data(), weights.size() * sizeof(float)), 0)
        << "the weights changed after " << after;
    EXPECT_EQ(versions, versions_before_) << "chunks were updated after " << after;
    LegitWorker newcomer;
    ASSERT_NO_FATAL_FAILURE(StartWorker(&newcomer));
    EXPECT_EQ(newcomer.info.server_addresses, server_addresses_)
        << "after " << after << " a new worker is handed another server list";
    for (int s = 0; s < kServers; ++s) {
      EXPECT_TRUE(test::Alive(servers_[static_cast<size_t>(s)]->pid())) << "server " << s << " died after " << after;
      (void)Stats(s);
    }
    EXPECT_TRUE(test::Alive(coordinator_process_->pid())) << "the coordinator died after " << after;
    EXPECT_FALSE(worker_.link->shutdown_requested()) << "the run is shutting down after " << after;
  }

  // Ends the run as its operator does: the admin key (or the run's secret) shuts down server 0
  // directly and then the coordinator, whose shutdown server 1 hears at its next heartbeat.
  // Every process must exit 0. Also shows that the attackers' shutdown messages were well formed.
  void StopAsAdmin() {
    Peer admin(Options(KeyRole::kAdmin));
    EXPECT_TRUE(Accepted(admin.Ask(server_addresses_[0], Shutdown(layout_, Token())), MsgType::kAck))
        << "the admin's shutdown of server 0";
    EXPECT_EQ(servers_[0]->WaitExit(20s), 0) << Log("server-0.log");
    EXPECT_TRUE(Accepted(admin.Ask(coordinator_, Shutdown(layout_, Token())), MsgType::kAck))
        << "the admin's shutdown of the coordinator";
    EXPECT_EQ(servers_[1]->WaitExit(20s), 0) << Log("server-1.log");
    EXPECT_EQ(coordinator_process_->WaitExit(20s), 0) << Log("coordinator.log");
  }

  // The one `event` record of <run_dir>/metrics/<file>, e.g. ("server-0.jsonl", "server_end").
  MetricRecord End(const std::string& file, const std::string& event) {
    const std::vector<MetricRecord> records = test::Metrics(run_dir_, file, event);
    EXPECT_EQ(records.size(), 1u) << file << " " << event;
    return records.empty() ? MetricRecord{} : records.front();
  }
  static int64_t Int(const MetricRecord& r, const std::string& key) {
    EXPECT_TRUE(r.Has(key)) << key;
    return r.Get(key).AsInt();
  }

  std::string Log(const std::string& name) const { return test::ReadFile(dir_ / name); }

  bool keyed_ = false;
  fs::path dir_, run_dir_, outside_;
  std::string keys_, other_cluster_, stranger_keys_;  // key directories (keyed runs)
  std::string secret_;                                // the run's secret (runs without keys)
  std::vector<TensorSpec> specs_;
  ParamLayout layout_;
  std::unique_ptr<test::Child> coordinator_process_;
  std::vector<std::unique_ptr<test::Child>> servers_;
  std::string coordinator_;                    // tcp://127.0.0.1:PORT
  std::vector<std::string> server_addresses_;  // index = server id
  LegitWorker worker_;
  std::vector<float> weights_before_;
  std::vector<int64_t> versions_before_;
  std::vector<ShardStatsWire> stats_before_;  // index = server id
};

class KeyedRunUnderAttack : public RunUnderAttack {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartRun(/*keyed=*/true)); }
};

class UnkeyedRunUnderAttack : public RunUnderAttack {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartRun(/*keyed=*/false)); }
};

// ---- With keys ------------------------------------------------------------------------------

TEST_F(KeyedRunUnderAttack, ClientsWithoutTheClusterKeyGetNoReplyAndChangeNothing) {
  struct Stranger {
    std::string who;
    ZmqOptions options;
  };
  std::vector<Stranger> strangers;
  ZmqOptions plaintext;
  plaintext.linger_ms = 0;
  strangers.push_back({"a plaintext client", plaintext});
  ZmqOptions random_key = Options(KeyRole::kWorker);  // the right endpoint key, a keypair nobody allowed
  const ZmqOptions stranger = KeyOptions(stranger_keys_, KeyRole::kWorker);
  random_key.curve.client_public = stranger.curve.client_public;
  random_key.curve.client_secret = stranger.curve.client_secret;
  strangers.push_back({"a client with a random key", random_key});
  strangers.push_back({"a client with another cluster's admin key", KeyOptions(other_cluster_, KeyRole::kAdmin)});
  ZmqOptions wrong_endpoint = Options(KeyRole::kAdmin);  // a key the servers accept, sent to another endpoint key
  wrong_endpoint.curve.server_public = KeyOptions(other_cluster_, KeyRole::kAdmin).curve.server_public;
  strangers.push_back({"a client with this cluster's admin key expecting another endpoint key", wrong_endpoint});

  // Every attack of the issue from every stranger at once, then one bounded wait for any reply.
  std::vector<std::unique_ptr<Peer>> peers;
  for (size_t i = 0; i < strangers.size(); ++i) {
    peers.push_back(std::make_unique<Peer>(strangers[i].options));
    Peer& p = *peers.back();
    p.Send(coordinator_, RegisterServer(layout_, 1, kAttackerAddress, ""));
    p.Send(coordinator_, RegisterWorker(layout_, -1, ""));
    p.Send(coordinator_, HeartbeatDone(layout_, 0));
    p.Send(coordinator_, Shutdown(layout_, ""));
    for (int s = 0; s < kServers; ++s) {
      const std::string& server = server_addresses_[static_cast<size_t>(s)];
      p.Send(server, RegisterWorker(layout_, 0, ""));
      p.Send(server, GradientPush(layout_, s, 0, 1000.0f));
      p.Send(server, Checkpoint(layout_, (outside_ / fmt::format("stranger-{}-server-{}.dpt", i, s)).string(), ""));
      p.Send(server, Shutdown(layout_, ""));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + kNoReplyWait;
  auto left = [&] {
    return std::max(1ms,
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  for (size_t i = 0; i < peers.size(); ++i) {
    EXPECT_FALSE(peers[i]->Reply(coordinator_, left()).has_value())
        << strangers[i].who << " got a reply from the coordinator";
    for (const std::string& server : server_addresses_) {
      EXPECT_FALSE(peers[i]->Reply(server, left()).has_value()) << strangers[i].who << " got a reply from " << server;
    }
  }
  peers.clear();

  EXPECT_TRUE(fs::is_empty(outside_)) << "a stranger's checkpoint was written";
  for (int s = 0; s < kServers; ++s) {
    // Nothing reached the shard at all: not even a refusal was counted there.
    const ShardStatsWire st = Stats(s);
    EXPECT_EQ(st.pushes_received, stats_before_[static_cast<size_t>(s)].pushes_received) << "server " << s;
    EXPECT_EQ(st.rejected_by_reason, stats_before_[static_cast<size_t>(s)].rejected_by_reason) << "server " << s;
    EXPECT_EQ(st.checkpoints_written, 0u) << "server " << s;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRunUntouched("four clients without the cluster's key attacked"));
  ASSERT_NO_FATAL_FAILURE(StopAsAdmin());

  // Each stranger was refused at least once by every process; a refused ZeroMQ client retries
  // every 100 ms and each attempt counts, so the exact number depends on timing.
  for (int s = 0; s < kServers; ++s) {
    const MetricRecord end = End(fmt::format("server-{}.jsonl", s), "server_end");
    EXPECT_GE(Int(end, "refused_connections"), static_cast<int64_t>(strangers.size())) << "server " << s;
    EXPECT_EQ(Int(end, "refused_unauthorized"), 0) << "server " << s << ": a stranger's message reached the shard";
    EXPECT_EQ(Int(end, "refused_outside_run_dir"), 0) << "server " << s;
    EXPECT_THAT(Log(fmt::format("server-{}.log", s)), HasSubstr("refused connection"));
  }
  const MetricRecord end = End("coordinator.jsonl", "coordinator_end");
  EXPECT_GE(Int(end, "refused_connections"), static_cast<int64_t>(strangers.size()));
  EXPECT_EQ(Int(end, "refused_messages"), 0) << "a stranger's message reached the coordinator";
  EXPECT_THAT(Log("coordinator.log"), HasSubstr("refused connection"));
}

TEST_F(KeyedRunUnderAttack, EachClusterKeyIsRefusedWhatItsRoleDoesNotAllow) {
  Peer worker_key(Options(KeyRole::kWorker));
  Peer server_key(Options(KeyRole::kServer));
  // The coordinator: 7 refusals.
  EXPECT_TRUE(
      Refused(worker_key.Ask(coordinator_, RegisterServer(layout_, 1, kAttackerAddress, "")), "needs the 'server' key"))
      << "the worker key registering as server 1 at an address of its choosing";
  EXPECT_TRUE(Refused(server_key.Ask(coordinator_, RegisterServer(layout_, 1, kAttackerAddress, "")),
                      "held by another connection"))
      << "the server key re-binding server 1 to an address of its choosing while server 1 is alive";
  EXPECT_TRUE(Refused(worker_key.Ask(coordinator_, RegisterWorker(layout_, 0, "")), "held by another connection"))
      << "the worker key claiming worker 0, held by the legitimate worker";
  EXPECT_TRUE(Refused(worker_key.Ask(coordinator_, HeartbeatDone(layout_, 0)), "not registered on this connection"))
      << "the worker key declaring worker 0 done (which would end the run)";
  EXPECT_TRUE(Refused(server_key.Ask(coordinator_, RegisterWorker(layout_, -1, "")), "needs the 'worker' key"))
      << "the server key registering as a worker";
  EXPECT_TRUE(Refused(worker_key.Ask(coordinator_, Shutdown(layout_, "")), "needs the 'admin' key"))
      << "the worker key shutting down the coordinator";
  EXPECT_TRUE(Refused(server_key.Ask(coordinator_, Shutdown(layout_, "")), "needs the 'admin' key"))
      << "the server key shutting down the coordinator";
  // Each server: 4 refusals.
  for (int s = 0; s < kServers; ++s) {
    const std::string& server = server_addresses_[static_cast<size_t>(s)];
    // A path inside the run directory: only the role refuses it.
    const std::string path = (run_dir_ / "ckpt" / fmt::format("by-worker-{}.dpt", s)).string();
    EXPECT_TRUE(Refused(worker_key.Ask(server, Checkpoint(layout_, path, "")), "needs the 'admin' key", kUnauthorized))
        << "the worker key asking server " << s << " for a checkpoint";
    EXPECT_TRUE(Refused(worker_key.Ask(server, Shutdown(layout_, "")), "needs the 'admin' key", kUnauthorized))
        << "the worker key shutting down server " << s;
    EXPECT_TRUE(
        Refused(server_key.Ask(server, RegisterWorker(layout_, 0, "")), "needs the 'worker' key", kUnauthorized))
        << "the server key registering with server " << s << " as worker 0";
    EXPECT_TRUE(
        Refused(server_key.Ask(server, GradientPush(layout_, s, 0, 1000.0f)), "needs the 'worker' key", kUnauthorized))
        << "the server key pushing a gradient to server " << s;
    EXPECT_FALSE(fs::exists(path)) << path;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRunUntouched("the worker and server keys overstepped their roles"));
  ASSERT_NO_FATAL_FAILURE(StopAsAdmin());

  // Every key was the cluster's: no connection refused, every message refused and counted.
  for (int s = 0; s < kServers; ++s) {
    const MetricRecord end = End(fmt::format("server-{}.jsonl", s), "server_end");
    EXPECT_EQ(Int(end, "refused_unauthorized"), 4) << "server " << s;
    EXPECT_EQ(Int(end, "refused_outside_run_dir"), 0) << "server " << s;
    EXPECT_EQ(Int(end, "refused_connections"), 0) << "server " << s;
  }
  const MetricRecord end = End("coordinator.jsonl", "coordinator_end");
  EXPECT_EQ(Int(end, "refused_messages"), 7);
  EXPECT_EQ(Int(end, "refused_connections"), 0);
  EXPECT_THAT(Log("coordinator.log"), HasSubstr("refused register from 127.0.0.1 (key worker)"));
}

TEST_F(KeyedRunUnderAttack, TheRightKeysDoWhatTheAttacksTriedAndNoMore) {
  Peer admin(Options(KeyRole::kAdmin));
  const std::string& server0 = server_addresses_[0];
  // Even the admin key cannot have a checkpoint written outside the run directory: 3 refusals.
  fs::create_directory_symlink(outside_, run_dir_ / "escape");
  for (const std::string& path : {(outside_ / "absolute.dpt").string(), std::string("../outside/dotdot.dpt"),
                                  std::string("escape/through-a-symlink.dpt")}) {
    const auto reply = admin.Ask(server0, Checkpoint(layout_, path, ""));
    EXPECT_TRUE(Refused(reply, "outside the run directory", RejectReason::kOutsideRunDir))
        << "the admin key asking for a checkpoint at " << path;
  }
  EXPECT_TRUE(fs::is_empty(outside_)) << "a checkpoint was written outside the run directory";
  // Inside it, the same message writes the checkpoint.
  EXPECT_TRUE(Accepted(admin.Ask(server0, Checkpoint(layout_, "ckpt/by-admin.dpt", "")), MsgType::kAck))
      << "the admin key asking for a checkpoint inside the run directory";
  EXPECT_GT(fs::file_size(run_dir_ / "ckpt" / "by-admin.dpt"), 0u);

  // The worker key registers with server 0 on a connection of its own and pushes the message
  // the other keys were refused: applied to server 0's chunks, nothing else.
  Peer worker_key(Options(KeyRole::kWorker));
  EXPECT_TRUE(Accepted(worker_key.Ask(server0, RegisterWorker(layout_, 1, "")), MsgType::kRegisterReply));
  EXPECT_TRUE(Accepted(worker_key.Ask(server0, GradientPush(layout_, 0, 1, 0.5f)), MsgType::kAck));
  std::vector<float> weights;
  std::vector<int64_t> versions;
  ASSERT_NO_FATAL_FAILURE(Pull(&weights, &versions));
  EXPECT_EQ(weights, AfterGradient(0, 0.5f));
  ASSERT_NO_FATAL_FAILURE(StopAsAdmin());

  EXPECT_EQ(Int(End("server-0.jsonl", "server_end"), "refused_outside_run_dir"), 3);
  EXPECT_EQ(Int(End("server-0.jsonl", "server_end"), "refused_unauthorized"), 0);
  EXPECT_EQ(Int(End("server-1.jsonl", "server_end"), "refused_outside_run_dir"), 0);
  EXPECT_EQ(Int(End("coordinator.jsonl", "coordinator_end"), "refused_messages"), 0);
}

// ---- Without keys ---------------------------------------------------------------------------

TEST_F(UnkeyedRunUnderAttack, StrangersWithoutTheRunSecretAreRefusedEverything) {
  std::string other_secret;  // a well-formed secret, of another run
  ASSERT_TRUE(EnsureRunSecret((dir_ / "other-run").string(), &other_secret).ok());
  ASSERT_NE(other_secret, secret_);
  struct Stranger {
    std::string who, token, why;
  };
  const std::vector<Stranger> strangers = {{"a stranger without the run's secret", "", "no token"},
                                           {"a stranger with another run's secret", other_secret, "wrong token"}};
  for (const Stranger& st : strangers) {
    Peer p(Options(KeyRole::kWorker));  // plaintext: the run has no keys
    // The coordinator: 4 refusals each.
    EXPECT_TRUE(Refused(p.Ask(coordinator_, RegisterServer(layout_, 1, kAttackerAddress, st.token)), st.why))
        << st.who << " registering as server 1 at an address of its choosing";
    EXPECT_TRUE(Refused(p.Ask(coordinator_, RegisterWorker(layout_, -1, st.token)), st.why))
        << st.who << " registering as a worker";
    EXPECT_TRUE(Refused(p.Ask(coordinator_, HeartbeatDone(layout_, 0)), "not registered on this connection"))
        << st.who << " declaring worker 0 done (which would end the run)";
    EXPECT_TRUE(Refused(p.Ask(coordinator_, Shutdown(layout_, st.token)), st.why))
        << st.who << " shutting down the coordinator";
    // Each server: 3 refused for the secret, 1 push refused as not registered.
    for (int s = 0; s < kServers; ++s) {
      const std::string& server = server_addresses_[static_cast<size_t>(s)];
      EXPECT_TRUE(Refused(p.Ask(server, RegisterWorker(layout_, 0, st.token)), st.why, kUnauthorized))
          << st.who << " registering with server " << s << " as worker 0";
      const auto push = p.Ask(server, GradientPush(layout_, s, 0, 1000.0f));
      EXPECT_TRUE(Refused(push, "is not registered", RejectReason::kNotRegistered))
          << st.who << " pushing a gradient to server " << s;
      // A path inside the run directory: only the secret refuses it.
      const std::string path = (run_dir_ / "ckpt" / fmt::format("by-stranger-{}.dpt", s)).string();
      EXPECT_TRUE(Refused(p.Ask(server, Checkpoint(layout_, path, st.token)), st.why, kUnauthorized))
          << st.who << " asking server " << s << " for a checkpoint";
      EXPECT_FALSE(fs::exists(path)) << path;
      EXPECT_TRUE(Refused(p.Ask(server, Shutdown(layout_, st.token)), st.why, kUnauthorized))
          << st.who << " shutting down server " << s;
    }
  }
  for (int s = 0; s < kServers; ++s) {
    const ShardStatsWire st = Stats(s);
    EXPECT_EQ(Rejected(st, RejectReason::kNotRegistered) -
                  Rejected(stats_before_[static_cast<size_t>(s)], RejectReason::kNotRegistered),
              strangers.size())
        << "server " << s;
    EXPECT_EQ(st.pushes_applied, stats_before_[static_cast<size_t>(s)].pushes_applied) << "server " << s;
    EXPECT_EQ(st.checkpoints_written, 0u) << "server " << s;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRunUntouched("two strangers without the run's secret attacked"));
  ASSERT_NO_FATAL_FAILURE(StopAsAdmin());

  for (int s = 0; s < kServers; ++s) {
    const MetricRecord end = End(fmt::format("server-{}.jsonl", s), "server_end");
    EXPECT_EQ(Int(end, "refused_unauthorized"), 3 * static_cast<int64_t>(strangers.size())) << "server " << s;
    EXPECT_EQ(Int(end, "refused_outside_run_dir"), 0) << "server " << s;
    EXPECT_EQ(Int(end, "refused_connections"), 0) << "server " << s << " (no keys: no handshake to refuse)";
  }
  const MetricRecord end = End("coordinator.jsonl", "coordinator_end");
  EXPECT_EQ(Int(end, "refused_messages"), 4 * static_cast<int64_t>(strangers.size()));
  EXPECT_THAT(Log("coordinator.log"), HasSubstr("refused shutdown from 127.0.0.1"));
  // The secret itself never appears in a log.
  for (const char* log : {"coordinator.log", "server-0.log", "server-1.log"}) {
    EXPECT_THAT(Log(log), ::testing::Not(HasSubstr(secret_))) << log;
  }
}

TEST_F(UnkeyedRunUnderAttack, TheRunSecretDoesWhatTheAttacksTriedAndNoMore) {
  Peer admin(Options(KeyRole::kAdmin));
  const std::string& server0 = server_addresses_[0];
  const std::string outside = (outside_ / "absolute.dpt").string();
  const auto reply = admin.Ask(server0, Checkpoint(layout_, outside, secret_));
  EXPECT_TRUE(Refused(reply, "outside the run directory", RejectReason::kOutsideRunDir))
      << "the run's secret asking for a checkpoint at " << outside;
  EXPECT_TRUE(fs::is_empty(outside_)) << "a checkpoint was written outside the run directory";
  const std::string inside = (run_dir_ / "ckpt" / "by-admin.dpt").string();
  EXPECT_TRUE(Accepted(admin.Ask(server0, Checkpoint(layout_, inside, secret_)), MsgType::kAck))
      << "the run's secret asking for a checkpoint inside the run directory";
  EXPECT_GT(fs::file_size(inside), 0u);

  // Registered with the secret, the same push the strangers sent is applied.
  EXPECT_TRUE(Accepted(admin.Ask(server0, RegisterWorker(layout_, 1, secret_)), MsgType::kRegisterReply));
  EXPECT_TRUE(Accepted(admin.Ask(server0, GradientPush(layout_, 0, 1, 0.5f)), MsgType::kAck));
  std::vector<float> weights;
  std::vector<int64_t> versions;
  ASSERT_NO_FATAL_FAILURE(Pull(&weights, &versions));
  EXPECT_EQ(weights, AfterGradient(0, 0.5f));
  ASSERT_NO_FATAL_FAILURE(StopAsAdmin());

  EXPECT_EQ(Int(End("server-0.jsonl", "server_end"), "refused_outside_run_dir"), 1);
  EXPECT_EQ(Int(End("server-0.jsonl", "server_end"), "refused_unauthorized"), 0);
  EXPECT_EQ(Int(End("coordinator.jsonl", "coordinator_end"), "refused_messages"), 0);
}

}  // namespace
}  // namespace downpour
