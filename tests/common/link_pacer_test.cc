// link_pacer_test.cc — the emulated link (cluster.link_gbps): LinkPacer's virtual finish times
// on a fake clock; then real ZmqTransports on 127.0.0.1 behind EmulatedLinkTransports
// (common/emulated_link.h) whose measured rate, over ~0.5 s of
// 4 MiB frames, holds the set rate within 10% (client -> server and server -> client: the
// endpoint queues what is not due and releases it when due, its Send never waiting); a client
// sending and receiving at once takes the longer of the two, not the sum (full duplex); a server
// whose link is busy for a second still receives and answers a second peer at once (its loop
// never waits for the link); the byte counters (traffic()) count every frame on both sides; a
// server that orders replies by key (cluster.reply_order = "step") hands one client's replies to
// the link before another's; and the run config's cluster.link_gbps reaches a process's
// ProcessNet and turns shared memory off.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/emulated_link.h"
#include "common/inproc_transport.h"
#include "common/process_net.h"
#include "common/rate_limiter.h"
#include "common/zmq_transport.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr size_t kFrameBytes = size_t{4} << 20;  // a layout chunk (1M floats)
constexpr double kTolerance = 0.10;               // the bound on the held rate

// ---- LinkPacer on a fake clock ---------------------------------------------------------------

TEST(LinkPacer, BackToBackReservationsAreSpacedByTheirBytesAtTheRate) {
  LinkPacer pacer(1.0, Clock::duration::zero());  // 1 Gbit/s = 125 bytes per microsecond
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  EXPECT_EQ(pacer.ReserveAt(125000, t0), t0 + 1ms);
  EXPECT_EQ(pacer.ReserveAt(125000, t0), t0 + 2ms);        // behind the first
  EXPECT_EQ(pacer.ReserveAt(250000, t0 + 1ms), t0 + 4ms);  // still behind, not from "now"
  EXPECT_EQ(pacer.Duration(size_t{125} << 20), std::chrono::nanoseconds(1048576000));
}

TEST(LinkPacer, AnIdleLinkSavesAtMostTheBurst) {
  LinkPacer pacer(8.0, 100us);  // 1 byte per ns, a bucket of 100 us
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  EXPECT_EQ(pacer.ReserveAt(1000, t0), t0 - 100us + 1us);  // the bucket starts full
  // Idle for a second: 100 us of credit, no more; then back-to-back at the rate.
  EXPECT_EQ(pacer.ReserveAt(1000000, t0 + 1s), t0 + 1s - 100us + 1ms);
  EXPECT_EQ(pacer.ReserveAt(1000000, t0 + 1s), t0 + 1s - 100us + 2ms);
  // A sender that comes back 50 us after its finish time loses nothing (within the burst).
  EXPECT_EQ(pacer.ReserveAt(1000000, t0 + 1s + 2ms - 50us), t0 + 1s - 100us + 3ms);
}

TEST(LinkPacer, ThreadsShareOneLink) {
  LinkPacer pacer(8.0, Clock::duration::zero());
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) pacer.ReserveAt(1000, t0);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pacer.ReserveAt(0, t0), t0 + 4ms);  // 4000 messages of 1 us each, none lost
}

// ---- real sockets ----------------------------------------------------------------------------

// One side of a loopback pair: its emulated link (0 = none) and whether its replies take the
// link by order key.
struct Side {
  double gbps = 0;
  bool ordered = false;
};
Side Options(double gbps) { return Side{gbps, false}; }

ZmqOptions Plain() {
  ZmqOptions o;
  o.linger_ms = 0;
  return o;
}

// `zmq` behind an emulated link as `side` says; null without one.
std::unique_ptr<EmulatedLinkTransport> LinkOf(ZmqTransport* zmq, const Side& side) {
  if (side.gbps <= 0) return nullptr;
  EmulatedLinkOptions o;
  o.gbps = side.gbps;
  o.order_by_key = side.ordered;
  o.linger_ms = 0;
  return std::make_unique<EmulatedLinkTransport>(zmq, o);
}

Frames Small(const std::string& text) {
  Frames f;
  f.push_back(Frame::Copy(text));
  return f;
}

// A header frame and one 4 MiB payload borrowed from `payload` (kept alive by it).
Frames Big(const std::shared_ptr<std::vector<char>>& payload) {
  Frames f;
  f.push_back(Frame::Copy("chunk"));
  f.push_back(Frame::Borrow(payload->data(), payload->size(), payload));
  return f;
}

size_t BigBytes() { return std::strlen("chunk") + kFrameBytes; }

// Frames that take about `seconds` on a link of `gbps`.
int FramesFor(double gbps, double seconds) {
  return static_cast<int>(gbps * 1e9 / 8 * seconds / static_cast<double>(BigBytes()) + 0.5);
}

double Gbps(size_t bytes, Clock::duration d) {
  return static_cast<double>(bytes) * 8 / std::chrono::duration<double>(d).count() / 1e9;
}

// A server transport bound on 127.0.0.1 and a client transport, each behind its own emulated
// link (common/emulated_link.h) when its side has one; Connect() opens one more client endpoint
// to the server (nullptr if the bind failed). The byte counters are ZeroMQ's, under the links.
struct Loopback {
  Loopback(const Side& server_side, const Side& client_side)
      : server_transport(Plain()),
        client_transport(Plain()),
        server_link(LinkOf(&server_transport, server_side)),
        client_link(LinkOf(&client_transport, client_side)) {
    Transport* t = server_link ? static_cast<Transport*>(server_link.get()) : &server_transport;
    EXPECT_TRUE(t->Bind("tcp://127.0.0.1:0", &server).ok());
  }
  ~Loopback() { server.reset(); }  // before the link and the transport it came from
  std::unique_ptr<ClientEndpoint> Connect() {
    std::unique_ptr<ClientEndpoint> c;
    Transport* t = client_link ? static_cast<Transport*>(client_link.get()) : &client_transport;
    if (server != nullptr) {
      EXPECT_TRUE(t->Connect(server->address(), &c).ok());
    }
    return c;
  }
  ZmqTransport server_transport, client_transport;
  std::unique_ptr<EmulatedLinkTransport> server_link, client_link;
  std::unique_ptr<ServerEndpoint> server;
};

class LinkRate : public ::testing::TestWithParam<double> {};

// Calls `send` and records how long it took.
class SendTimer {
 public:
  Status operator()(const std::function<Status()>& send) {
    const auto t = Clock::now();
    Status s = send();
    longest_ = std::max(longest_, Clock::now() - t);
    return s;
  }
  Clock::duration longest() const { return longest_; }

 private:
  Clock::duration longest_{0};
};

// The client's link: Send queues, the client's Receive calls release frames when due (as the PS
// client's I/O loop does); the server reads freely.
TEST_P(LinkRate, ClientSendsHoldTheSetRate) {
  const double gbps = GetParam();
  Loopback net(Options(0), Options(gbps));
  std::unique_ptr<ClientEndpoint> client = net.Connect();
  ASSERT_NE(client, nullptr);
  ServerEndpoint* server = net.server.get();
  // Connect first, off the clock: a small message is charged but not held back.
  ASSERT_TRUE(client->Send(Small("hello")).ok());
  PeerId from;
  Frames got;
  ASSERT_TRUE(server->Receive(&from, &got, 5000ms).ok());

  const int n = FramesFor(gbps, 0.5);
  auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'x');
  const auto start = Clock::now();
  std::atomic<bool> stop{false};
  SendTimer timed;
  std::thread sender([&] {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(timed([&] { return client->Send(Big(payload)); }).ok());
    Frames none;
    while (!stop) EXPECT_EQ(client->Receive(&none, 5ms).code(), StatusCode::kTimeout);  // drains the queue
  });
  size_t received = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(server->Receive(&from, &got, 10000ms).ok()) << "frame " << i;
    ASSERT_EQ(got.size(), 2u);
    received += got[0].size() + got[1].size();
  }
  const auto elapsed = Clock::now() - start;
  stop = true;
  sender.join();
  EXPECT_EQ(received, n * BigBytes());
  const double measured = Gbps(received, elapsed);
  std::printf("set %.1f Gbit/s, measured %.3f Gbit/s (%d frames of 4 MiB)\n", gbps, measured, n);
  EXPECT_NEAR(measured, gbps, kTolerance * gbps) << n << " frames of 4 MiB in "
                                                  << std::chrono::duration<double>(elapsed).count() << " s";
  EXPECT_LT(timed.longest(), 5ms) << "a paced client Send must queue, not wait for the link";
  // Every frame counted, on both sides (the hello too).
  EXPECT_EQ(net.client_transport.traffic().sent_bytes, received + 5);
  EXPECT_EQ(net.client_transport.traffic().sent_messages, static_cast<uint64_t>(n) + 1);
  EXPECT_EQ(net.server_transport.traffic().received_bytes, received + 5);
  EXPECT_EQ(net.server_transport.traffic().received_messages, static_cast<uint64_t>(n) + 1);
  EXPECT_EQ(net.server_transport.traffic().sent_bytes, 0u);
}

// A server loop that answers each "pull N" with N replies of 4 MiB and "ping" with "pong",
// until stopped. It never sleeps: paced replies wait in the transport's queue.
class ReplyLoop {
 public:
  explicit ReplyLoop(ServerEndpoint* server) : server_(server) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ReplyLoop() {
    stop_ = true;
    thread_.join();
  }
  // Longest the loop spent in one Send (it must never wait for the link).
  Clock::duration longest_send() const { return Clock::duration(longest_send_ns_.load()); }

 private:
  void Run() {
    auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'y');
    while (!stop_) {
      PeerId from;
      Frames got;
      if (!server_->Receive(&from, &got, 20ms).ok()) continue;
      const std::string text(reinterpret_cast<const char*>(got[0].data()), got[0].size());
      const int n = text.rfind("pull ", 0) == 0 ? std::stoi(text.substr(5)) : 0;
      for (int i = 0; i < n; ++i) Timed([&] { return server_->Send(from, Big(payload)); });
      if (text == "ping") Timed([&] { return server_->Send(from, Small("pong")); });
    }
  }
  template <typename F>
  void Timed(F send) {
    const auto t = Clock::now();
    EXPECT_TRUE(send().ok());
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
    if (ns > longest_send_ns_) longest_send_ns_ = ns;
  }

  ServerEndpoint* server_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> longest_send_ns_{0};
  std::thread thread_;
};

// The server's link: replies queue in the transport and leave when due.
TEST_P(LinkRate, ServerRepliesHoldTheSetRateWithoutBlockingTheLoop) {
  const double gbps = GetParam();
  Loopback net(Options(gbps), Options(0));
  std::unique_ptr<ClientEndpoint> client = net.Connect();
  ASSERT_NE(client, nullptr);
  ReplyLoop loop(net.server.get());
  Frames got;
  ASSERT_TRUE(client->Send(Small("ping")).ok());
  ASSERT_TRUE(client->Receive(&got, 5000ms).ok());  // connected

  const int n = FramesFor(gbps, 0.5);
  const auto start = Clock::now();
  ASSERT_TRUE(client->Send(Small("pull " + std::to_string(n))).ok());
  size_t received = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(client->Receive(&got, 10000ms).ok()) << "reply " << i;
    ASSERT_EQ(got.size(), 2u);
    received += got[0].size() + got[1].size();
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(received, n * BigBytes());
  const double measured = Gbps(received, elapsed);
  std::printf("set %.1f Gbit/s, measured %.3f Gbit/s (%d frames of 4 MiB)\n", gbps, measured, n);
  EXPECT_NEAR(measured, gbps, kTolerance * gbps) << n << " replies of 4 MiB in "
                                                  << std::chrono::duration<double>(elapsed).count() << " s";
  EXPECT_LT(loop.longest_send(), 5ms) << "a paced Send must queue, not wait for the link";
  // The loop thread counts a reply once ZeroMQ took it, which may be just after it arrived here.
  for (int i = 0; i < 100 && net.server_transport.traffic().sent_bytes < received + 4; ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(net.server_transport.traffic().sent_bytes, received + 4);  // + "pong"
  EXPECT_EQ(net.client_transport.traffic().received_bytes, received + 4);
}

// A client that sends one link-second's worth while the server sends it as much back takes about
// one link-second, not two: its replies are read while its own frames wait for their due time.
TEST(LinkDuplex, SendingAndReceivingAtOnceTakeTheLongerNotTheSum) {
  const double gbps = 2.0;
  Loopback net(Options(gbps), Options(gbps));
  std::unique_ptr<ClientEndpoint> client = net.Connect();
  ASSERT_NE(client, nullptr);
  ReplyLoop loop(net.server.get());  // answers "pull N" with N frames; ignores the big ones
  Frames got;
  ASSERT_TRUE(client->Send(Small("ping")).ok());
  ASSERT_TRUE(client->Receive(&got, 5000ms).ok());

  const int n = FramesFor(gbps, 0.5);  // 0.5 s each way
  auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'z');
  const auto start = Clock::now();
  const std::string pull = "pull " + std::to_string(n);
  ASSERT_TRUE(client->Send(Small(pull)).ok());
  for (int i = 0; i < n; ++i) ASSERT_TRUE(client->Send(Big(payload)).ok());
  int replies = 0;
  while (replies < n) {
    ASSERT_TRUE(client->Receive(&got, 10000ms).ok()) << "reply " << replies;
    ++replies;
  }
  const auto received_all = Clock::now() - start;
  // The client's own frames are released by its Receive calls too; wait for the last to leave.
  while (net.client_transport.traffic().sent_bytes < 4 + pull.size() + static_cast<uint64_t>(n) * BigBytes()) {
    EXPECT_EQ(client->Receive(&got, 5ms).code(), StatusCode::kTimeout);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("duplex at %.1f Gbit/s: 0.5 s each way took %.3f s (replies in %.3f s)\n", gbps, seconds,
              std::chrono::duration<double>(received_all).count());
  EXPECT_LT(seconds, 0.5 * 1.25) << "sending and receiving were serialised";
  EXPECT_GT(seconds, 0.5 * 0.9);
}

INSTANTIATE_TEST_SUITE_P(Gbps, LinkRate, ::testing::Values(1.0, 4.0),
                         [](const auto& info) { return std::to_string(static_cast<int>(info.param)) + "Gbps"; });

// One peer fills the server's link for about a second; a second peer's ping is still received
// and answered at once (a small reply is charged to the link, not held behind the queue).
TEST(LinkNoStall, AServerUnderALimitAnswersASecondPeerAtOnce) {
  Loopback net(Options(1.0), Options(0));
  std::unique_ptr<ClientEndpoint> bulk = net.Connect(), other = net.Connect();
  ASSERT_NE(bulk, nullptr);
  ASSERT_NE(other, nullptr);
  ReplyLoop loop(net.server.get());
  Frames got;
  for (ClientEndpoint* c : {bulk.get(), other.get()}) {
    ASSERT_TRUE(c->Send(Small("ping")).ok());
    ASSERT_TRUE(c->Receive(&got, 5000ms).ok());
  }
  const int n = FramesFor(1.0, 1.0);  // ~1 s of the link
  ASSERT_TRUE(bulk->Send(Small("pull " + std::to_string(n))).ok());
  std::this_thread::sleep_for(100ms);  // the bulk replies are queued and leaving
  const auto t = Clock::now();
  ASSERT_TRUE(other->Send(Small("ping")).ok());
  ASSERT_TRUE(other->Receive(&got, 5000ms).ok());
  const auto round_trip = Clock::now() - t;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got[0].data()), got[0].size()), "pong");
  EXPECT_LT(round_trip, 100ms) << "the second peer waited for the first one's link";
  // The bulk peer is still being served at the link's pace, and gets everything.
  int bulk_got = 0;
  while (bulk_got < n && bulk->Receive(&got, 5000ms).ok()) ++bulk_got;
  EXPECT_EQ(bulk_got, n);
}

// A loop that queues three paced replies (4 MiB each, ~34 ms apiece at 1 Gbit/s) and then works
// for 300 ms without calling Receive: with ReleaseDue between its pieces of work the replies leave
// when due, as a kernel would send them; without it they wait for the loop's next Receive.
Clock::duration LastReplyAfterLongWork(bool release_between_pieces) {
  Loopback net(Options(1.0), Options(0));
  std::unique_ptr<ClientEndpoint> client = net.Connect();
  if (client == nullptr) return Clock::duration::zero();  // the failed bind or connect is reported
  ServerEndpoint* server = net.server.get();
  EXPECT_TRUE(client->Send(Small("pull 3")).ok());
  PeerId from;
  Frames got;
  EXPECT_TRUE(server->Receive(&from, &got, 5000ms).ok());
  const auto t0 = Clock::now();
  auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'y');
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(server->Send(from, Big(payload)).ok());
  std::atomic<int64_t> last_ns{-1};
  std::thread reader([&] {
    Frames reply;
    for (int i = 0; i < 3; ++i) {
      if (!client->Receive(&reply, 5000ms).ok()) return;
    }
    last_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  });
  for (int piece = 0; piece < 30; ++piece) {  // 300 ms of work in 10 ms pieces
    std::this_thread::sleep_for(10ms);
    if (release_between_pieces) server->ReleaseDue();
  }
  while (last_ns < 0 && Clock::now() - t0 < 5s) (void)server->Receive(&from, &got, 10ms);
  reader.join();
  return std::chrono::nanoseconds(last_ns.load());
}

TEST(LinkNoStall, RepliesLeaveWhenDueWhileTheLoopWorksIfItReleasesThem) {
  const auto with = LastReplyAfterLongWork(true);
  const auto without = LastReplyAfterLongWork(false);
  // Three frames take ~101 ms at 1 Gbit/s; 250 ms leaves room for a loaded 2-core machine.
  EXPECT_GE(with, 90ms) << "the replies were not paced";
  EXPECT_LT(with, 250ms) << "the replies waited for the loop's work to end";
  EXPECT_GE(without, 300ms) << "without ReleaseDue nothing leaves before the loop's next Receive";
}

// ---- reply order (cluster.reply_order) -------------------------------------------------------

struct OrderRun {
  Clock::duration first_done{0}, second_done{0};  // when each client had all its big replies
  std::vector<std::string> first_seen;            // what the first client received, in order
};

// Two clients ask at once: the server's loop makes their replies interleaved (a big reply for
// the first, one for the second, ..., an "ack" to the first after each of its big ones), the
// first's with order key 1 and the second's with 2, at 1 Gbit/s (~34 ms a reply).
OrderRun InterleavedReplies(bool ordered, int n) {
  Side o = Options(1.0);
  o.ordered = ordered;
  Loopback net(o, Options(0));
  std::unique_ptr<ClientEndpoint> first = net.Connect(), second = net.Connect();
  if (first == nullptr || second == nullptr) return {};  // the failed bind or connect is reported
  ServerEndpoint* server = net.server.get();
  PeerId first_id, second_id;
  Frames got;
  EXPECT_TRUE(first->Send(Small("hello")).ok());
  EXPECT_TRUE(server->Receive(&first_id, &got, 5000ms).ok());
  EXPECT_TRUE(second->Send(Small("hello")).ok());
  EXPECT_TRUE(server->Receive(&second_id, &got, 5000ms).ok());
  auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'z');
  OrderRun run;
  std::atomic<int> done{0};
  const auto t0 = Clock::now();
  auto read = [&](ClientEndpoint* c, int bigs, Clock::duration* at, std::vector<std::string>* seen) {
    Frames reply;
    for (int i = 0; i < bigs;) {
      if (!c->Receive(&reply, 5000ms).ok()) break;
      const std::string head(reinterpret_cast<const char*>(reply[0].data()), reply[0].size());
      if (seen) seen->push_back(head);
      if (head == "chunk") ++i;
    }
    *at = Clock::now() - t0;
    ++done;
  };
  std::thread a(read, first.get(), n, &run.first_done, &run.first_seen);
  std::thread b(read, second.get(), n, &run.second_done, nullptr);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(server->SendOrdered(first_id, Big(payload), 1).ok());
    EXPECT_TRUE(server->SendOrdered(second_id, Big(payload), 2).ok());
    EXPECT_TRUE(server->Send(first_id, Small("ack")).ok());  // rides behind the first's big replies
  }
  while (done < 2 && Clock::now() - t0 < 10s) (void)server->Receive(&first_id, &got, 10ms);
  a.join();
  b.join();
  return run;
}

// With order keys the link carries the first client's replies before the second's: it has them
// all in about half the time, the second at the same time as without; without them both finish
// at the end (interleaved). A peer's own replies keep their order either way.
TEST(LinkOrder, RepliesTakeTheLinkByOrderKeyWhenAsked) {
  constexpr int kEach = 6;  // 12 replies, ~0.4 s at 1 Gbit/s
  const double total_s = 2.0 * kEach * static_cast<double>(BigBytes()) * 8 / 1e9;
  const OrderRun ordered = InterleavedReplies(true, kEach);
  const OrderRun interleaved = InterleavedReplies(false, kEach);
  auto s = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  EXPECT_LT(s(ordered.first_done), 0.65 * s(ordered.second_done))
      << "ordered: " << s(ordered.first_done) << " s and " << s(ordered.second_done) << " s";
  EXPECT_GT(s(ordered.second_done), 0.9 * total_s) << "the link did not hold its rate";
  EXPECT_LT(s(ordered.second_done), total_s + 0.25) << "ordering left the link idle";
  EXPECT_GT(s(interleaved.first_done), 0.8 * s(interleaved.second_done))
      << "arrival order: " << s(interleaved.first_done) << " s and " << s(interleaved.second_done) << " s";
  std::vector<std::string> sent;
  for (int i = 0; i < kEach; ++i) sent.insert(sent.end(), {"chunk", "ack"});
  sent.pop_back();  // the reader stops at the last big reply
  EXPECT_EQ(ordered.first_seen, sent);
  EXPECT_EQ(interleaved.first_seen, sent);
}

// ---- the link is a decorator: any transport underneath ----------------------------------------

// The same link in front of the in-process transport: a client's 4 MiB messages arrive in order
// at the set rate (within the tolerance), the server's loop receiving them as they come.
TEST(LinkDecorator, PacesTheInProcessTransportToo) {
  InprocTransport inproc;
  EmulatedLinkOptions o;
  o.gbps = 1.0;
  o.linger_ms = 0;
  EmulatedLinkTransport link(&inproc, o);
  std::unique_ptr<ServerEndpoint> server;
  ASSERT_TRUE(inproc.Bind("paced", &server).ok());  // ingress is not limited: the server's side plain
  std::unique_ptr<ClientEndpoint> client;
  ASSERT_TRUE(link.Connect("paced", &client).ok());
  auto payload = std::make_shared<std::vector<char>>(kFrameBytes, 'p');
  const int n = FramesFor(1.0, 0.4);
  std::atomic<bool> all_in{false};
  std::thread reader([&] {
    Frames f;
    for (int i = 0; i < n; ++i) {
      PeerId from;
      ASSERT_TRUE(server->Receive(&from, &f, 5000ms).ok()) << i;
      const std::string head(reinterpret_cast<const char*>(f[0].data()), f[0].size());
      EXPECT_EQ(head, fmt::format("chunk{}", i));
    }
    all_in = true;
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    Frames f;
    f.push_back(Frame::Copy(fmt::format("chunk{}", i)));
    f.push_back(Frame::Borrow(payload->data(), payload->size(), payload));
    ASSERT_TRUE(client->Send(std::move(f)).ok());
  }
  Frames none;
  while (!all_in.load() && Clock::now() - t0 < 3s) (void)client->Receive(&none, 1ms);  // releases what falls due
  const auto took = Clock::now() - t0;
  reader.join();
  const double gbps = Gbps(static_cast<size_t>(n) * kFrameBytes, took);
  EXPECT_NEAR(gbps, 1.0, 1.0 * kTolerance + 0.05) << n << " frames";
}

// ---- the run config's cluster.link_gbps ------------------------------------------------------

TEST(LinkConfig, LinkGbpsReachesTheTransportAndTurnsSharedMemoryOff) {
  RunConfig c;
  ProcessNet net;
  ASSERT_TRUE(SetUpProcessNet(c, NetFlags{}, NetRole::kWorker, "", &net).ok());
  EXPECT_EQ(net.link.gbps, 0);  // off by default
  EXPECT_TRUE(SharedMemoryOn(c));
  EXPECT_EQ(EmulatedLinkNote(c), "");

  c.cluster.link_gbps = 2.5;
  for (NetRole role : {NetRole::kCoordinator, NetRole::kServer, NetRole::kWorker, NetRole::kAdmin}) {
    ASSERT_TRUE(SetUpProcessNet(c, NetFlags{}, role, "", &net).ok()) << NetRoleName(role);
    EXPECT_EQ(net.link.gbps, 2.5) << NetRoleName(role);
  }
  EXPECT_FALSE(SharedMemoryOn(c));
  EXPECT_EQ(EmulatedLinkNote(c),
            "emulated link: cluster.link_gbps = 2.5 Gbit/s of egress per process (experiments only); shared memory "
            "off (cluster.shared_memory would bypass the link)");
  c.cluster.shared_memory = false;  // nothing to turn off
  EXPECT_EQ(EmulatedLinkNote(c), "emulated link: cluster.link_gbps = 2.5 Gbit/s of egress per process (experiments only)");
  EXPECT_FALSE(net.link.order_by_key);  // cluster.reply_order = "arrival" by default
  c.cluster.reply_order = ReplyOrder::kStep;
  ASSERT_TRUE(SetUpProcessNet(c, NetFlags{}, NetRole::kServer, "", &net).ok());
  EXPECT_TRUE(net.link.order_by_key);
}

}  // namespace
}  // namespace downpour
