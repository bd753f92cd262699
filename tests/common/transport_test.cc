// transport_test.cc — the Transport contract, run against both implementations.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/inproc_transport.h"
#include "common/zmq_transport.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "zmq") {
      transport_ = std::make_unique<ZmqTransport>();
      address_ = "tcp://127.0.0.1:0";
    } else {
      transport_ = std::make_unique<InprocTransport>();
      address_ = "shard0";
    }
  }
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
}

INSTANTIATE_TEST_SUITE_P(Both, TransportTest, ::testing::Values("inproc", "zmq"));

}  // namespace
}  // namespace downpour
