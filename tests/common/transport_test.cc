// transport_test.cc — the Transport contract, run against both implementations; then what only
// ZeroMQ does: CurveZMQ (keyed clients get through with their role as user id, every other
// client gets no reply and is counted), IPv6 and the source address of outgoing connections,
// and a server no client can stall (a peer that never reads is dropped and counted, its
// queued frames freed, while another peer is served; a slow reader gets its replies in order);
// and ipc:// (Unix domain sockets): the contract suite again ("zmq-ipc"), paths that cannot be
// bound refused naming the path and why, a live server's path never stolen, a dead one's
// reused, the socket file removed on close, CurveZMQ over ipc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/inproc_transport.h"
#include "common/net_address.h"
#include "common/security.h"
#include "common/zmq_transport.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

// A short fresh directory for ipc sockets (ScratchDir's names carry the test's name, which can
// pass the 107 bytes of a socket path), removed by the destructor.
class ShortDir {
 public:
  ShortDir() {
    char tmpl[] = "/tmp/dp-ipc-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    EXPECT_NE(made, nullptr);
    if (made != nullptr) path_ = made;
  }
  ~ShortDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ShortDir(const ShortDir&) = delete;
  ShortDir& operator=(const ShortDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "zmq") {
      transport_ = std::make_unique<ZmqTransport>();
      address_ = "tcp://127.0.0.1:0";
    } else if (GetParam() == "zmq-ipc") {
      transport_ = std::make_unique<ZmqTransport>();
      address_ = IpcUrl(dir_.path() + "/shard0.sock");
    } else {
      transport_ = std::make_unique<InprocTransport>();
      address_ = "shard0";
    }
  }
  ShortDir dir_;  // declared first: removed after the transport and its endpoints are gone
  std::unique_ptr<Transport> transport_;
  std::string address_;
};

std::string AsString(const Frame& f) { return std::string(reinterpret_cast<const char*>(f.data()), f.size()); }

TEST_P(TransportTest, MultipartRoundTripRoutesRepliesToTheRightPeer) {
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport_->Bind(address_, &server).ok());
  std::unique_ptr<ClientEndpoint> a, b;
  ASSERT_TRUE(transport_->Connect(server->address(), &a).ok());
  ASSERT_TRUE(transport_->Connect(server->address(), &b).ok());

  std::vector<float> big(1 << 18);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  Frames fa;
  fa.push_back(Frame::Copy(std::string("hdr-a")));
  fa.push_back(Frame::Borrow(big.data(), big.size() * sizeof(float), std::make_shared<int>(0)));
  ASSERT_TRUE(a->Send(std::move(fa)).ok());
  Frames fb;
  fb.push_back(Frame::Copy(std::string("hdr-b")));
  ASSERT_TRUE(b->Send(std::move(fb)).ok());

  for (int i = 0; i < 2; ++i) {
    PeerId from;
    Frames got;
    Status s = server->Receive(&from, &got, 5000ms);
    ASSERT_TRUE(s.ok()) << "message " << i << ": " << s.ToString();
    const std::string hdr = AsString(got[0]);
    if (hdr == "hdr-a") {
      ASSERT_EQ(got.size(), 2u);
      ASSERT_EQ(got[1].size(), big.size() * sizeof(float));
      std::vector<float> scratch;
      const float* f = AlignedFloats(got[1], &scratch);
      EXPECT_EQ(f[12345], 12345.0f);
    } else {
      EXPECT_EQ(hdr, "hdr-b");
      ASSERT_EQ(got.size(), 1u);
    }
    Frames reply;
    reply.push_back(Frame::Copy("re:" + hdr));
    ASSERT_TRUE(server->Send(from, std::move(reply)).ok());
  }
  Frames ra, rb;
  ASSERT_TRUE(a->Receive(&ra, 5000ms).ok());
  ASSERT_TRUE(b->Receive(&rb, 5000ms).ok());
  EXPECT_EQ(AsString(ra[0]), "re:hdr-a");
  EXPECT_EQ(AsString(rb[0]), "re:hdr-b");
}

TEST_P(TransportTest, ReceiveTimesOut) {
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport_->Bind(address_, &server).ok());
  PeerId from;
  Frames got;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = server->Receive(&from, &got, 50ms);
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 45ms);
}

TEST_P(TransportTest, BorrowedFrameKeepaliveIsReleasedAfterDelivery) {
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport_->Bind(address_, &server).ok());
  std::unique_ptr<ClientEndpoint> c;
  ASSERT_TRUE(transport_->Connect(server->address(), &c).ok());
  std::atomic<bool> released{false};
  std::vector<char> payload(1 << 20, 'x');
  {
    std::shared_ptr<const void> keep(nullptr, [&](const void*) { released = true; });
    Frames f;
    f.push_back(Frame::Copy(std::string("h")));
    f.push_back(Frame::Borrow(payload.data(), payload.size(), keep));
    ASSERT_TRUE(c->Send(std::move(f)).ok());
  }
  PeerId from;
  Frames got;
  ASSERT_TRUE(server->Receive(&from, &got, 5000ms).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(static_cast<char>(got[1].data()[100]), 'x');
  got.clear();
  for (int i = 0; i < 500 && !released; ++i) std::this_thread::sleep_for(2ms);
  EXPECT_TRUE(released.load());
}

TEST_P(TransportTest, ReplyToUnknownPeerFails) {
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport_->Bind(address_, &server).ok());
  Frames f;
  f.push_back(Frame::Copy(std::string("h")));
  EXPECT_FALSE(server->Send("no-such-peer", std::move(f)).ok());
  EXPECT_EQ(server->dropped_peers(), 0u);
}

INSTANTIATE_TEST_SUITE_P(All, TransportTest, ::testing::Values("inproc", "zmq", "zmq-ipc"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param == "zmq-ipc" ? std::string("zmq_ipc") : p.param;
                         });

// ---- ZeroMQ only ---------------------------------------------------------------------------

using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;

Frames Text(const std::string& text) {
  Frames f;
  f.push_back(Frame::Copy(text));
  return f;
}

// A client that gives up at once when its transport ends (nothing it queued is wanted).
ZmqOptions ClientOptions(CurveOptions curve = {}) {
  ZmqOptions o;
  o.linger_ms = 0;
  o.curve = std::move(curve);
  return o;
}

// Sends `text` from a fresh client of `transport` to `server`, answers it, and returns what the
// client got back (empty when nothing arrived within the waits). `info` gets the sender as the
// server saw it.
std::string Exchange(ZmqTransport& transport, ServerEndpoint& server, const std::string& text, PeerInfo* info = nullptr,
                     std::chrono::milliseconds wait = 5000ms) {
  std::unique_ptr<ClientEndpoint> client;
  EXPECT_TRUE(transport.Connect(server.address(), &client).ok());
  EXPECT_TRUE(client->Send(Text(text)).ok());
  PeerId from;
  Frames got;
  PeerInfo seen;
  if (!server.Receive(&from, &got, wait, &seen).ok()) return "";
  if (info != nullptr) *info = seen;
  EXPECT_TRUE(server.Send(from, Text("re:" + AsString(got[0]))).ok());
  Frames reply;
  if (!client->Receive(&reply, wait).ok()) return "";
  return AsString(reply[0]);
}

// A CurveZMQ server (this cluster's endpoint key, server role) on 127.0.0.1, and the key
// directories of this cluster, of another cluster and of a stranger.
class CurveTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto scratch = test::ScratchDir("curve");
    keys_ = (scratch / "keys").string();
    other_ = (scratch / "other").string();
    stranger_ = (scratch / "stranger").string();
    for (const std::string& dir : {keys_, other_, stranger_}) ASSERT_TRUE(MakeClusterKeys(dir).ok()) << dir;
    ZmqOptions o;
    o.curve = Keys(keys_, KeyRole::kServer, /*bind=*/true);
    o.on_refused = [this](const std::string& what) {
      std::lock_guard<std::mutex> lock(mu_);
      refusals_.push_back(what);
    };
    server_transport_ = std::make_unique<ZmqTransport>(o);
    ASSERT_TRUE(server_transport_->Bind("tcp://127.0.0.1:0", &server_).ok());
  }

  static CurveOptions Keys(const std::string& dir, KeyRole role, bool bind = false) {
    CurveOptions curve;
    const Status s = LoadCurveKeys(dir, role, bind, &curve);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return curve;
  }

  // A client that must get nothing: the server receives no message, the client no reply, and
  // the server's refused-connection count grows (and on_refused says why, matching `reason`).
  void ExpectRefused(const CurveOptions& curve, const ::testing::Matcher<std::string>& reason) {
    const uint64_t before = server_transport_->refused_connections();
    ZmqTransport client_transport(ClientOptions(curve));
    EXPECT_EQ(Exchange(client_transport, *server_, "let me in", nullptr, 1500ms), "");
    for (int i = 0; i < 300 && server_transport_->refused_connections() == before; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_GT(server_transport_->refused_connections(), before);
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_THAT(refusals_, Contains(reason));
  }

  std::string keys_, other_, stranger_;
  std::mutex mu_;
  std::vector<std::string> refusals_;  // guarded by mu_
  std::unique_ptr<ZmqTransport> server_transport_;
  std::unique_ptr<ServerEndpoint> server_;  // destroyed before its transport
};

TEST_F(CurveTransportTest, KeyedClientsRoundTripWithTheirRoleAsUserId) {
  for (KeyRole role : {KeyRole::kWorker, KeyRole::kServer, KeyRole::kAdmin}) {
    ZmqTransport client_transport(ClientOptions(Keys(keys_, role)));
    PeerInfo info;
    EXPECT_EQ(Exchange(client_transport, *server_, "hello", &info), "re:hello") << KeyRoleName(role);
    EXPECT_EQ(info.user_id, KeyRoleName(role));
    EXPECT_EQ(info.address, "127.0.0.1");
  }
  EXPECT_EQ(server_transport_->refused_connections(), 0u);
}

TEST_F(CurveTransportTest, PlaintextClientGetsNothingAndIsCounted) {
  // Which side notices the mismatch first is a race: the server sees either the mismatch or
  // the plaintext client hanging up on it.
  ExpectRefused(CurveOptions{}, AnyOf(HasSubstr("security mechanism mismatch"), HasSubstr("a peer that closed")));
}

TEST_F(CurveTransportTest, ClientWithAKeyOutsideTheClusterGetsNothingAndIsCounted) {
  CurveOptions curve = Keys(keys_, KeyRole::kWorker);  // the right endpoint key ...
  const CurveOptions random = Keys(stranger_, KeyRole::kWorker);
  curve.client_public = random.client_public;  // ... but a keypair this cluster never made
  curve.client_secret = random.client_secret;
  ExpectRefused(curve, HasSubstr("is not one of this cluster's keys"));
}

TEST_F(CurveTransportTest, ValidKeysOfAnotherClusterGetNothingAndAreCounted) {
  ExpectRefused(Keys(other_, KeyRole::kWorker), HasSubstr("cryptographic error"));
}

TEST_F(CurveTransportTest, ClientExpectingAnotherEndpointKeyGetsNothingAndIsCounted) {
  CurveOptions curve = Keys(keys_, KeyRole::kWorker);                  // a key the server would accept ...
  curve.server_public = Keys(other_, KeyRole::kWorker).server_public;  // ... sent to the wrong server
  ExpectRefused(curve, HasSubstr("cryptographic error"));
}

TEST_F(CurveTransportTest, ARetryingRefusedClientIsCountedAtItsReconnectRate) {
  // A refused ZeroMQ client reconnects every 100 ms (ZMQ_RECONNECT_IVL): it is counted per
  // attempt, never in a tight loop.
  CurveOptions curve = Keys(keys_, KeyRole::kWorker);
  const CurveOptions random = Keys(stranger_, KeyRole::kWorker);
  curve.client_public = random.client_public;
  curve.client_secret = random.client_secret;
  ZmqTransport client_transport(ClientOptions(curve));
  std::unique_ptr<ClientEndpoint> client;
  ASSERT_TRUE(client_transport.Connect(server_->address(), &client).ok());
  ASSERT_TRUE(client->Send(Text("let me in")).ok());
  std::this_thread::sleep_for(1500ms);
  const uint64_t refused = server_transport_->refused_connections();
  EXPECT_GE(refused, 1u);
  EXPECT_LE(refused, 30u);  // ~15 at the reconnect interval; a tight loop would be thousands
  PeerId from;
  Frames got;
  EXPECT_EQ(server_->Receive(&from, &got, 10ms).code(), StatusCode::kTimeout);
}

TEST_F(CurveTransportTest, BindWithoutTheEndpointSecretFails) {
  ZmqTransport t(ClientOptions(Keys(keys_, KeyRole::kWorker, /*bind=*/false)));
  std::unique_ptr<ServerEndpoint> s;
  const Status status = t.Bind("tcp://127.0.0.1:0", &s);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no endpoint secret key"));
}

TEST(ZmqAddresses, Ipv6LoopbackRoundTrip) {
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind("tcp://[::1]:0", &server);
  if (!s.ok()) GTEST_SKIP() << "no IPv6 loopback on this machine: " << s.ToString();
  EXPECT_THAT(server->address(), HasSubstr("tcp://[::1]:"));
  PeerInfo info;
  EXPECT_EQ(Exchange(transport, *server, "v6", &info), "re:v6");
  EXPECT_EQ(info.address, "::1");
}

TEST(ZmqAddresses, Ipv6OffRefusesAnIpv6Address) {
  ZmqOptions o = ClientOptions();
  o.ipv6 = false;
  ZmqTransport transport(o);
  std::unique_ptr<ServerEndpoint> server;
  EXPECT_FALSE(transport.Bind("tcp://[::1]:0", &server).ok());
}

TEST(ZmqAddresses, HostNameStillMeansIpv4WithIpv6On) {
  // "localhost" resolves to 127.0.0.1 as before, even where /etc/hosts lists ::1 first, so a
  // server bound to 127.0.0.1 is still reached by name.
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport.Bind("tcp://127.0.0.1:0", &server).ok());
  const std::string port = server->address().substr(server->address().rfind(':') + 1);
  std::unique_ptr<ClientEndpoint> client;
  ASSERT_TRUE(transport.Connect("tcp://localhost:" + port, &client).ok());
  ASSERT_TRUE(client->Send(Text("by name")).ok());
  PeerId from;
  Frames got;
  PeerInfo info;
  ASSERT_TRUE(server->Receive(&from, &got, 5000ms, &info).ok());
  EXPECT_EQ(info.address, "127.0.0.1");
}

TEST(ZmqAddresses, ConnectSourceIsThePeerAddressTheServerSees) {
  ZmqTransport server_transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(server_transport.Bind("tcp://127.0.0.1:0", &server).ok());
  ZmqOptions o = ClientOptions();
  o.connect_source = "127.0.0.5";
  ZmqTransport client_transport(o);
  PeerInfo info;
  EXPECT_EQ(Exchange(client_transport, *server, "from .5", &info), "re:from .5");
  EXPECT_EQ(info.address, "127.0.0.5");
}

// ---- ipc:// --------------------------------------------------------------------------------

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(ZmqIpc, RoundTripWithTheIpcAddressAndIpcAsThePeerAddress) {
  ShortDir dir;
  const std::string path = dir.path() + "/server-0.sock";
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport.Bind(IpcUrl(path), &server).ok());
  EXPECT_EQ(server->address(), "ipc://" + path);
  EXPECT_TRUE(Exists(path));
  PeerInfo info;
  EXPECT_EQ(Exchange(transport, *server, "over ipc", &info), "re:over ipc");
  EXPECT_EQ(info.address, "ipc");  // not libzmq's ":uid:gid:pid"
}

TEST(ZmqIpc, SocketFileIsRemovedWhenTheEndpointCloses) {
  ShortDir dir;
  const std::string path = dir.path() + "/gone.sock";
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport.Bind(IpcUrl(path), &server).ok());
  ASSERT_TRUE(Exists(path));
  server.reset();
  EXPECT_FALSE(Exists(path)) << path << " left behind after its endpoint closed";
  // And the path binds again at once, in the same transport.
  ASSERT_TRUE(transport.Bind(IpcUrl(path), &server).ok());
  EXPECT_EQ(Exchange(transport, *server, "again"), "re:again");
}

TEST(ZmqIpc, MissingDirectoryIsRefusedNamingThePathAndTheDirectory) {
  // Root can write anywhere permissions allow, so the tests use directories nobody can create
  // files in: one that does not exist, and /proc (a pseudo file system).
  ShortDir dir;
  const std::string path = dir.path() + "/no/such/dir/s.sock";
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind(IpcUrl(path), &server);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ipc path " + path));
  EXPECT_THAT(s.message(), HasSubstr("directory " + dir.path() + "/no/such/dir is not writable"));
}

TEST(ZmqIpc, DirectoryThatTakesNoFilesIsRefusedEvenForRoot) {
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind("ipc:///proc/self/downpour.sock", &server);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ipc path /proc/self/downpour.sock: directory /proc/self is not writable"));
  EXPECT_EQ(server, nullptr);
}

TEST(ZmqIpc, PathLongerThanSunPathIsRefusedNamingItsLength) {
  ShortDir dir;
  const std::string path = dir.path() + "/" + std::string(kIpcPathMax + 1 - dir.path().size(), 'x') + ".sock";
  ASSERT_GT(path.size(), kIpcPathMax);
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind(IpcUrl(path), &server);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ipc path " + path));
  EXPECT_THAT(s.message(), HasSubstr(fmt::format("{} bytes, longer than the 107", path.size())));
  // The longest path that fits binds.
  const std::string fits = dir.path() + "/" + std::string(kIpcPathMax - dir.path().size() - 1, 'y');
  ASSERT_EQ(fits.size(), kIpcPathMax);
  EXPECT_TRUE(transport.Bind(IpcUrl(fits), &server).ok());
}

TEST(ZmqIpc, ALiveServersPathIsNotStolen) {
  ShortDir dir;
  const std::string path = dir.path() + "/live.sock";
  ZmqTransport first(ClientOptions());
  std::unique_ptr<ServerEndpoint> live;
  ASSERT_TRUE(first.Bind(IpcUrl(path), &live).ok());
  ZmqTransport second(ClientOptions());
  std::unique_ptr<ServerEndpoint> thief;
  const Status s = second.Bind(IpcUrl(path), &thief);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("a live process listens there"));
  // The first server still gets its clients.
  EXPECT_EQ(Exchange(second, *live, "still yours"), "re:still yours");
}

TEST(ZmqIpc, AStaleSocketFileOfADeadProcessIsReplaced) {
  ShortDir dir;
  const std::string path = dir.path() + "/stale.sock";
  // A process that binds and dies without closing (SIGKILL leaves the file behind).
  test::Child dead([&] {
    ZmqTransport t;
    std::unique_ptr<ServerEndpoint> s;
    if (!t.Bind(IpcUrl(path), &s).ok()) return 3;
    ::raise(SIGKILL);
    return 0;
  });
  EXPECT_EQ(dead.WaitExit(10s), 128 + SIGKILL);
  ASSERT_TRUE(Exists(path)) << "the killed process left no socket file";
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind(IpcUrl(path), &server);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Exchange(transport, *server, "fresh"), "re:fresh");
}

TEST(ZmqIpc, AFileThatIsNotASocketIsNotDeleted) {
  ShortDir dir;
  const std::string path = dir.path() + "/data.bin";
  test::WriteFile(path, "precious");
  ZmqTransport transport(ClientOptions());
  std::unique_ptr<ServerEndpoint> server;
  const Status s = transport.Bind(IpcUrl(path), &server);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exists and is not a socket"));
  EXPECT_EQ(test::ReadFile(path), "precious");
}

TEST(ZmqIpc, CurveZmqWorksOverIpc) {
  const auto scratch = test::ScratchDir("curve_ipc");
  const std::string keys = (scratch / "keys").string();
  ASSERT_TRUE(MakeClusterKeys(keys).ok());
  auto load = [&](KeyRole role, bool bind) {
    CurveOptions curve;
    EXPECT_TRUE(LoadCurveKeys(keys, role, bind, &curve).ok());
    return curve;
  };
  ShortDir dir;
  ZmqOptions o = ClientOptions(load(KeyRole::kServer, true));
  ZmqTransport server_transport(o);
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(server_transport.Bind(IpcUrl(dir.path() + "/curve.sock"), &server).ok());
  ZmqTransport worker(ClientOptions(load(KeyRole::kWorker, false)));
  PeerInfo info;
  EXPECT_EQ(Exchange(worker, *server, "keyed", &info), "re:keyed");
  EXPECT_EQ(info.user_id, "worker");
  EXPECT_EQ(info.address, "ipc");
  // A plaintext client gets nothing and is counted, as over tcp.
  ZmqTransport plain(ClientOptions());
  EXPECT_EQ(Exchange(plain, *server, "let me in", nullptr, 1500ms), "");
  for (int i = 0; i < 300 && server_transport.refused_connections() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GT(server_transport.refused_connections(), 0u);
  server.reset();
  std::filesystem::remove_all(scratch);
}

// ---- A server no client can stall ------------------------------------------------------------

// Frames whose keepalives count how many are still held (by the transport or its queues).
struct LiveCounter {
  std::atomic<int> live{0};
  std::vector<char> bytes = std::vector<char>(256 << 10, 'r');
  Frames Reply(uint32_t seq) {
    ++live;
    std::shared_ptr<const void> keep(nullptr, [this](const void*) { --live; });
    Frames f;
    f.push_back(Frame::Copy(&seq, sizeof(seq)));
    f.push_back(Frame::Borrow(bytes.data(), bytes.size(), std::move(keep)));
    return f;
  }
};

ZmqOptions SlowPeerServerOptions(size_t queue_bytes) {
  ZmqOptions o = ClientOptions();
  o.peer_queue_bytes = queue_bytes;
  o.server_sndhwm = 4;
  return o;
}

// The server's identity for `client`: it sends one message and the server receives it.
PeerId Hello(ClientEndpoint* client, ServerEndpoint* server, const std::string& text) {
  EXPECT_TRUE(client->Send(Text(text)).ok());
  PeerId from;
  Frames got;
  EXPECT_TRUE(server->Receive(&from, &got, 5000ms).ok());
  EXPECT_EQ(AsString(got.at(0)), text);
  return from;
}

TEST(ZmqSlowPeer, APeerThatNeverReadsIsDroppedAndCountedWhileAnotherPeerIsServed) {
  ZmqTransport transport(SlowPeerServerOptions(size_t{4} << 20));
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport.Bind("tcp://127.0.0.1:0", &server).ok());
  ZmqTransport client_transport(ClientOptions());
  // The peer that never reads also takes almost nothing off the network on its own (a ZeroMQ
  // client would otherwise buffer up to 1000 replies for its application), so the server meets
  // its full connection at once instead of whenever that client's I/O thread falls behind.
  ZmqOptions slow_options = ClientOptions();
  slow_options.client_rcvhwm = 2;
  ZmqTransport slow_transport(slow_options);
  std::unique_ptr<ClientEndpoint> slow, good;
  ASSERT_TRUE(slow_transport.Connect(server->address(), &slow).ok());
  ASSERT_TRUE(client_transport.Connect(server->address(), &good).ok());
  const PeerId slow_id = Hello(slow.get(), server.get(), "slow");
  const PeerId good_id = Hello(good.get(), server.get(), "good");

  LiveCounter counter;
  // 256 KiB replies to the peer that never reads, at most 400 (100 MiB), until it is dropped;
  // after each, the good peer is answered too. No send may block.
  auto slowest_send = std::chrono::nanoseconds(0);
  int sent = 0;
  Status last;
  for (; sent < 400; ++sent) {
    const auto t0 = std::chrono::steady_clock::now();
    last = server->Send(slow_id, counter.Reply(static_cast<uint32_t>(sent)));
    slowest_send = std::max(slowest_send, std::chrono::steady_clock::now() - t0);
    if (!last.ok()) break;
    ASSERT_TRUE(server->Send(good_id, Text("fine " + std::to_string(sent))).ok());
    Frames got;
    ASSERT_TRUE(good->Receive(&got, 5000ms).ok()) << "reply " << sent;
    EXPECT_EQ(AsString(got.at(0)), "fine " + std::to_string(sent));
  }
  ASSERT_LT(sent, 400) << "the peer was never dropped";
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last.ToString();
  EXPECT_THAT(last.message(), HasSubstr("dropped"));
  EXPECT_EQ(server->dropped_peers(), 1u);
  EXPECT_LT(slowest_send, 100ms) << "a send waited for the peer that does not read";
  // Its queue (4 MiB = 16 replies) is freed at once; only what ZeroMQ already took (its high-water
  // mark and a message being written) is still held, until the peer disconnects.
  EXPECT_GE(sent, 16);
  EXPECT_LE(counter.live.load(), 2 * 4 + 2) << "the dropped peer's queued frames were not released";
  // Later sends to it fail, its later messages are not delivered, the good peer goes on.
  EXPECT_EQ(server->Send(slow_id, Text("more")).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(slow->Send(Text("ignored")).ok());
  ASSERT_TRUE(good->Send(Text("still here")).ok());
  PeerId from;
  Frames got;
  ASSERT_TRUE(server->Receive(&from, &got, 5000ms).ok());
  EXPECT_EQ(from, good_id);
  EXPECT_EQ(AsString(got.at(0)), "still here");
  EXPECT_EQ(server->Receive(&from, &got, 100ms).code(), StatusCode::kTimeout);
  EXPECT_EQ(server->dropped_peers(), 1u);
  // Once the peer disconnects, ZeroMQ lets go of the rest.
  slow.reset();
  for (int i = 0; i < 500 && counter.live.load() > 0; ++i) {
    (void)server->Receive(&from, &got, 10ms);
  }
  EXPECT_EQ(counter.live.load(), 0);
}

TEST(ZmqSlowPeer, QueuedRepliesAreDeliveredInOrderWhenTheSlowPeerStartsReading) {
  ZmqTransport transport(SlowPeerServerOptions(size_t{64} << 20));
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(transport.Bind("tcp://127.0.0.1:0", &server).ok());
  ZmqTransport client_transport(ClientOptions());
  std::unique_ptr<ClientEndpoint> client;
  ASSERT_TRUE(client_transport.Connect(server->address(), &client).ok());
  const PeerId id = Hello(client.get(), server.get(), "late reader");
  LiveCounter counter;
  // 120 replies (30 MiB, more than the kernel and ZeroMQ hold for a peer) while it reads nothing:
  // every send returns at once, most replies wait in the server's queue.
  constexpr uint32_t kReplies = 120;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < kReplies; ++i) ASSERT_TRUE(server->Send(id, counter.Reply(i)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_GT(counter.live.load(), 2 * 4 + 2) << "nothing was queued: the test proves nothing";
  // The peer starts reading; the server's Receive calls (its loop) flush the queue.
  std::atomic<bool> done{false};
  std::thread loop([&] {
    PeerId from;
    Frames got;
    while (!done.load()) (void)server->Receive(&from, &got, 20ms);
  });
  uint32_t expected = 0;
  for (; expected < kReplies; ++expected) {
    Frames got;
    if (!client->Receive(&got, 5000ms).ok()) break;
    uint32_t seq = 0;
    ASSERT_EQ(got.at(0).size(), sizeof(seq));
    std::memcpy(&seq, got[0].data(), sizeof(seq));
    ASSERT_EQ(seq, expected) << "replies out of order";
    ASSERT_EQ(got.at(1).size(), counter.bytes.size());
  }
  done.store(true);
  loop.join();
  EXPECT_EQ(expected, kReplies);
  EXPECT_EQ(server->dropped_peers(), 0u);
}

// A server endpoint's dropped peers: remembered up to the bound (the oldest forgotten first),
// every drop counted; and the helpers both server endpoints share.
TEST(DroppedPeers, RemembersTheLatestAndCountsEveryDrop) {
  DroppedPeers d;
  for (size_t i = 0; i <= DroppedPeers::kRemember; ++i) EXPECT_EQ(d.Add("p" + std::to_string(i)), i + 1);
  EXPECT_FALSE(d.Contains("p0"));  // one past the bound: the oldest is forgotten
  EXPECT_TRUE(d.Contains("p1"));
  EXPECT_TRUE(d.Contains("p" + std::to_string(DroppedPeers::kRemember)));
  EXPECT_EQ(d.count(), DroppedPeers::kRemember + 1);
  EXPECT_EQ(PeerHex(std::string("\x01\xab", 2)), "01ab");
  Frames f;
  f.push_back(Frame::Copy("abc"));
  f.push_back(Frame::Copy(std::string(10, 'x')));
  EXPECT_EQ(MessageBytes(f), 13u);
}

}  // namespace
}  // namespace downpour
