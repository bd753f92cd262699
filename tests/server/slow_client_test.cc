// slow_client_test.cc — issue 13 test (e): a client that never reads its replies does not stall a
// server. A real ShardServer over ZmqTransport on 127.0.0.1 serves a 4 MiB model; one raw client
// sends hundreds of pulls and never reads a reply, while a well-behaved PsClient keeps pulling:
// its pull latency stays within 100 ms of its undisturbed latency (no pull times out), and the
// bad peer is dropped and counted (ServerEndpoint::dropped_peers). Loops are bounded (< ~10 s).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "client/ps/ps_client.h"
#include "common/zmq_transport.h"
#include "server/shard.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

TEST(SlowClient, APeerThatNeverReadsIsDroppedAndDoesNotDelayAnotherWorkersPullBeyond100Ms) {
  // Transports first: they must outlive every endpoint (the shard's, the clients').
  ZmqOptions server_options;
  server_options.linger_ms = 0;
  server_options.peer_queue_bytes = size_t{32} << 20;  // 8 pull replies
  server_options.server_sndhwm = 8;
  ZmqTransport server_transport(server_options);
  ZmqOptions client_options;
  client_options.linger_ms = 0;
  ZmqTransport client_transport(client_options);

  // 1M floats (4 MiB) in 1 MiB chunks on one server; two workers.
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"w", {1024, 1024}, 1.0f, 1.0f}}, 1, int64_t{1} << 18, &layout).ok());
  ShardOptions so;
  so.cluster.workers = 2;
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout, so, &shard).ok());

  std::unique_ptr<ServerEndpoint> endpoint;
  ASSERT_TRUE(server_transport.Bind("tcp://127.0.0.1:0", &endpoint).ok());
  const std::string address = endpoint->address();
  const ServerEndpoint* ep = endpoint.get();  // owned by the shard from here; dropped_peers is thread-safe
  shard->Start(std::move(endpoint));

  PsClientOptions po;
  po.server_addresses = {address};
  po.worker_id = 0;
  po.reply_timeout = 5000ms;
  std::unique_ptr<PsClient> good;
  ASSERT_TRUE(PsClient::Create(&client_transport, layout, po, &good).ok());
  ASSERT_TRUE(good->Connect(5000ms).ok());
  std::vector<float> weights(static_cast<size_t>(layout.total_elems()), 0.5f);
  ASSERT_TRUE(good->Wait(good->PushInit(weights), 5000ms).ok());

  std::vector<float> pulled(weights.size());
  auto timed_pull = [&]() -> double {
    const auto t0 = Clock::now();
    const Status s = good->Wait(good->Pull(pulled), 5000ms);
    EXPECT_TRUE(s.ok()) << "a pull failed (send timeout?): " << s.ToString();
    return Ms(Clock::now() - t0);
  };
  // Undisturbed latency: the median of 20 pulls.
  std::vector<double> quiet;
  for (int i = 0; i < 20; ++i) quiet.push_back(timed_pull());
  std::sort(quiet.begin(), quiet.end());
  const double undisturbed = quiet[quiet.size() / 2];
  EXPECT_EQ(pulled[12345], 0.5f);

  // The bad client: registers as worker 1, then sends 400 pulls (1.6 GB of replies) and never
  // reads one.
  std::unique_ptr<ClientEndpoint> bad;
  ASSERT_TRUE(client_transport.Connect(address, &bad).ok());
  MessageHeader reg;
  reg.type = MsgType::kRegister;
  reg.role = Role::kWorker;
  reg.sender = 1;
  reg.layout_hash = layout.hash();
  Frames f(1);
  ASSERT_TRUE(HeaderFrame(reg, &f[0]).ok());
  ASSERT_TRUE(bad->Send(std::move(f)).ok());
  Frames got;
  ASSERT_TRUE(bad->Receive(&got, 5000ms).ok());
  MessageHeader reply;
  ASSERT_TRUE(ParseHeader(got, &reply).ok());
  ASSERT_EQ(reply.type, MsgType::kRegisterReply);
  std::thread flood([&] {
    for (uint64_t i = 0; i < 400; ++i) {
      MessageHeader pull;
      pull.type = MsgType::kPull;
      pull.role = Role::kWorker;
      pull.sender = 1;
      pull.layout_hash = layout.hash();
      pull.request_id = 1000 + i;
      Frames m(1);
      ASSERT_TRUE(HeaderFrame(pull, &m[0]).ok());
      ASSERT_TRUE(bad->Send(std::move(m)).ok());
    }
  });
  // Meanwhile, and after, the good worker pulls on.
  std::vector<double> busy;
  const auto end = Clock::now() + 5s;
  while (Clock::now() < end && (busy.size() < 40 || ep->dropped_peers() == 0)) busy.push_back(timed_pull());
  flood.join();
  for (int i = 0; i < 10; ++i) busy.push_back(timed_pull());
  const double worst = *std::max_element(busy.begin(), busy.end());
  std::printf("undisturbed pull %.2f ms; with the bad client: worst %.2f ms over %zu pulls; dropped peers %llu\n",
              undisturbed, worst, busy.size(), static_cast<unsigned long long>(ep->dropped_peers()));
  EXPECT_LT(worst - undisturbed, 100.0) << "the client that does not read delayed another worker's pull";
  EXPECT_EQ(ep->dropped_peers(), 1u) << "the client that never reads was not dropped";
  EXPECT_EQ(pulled[12345], 0.5f);

  good.reset();
  bad.reset();
  shard->Stop();
  EXPECT_TRUE(shard->Join().ok());
}

}  // namespace
}  // namespace downpour
