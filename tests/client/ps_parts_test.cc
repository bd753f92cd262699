// Tests of the PS client's parts, each on its own (client/ps/delivery.h, shm_path.h,
// push_encoding.h, send_queue.h): the byte window, the incarnations that tell a restart from a
// late reply, the write-ahead-log backoff, the same-host region's areas and busy chunks, the
// encoding of a lossy push part, and the order unsent parts leave in. ps_client_test drives them
// together over sockets.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "client/ps/delivery.h"
#include "client/ps/push_encoding.h"
#include "client/ps/send_queue.h"
#include "client/ps/shm_path.h"
#include "common/grad_codec.h"
#include "common/layout.h"
#include "common/shm_region.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

TEST(ByteWindow, BoundsTheBytesOnTheWireButLetsAnOversizePartGoAlone) {
  ByteWindow w(100);
  EXPECT_TRUE(w.Fits(250));  // empty: a part larger than the window goes, alone
  w.Add(60);
  EXPECT_TRUE(w.Fits(40));
  EXPECT_FALSE(w.Fits(41));
  w.Add(40);
  EXPECT_EQ(w.inflight(), 100u);
  w.Remove(70);
  EXPECT_TRUE(w.Fits(70));
  w.Remove(1000);  // more than is in flight: empty, never negative
  EXPECT_EQ(w.inflight(), 0u);
  w.Add(5);
  w.Clear();
  EXPECT_EQ(w.inflight(), 0u);
}

TEST(IncarnationTracker, TellsARestartFromALateReplyOfAReplacedProcess) {
  IncarnationTracker t;
  EXPECT_FALSE(t.Observe(0));   // a reply without one
  EXPECT_FALSE(t.Observe(11));  // the first heard: the server, not a restart
  EXPECT_FALSE(t.Observe(11));
  EXPECT_TRUE(t.Observe(22));   // a new process
  EXPECT_FALSE(t.Observe(11));  // a late reply of the one it replaced
  EXPECT_EQ(t.current(), 22u);
  for (uint64_t i : {33, 44, 55, 66}) EXPECT_TRUE(t.Observe(i));
  EXPECT_TRUE(t.Observe(11)) << "forgotten after " << IncarnationTracker::kRemembered << " newer ones";
  t.Forget();  // the link moved: whoever answers there first
  EXPECT_FALSE(t.Observe(77));
  EXPECT_EQ(t.current(), 77u);
}

TEST(LogRefusals, BacksOffFrom50MsDoublingToTheCapThenGivesUp) {
  LogRefusals r;
  const auto t0 = LogRefusals::Clock::now();
  const auto cap = 300ms, give_up = 2000ms;
  std::vector<long> waits;
  auto now = t0;
  while (r.Refuse(now, cap, give_up)) {
    waits.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(r.not_before - now).count());
    now = r.not_before;
  }
  ASSERT_GE(waits.size(), 4u);
  EXPECT_EQ(waits[0], 50);
  EXPECT_EQ(waits[1], 100);
  EXPECT_EQ(waits[2], 200);
  for (size_t i = 3; i < waits.size(); ++i) EXPECT_EQ(waits[i], 300) << i;
  EXPECT_GE(r.refused_for(now), give_up);
  EXPECT_EQ(r.count, static_cast<int>(waits.size()) + 1);
}

// Four chunks of 10 floats over two servers; the path is server 1's (two of them).
class ShmPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"a", {40}, 1, 1}}, 2, 10, &layout_).ok());
    ASSERT_EQ(layout_.ServerChunks(1).size(), 2u);
  }
  // A register reply offering `region`.
  static MessageHeader Offer(const SharedRegion& region) {
    MessageHeader h;
    h.type = MsgType::kRegisterReply;
    h.shm_path = region.path();
    h.shm_bytes = region.payload_bytes();
    h.shm_nonce = region.nonce();
    return h;
  }
  MessageHeader Message(MsgType type) const {
    MessageHeader h;
    h.type = type;
    for (int32_t c : layout_.ServerChunks(1)) h.chunk_ids.push_back(static_cast<uint32_t>(c));
    return h;
  }
  ParamLayout layout_;
};

TEST_F(ShmPathTest, PushesGoToThePushAreaPullsComeFromThePullAreaAndBusyChunksWait) {
  const uint64_t area = 20 * sizeof(float);  // server 1 holds 2 chunks of 10 floats
  std::unique_ptr<SharedRegion> region;
  ASSERT_TRUE(SharedRegion::Create("test", 2 * area, &region).ok());
  ShmPath path(layout_, 1, /*asked=*/true);
  EXPECT_FALSE(path.on());
  EXPECT_EQ(path.Adopt(Offer(*region)), "");
  ASSERT_TRUE(path.on());

  MessageHeader push = Message(MsgType::kPush);
  std::vector<std::vector<float>> grads = {std::vector<float>(10, 1.5f), std::vector<float>(10, -2.0f)};
  Frames payload;
  for (auto& g : grads) payload.push_back(Frame::Borrow(reinterpret_cast<const std::byte*>(g.data()), 40, nullptr));
  bool wait = true;
  ASSERT_TRUE(path.Usable(push, &wait));
  EXPECT_FALSE(wait);
  Frames frames;
  ASSERT_TRUE(path.Send(push, payload, &frames).ok());
  ASSERT_EQ(frames.size(), 1u) << "only the header goes on the socket";
  const auto* floats = reinterpret_cast<const float*>(region->payload());
  EXPECT_EQ(floats[0], 1.5f);    // server 1's first chunk at the start of the push area
  EXPECT_EQ(floats[10], -2.0f);  // its second after it
  EXPECT_EQ(path.sent_bytes(), 80u);
  EXPECT_FALSE(path.Usable(push, &wait));
  EXPECT_TRUE(wait) << "a chunk whose area holds an unanswered push waits";
  path.Release(push);
  EXPECT_TRUE(path.Usable(push, &wait));

  // The server's pull reply in the pull area, after the push area.
  auto* pull_area = reinterpret_cast<float*>(region->payload()) + 20;
  std::iota(pull_area, pull_area + 20, 100.0f);
  std::vector<float> out(40, 0.0f);
  path.ReadPull(Message(MsgType::kPull), out);
  const std::span<const int32_t> mine = layout_.ServerChunks(1), theirs = layout_.ServerChunks(0);
  EXPECT_EQ(out[layout_.chunk(mine[0]).flat_offset], 100.0f);
  EXPECT_EQ(out[layout_.chunk(mine[1]).flat_offset + 9], 119.0f);
  EXPECT_EQ(out[layout_.chunk(theirs[0]).flat_offset], 0.0f) << "server 0's chunk is not this path's";
  EXPECT_EQ(path.received_bytes(), 80u);
  // Into 16-bit weights (a GPU worker's fp16 pull): the region's f32 cast as the codec rounds.
  pull_area[0] = 100.0004f;  // not a half: rounds to 100
  std::vector<uint16_t> out16(40, 0);
  path.ReadPull16(Message(MsgType::kPull), DType::kF16, out16);
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(mine[0]).flat_offset)], FloatToHalf(100.0f));
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(mine[1]).flat_offset + 9)], FloatToHalf(119.0f));
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(theirs[0]).flat_offset)], 0);
  EXPECT_EQ(path.received_bytes(), 160u);

  // Lossy and factored messages are frames, never the region.
  MessageHeader half = push;
  half.dtype = DType::kF16;
  EXPECT_FALSE(path.Usable(half, &wait));
  EXPECT_FALSE(wait);
}

TEST_F(ShmPathTest, ARegionOfTheWrongSizeOrNoneLeavesThePathOff) {
  ShmPath path(layout_, 1, /*asked=*/true);
  MessageHeader none;
  EXPECT_NE(path.Adopt(none).find("offered none"), std::string::npos);
  std::unique_ptr<SharedRegion> small;
  ASSERT_TRUE(SharedRegion::Create("small", 8, &small).ok());
  EXPECT_NE(path.Adopt(Offer(*small)).find("this layout needs 160"), std::string::npos);
  EXPECT_FALSE(path.on());
  ShmPath unasked(layout_, 1, /*asked=*/false);
  EXPECT_EQ(unasked.Adopt(Offer(*small)), "");
  EXPECT_FALSE(unasked.on());
}

// Top-k of a chunk big enough goes as top-k; of a chunk so small that indices cost as much as dense
// f32, dense: the header then lists each chunk's encoding. Byte lengths and checksums follow the
// encoded bytes, which are what the encoder makes.
TEST(EncodePushPart, ReplacesThePayloadByTheCodecsBytesAndFixesTheHeader) {
  std::vector<float> big(1000), tiny(2, 0.25f);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 17) - 8.0f;
  MessageHeader h;
  h.type = MsgType::kPush;
  h.encoding = Encoding::kTopK;
  h.chunk_ids = {0, 1};
  h.byte_lengths = {4000, 8};
  h.checksums = {0, 0};
  Frames payload = {Frame::Borrow(reinterpret_cast<const std::byte*>(big.data()), 4000, nullptr),
                    Frame::Borrow(reinterpret_cast<const std::byte*>(tiny.data()), 8, nullptr)};
  const CompressionConfig topk{.push = WireCodec::kTopK, .top_k_fraction = 0.01};
  ChunkEncoder encoder(topk), reference(topk);
  const uint64_t bytes = EncodePushPart(encoder, &h, &payload);
  EncodedChunk a, b;
  reference.Encode(0, big, &a);
  reference.Encode(1, tiny, &b);
  ASSERT_EQ(payload.size(), 2u);
  EXPECT_EQ(bytes, a.bytes.size() + b.bytes.size());
  EXPECT_EQ(h.byte_lengths, (std::vector<uint64_t>{a.bytes.size(), b.bytes.size()}));
  EXPECT_EQ(h.encodings, (std::vector<Encoding>{Encoding::kTopK, Encoding::kDense}));
  EXPECT_EQ(h.checksums[0], Crc32c(a.bytes.data(), a.bytes.size()));
  EXPECT_EQ(std::memcmp(payload[0].data(), a.bytes.data(), a.bytes.size()), 0);
  EXPECT_EQ(std::memcmp(payload[1].data(), b.bytes.data(), b.bytes.size()), 0);
}

// --- SendQueue (cluster.send_order) ---

using Kind = SendQueue::Kind;
using Chunks = std::vector<std::vector<uint32_t>>;

// Sends everything the queue lets go at `now`, as a link with room would: the (op, part) order.
std::vector<std::pair<uint64_t, size_t>> Drain(SendQueue& q, SendQueue::Clock::time_point now) {
  std::vector<std::pair<uint64_t, size_t>> sent;
  while (auto pick = q.Next(now)) {
    sent.emplace_back(pick->op, pick->part);
    q.Gone(pick->op, pick->part);
  }
  return sent;
}

using Sent = std::vector<std::pair<uint64_t, size_t>>;

TEST(SendQueue, CallOrderSendsAsCalledAndARefusedPartHoldsWhatFollows) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kCall, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{5}, {6}, {0}});
  q->Add(2, Kind::kPull, 0, t0, Chunks{{0}, {5}});
  EXPECT_EQ(Drain(*q, t0), (Sent{{1, 0}, {1, 1}, {1, 2}, {2, 0}, {2, 1}}));
  EXPECT_EQ(q->unsent(), 0u);
  // The log refused push part 1 (a backoff of 50 ms), and a restart put pull part 0 back: the
  // refused part goes first, and nothing passes it while it waits.
  q->Unsent(1, 1, t0 + 50ms);
  q->Unsent(2, 0);
  EXPECT_EQ(Drain(*q, t0 + 10ms), Sent{});
  EXPECT_EQ(Drain(*q, t0 + 50ms), (Sent{{1, 1}, {2, 0}}));
  q->Remove(1);
  q->Remove(2);
  EXPECT_EQ(q->unsent(), 0u);
}

// Backward made fc8's gradients (chunk 5) first and conv1's (chunk 0) last; the next forward
// reads chunk 0 first. By layer, chunk 0's push goes first and its pull right after it, while a
// chunk's own pull still follows that chunk's push.
TEST(SendQueue, ByLayerTheFirstChunkGoesFirstAndAChunksPullFollowsItsPush) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{5}, {3, 4}, {0, 1}});
  q->Add(2, Kind::kPull, 1, t0, Chunks{{0, 1}, {3, 4}, {5}, {7}});
  EXPECT_EQ(Drain(*q, t0), (Sent{{1, 2}, {2, 0}, {1, 1}, {2, 1}, {1, 0}, {2, 2}, {2, 3}}));
}

TEST(SendQueue, ByLayerABarrierWaitsForWhatCameBeforeAndHoldsWhatCameAfter) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{4}, {2}});
  q->Add(2, Kind::kBarrier, 0, t0, Chunks{{}});  // a control request
  q->Add(3, Kind::kPull, 1, t0, Chunks{{0}});    // lower than everything before it
  auto pick = q->Next(t0);
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick->op, 1u);
  EXPECT_EQ(pick->part, 1u);
  EXPECT_EQ(Drain(*q, t0), (Sent{{1, 1}, {1, 0}, {2, 0}, {3, 0}}));
}

// Servers count a worker's clock from its pushes: step 2's push must not pass step 1's, while a
// pull may pass anything but its chunks' pushes.
TEST(SendQueue, ByLayerAPushWaitsForEarlierPushesOfALowerClockAndAPullDoesNot) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{6}, {5}});
  q->Add(2, Kind::kPush, 2, t0, Chunks{{0}});
  q->Add(3, Kind::kPull, 2, t0, Chunks{{1}});
  EXPECT_EQ(Drain(*q, t0), (Sent{{3, 0}, {1, 1}, {1, 0}, {2, 0}}));
}

TEST(SendQueue, ByLayerAnOperationWaitingHalfItsReplyTimeoutGoesFirst) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 1000ms);
  q->Add(1, Kind::kPull, 0, t0, Chunks{{7}, {6}});
  q->Add(2, Kind::kPull, 0, t0 + 400ms, Chunks{{0}});
  const auto pick = q->Next(t0 + 400ms);  // nobody overdue: by layer
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick->op, 2u);
  EXPECT_EQ(Drain(*q, t0 + 501ms), (Sent{{1, 1}, {1, 0}, {2, 0}}));  // op 1 waited > 500 ms
}

TEST(SendQueue, ByLayerARefusedPartWaitsOutItsBackoffAndHoldsItsChunkOnly) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{0}, {1}});
  q->Add(2, Kind::kPull, 1, t0, Chunks{{0}, {1}});
  ASSERT_EQ(Drain(*q, t0).size(), 4u);
  q->Unsent(1, 0, t0 + 50ms);  // refused by the log, chunk 0's pull already answered...
  q->Unsent(2, 1);             // ... and chunk 1's pull to send again after a restart
  q->Gone(2, 0);
  EXPECT_EQ(Drain(*q, t0 + 10ms), (Sent{{2, 1}}));
  EXPECT_EQ(Drain(*q, t0 + 50ms), (Sent{{1, 0}}));
  // Refused again while a pull of its chunk waits: the pull waits with it.
  q->Unsent(1, 0, t0 + 150ms);
  q->Unsent(2, 0);
  EXPECT_EQ(Drain(*q, t0 + 100ms), Sent{});
  EXPECT_EQ(Drain(*q, t0 + 150ms), (Sent{{1, 0}, {2, 0}}));
}

TEST(SendQueue, ByLayerAnEndedOperationNoLongerHoldsItsChunks) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{3}});
  q->Add(2, Kind::kPull, 1, t0, Chunks{{3}});
  q->Unsent(1, 0, t0 + 1h);  // held by the log
  EXPECT_EQ(Drain(*q, t0), Sent{});
  q->Remove(1);  // it failed
  EXPECT_EQ(Drain(*q, t0), (Sent{{2, 0}}));
  q->Clear();
  EXPECT_EQ(q->unsent(), 0u);
  EXPECT_FALSE(q->Next(t0));
}

// Through a same-host region the link asks a by-layer queue for call order: the same parts, a
// refused one holding what follows until its backoff ends, and the queue by layer again after.
TEST(SendQueue, ByLayerAsksInCallOrderGoesInCallOrder) {
  const auto t0 = SendQueue::Clock::now();
  auto q = SendQueue::Make(SendOrder::kLayer, 8, 60s);
  q->Add(1, Kind::kPush, 1, t0, Chunks{{5}, {0}});
  q->Add(2, Kind::kPull, 1, t0, Chunks{{1}});
  auto pick = q->NextInCallOrder(t0);
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick->op, 1u);
  EXPECT_EQ(pick->part, 0u);
  q->Gone(1, 0);
  q->Unsent(1, 0, t0 + 50ms);
  EXPECT_FALSE(q->NextInCallOrder(t0 + 10ms));
  pick = q->NextInCallOrder(t0 + 50ms);
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick->part, 0u);
  EXPECT_EQ(Drain(*q, t0 + 50ms), (Sent{{1, 1}, {2, 0}, {1, 0}}));
}

// The rules of send_order = "layer", written as a scan over every waiting part (the first
// version of the loop): the queue must pick what this picks, event for event.
class LayerOrderByScan {
 public:
  struct P {
    std::vector<uint32_t> chunks;
    bool unsent = true;
    SendQueue::Clock::time_point not_before{};
  };
  struct O {
    Kind kind;
    int64_t clock;
    SendQueue::Clock::time_point admitted;
    std::vector<P> parts;
  };
  std::map<uint64_t, O> ops;
  std::chrono::milliseconds timeout;

  std::optional<SendQueue::Pick> Next(SendQueue::Clock::time_point now) const {
    using Key = std::tuple<int64_t, uint64_t, int64_t, size_t>;
    std::optional<Key> best;
    std::set<uint32_t> seen;  // chunks of earlier unsent parts
    bool earlier = false;
    int64_t low = std::numeric_limits<int64_t>::max();
    for (const auto& [id, o] : ops) {
      bool any = false;
      const bool barrier = o.kind == Kind::kBarrier;
      for (size_t k = 0; k < o.parts.size(); ++k) {
        const P& p = o.parts[k];
        if (!p.unsent) continue;
        any = true;
        bool free = (!barrier || !earlier) && !(o.kind == Kind::kPush && o.clock > low) && now >= p.not_before;
        for (uint32_t c : p.chunks) free = seen.insert(c).second && free;
        if (!free) continue;
        const int64_t key = p.chunks.empty() ? -1 : static_cast<int64_t>(p.chunks.front());
        const Key candidate{now - o.admitted > timeout / 2 ? std::numeric_limits<int64_t>::min() : key, id, key, k};
        if (!best || candidate < *best) best = candidate;
      }
      earlier = earlier || any;
      if (any && o.kind == Kind::kPush) low = std::min(low, o.clock);
      if (any && barrier) break;
    }
    if (!best) return std::nullopt;
    return SendQueue::Pick{std::get<1>(*best), std::get<3>(*best)};
  }
};

TEST(SendQueue, ByLayerPicksWhatAScanOfEveryWaitingPartPicksOverRandomEvents) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const auto t0 = SendQueue::Clock::now();
    auto q = SendQueue::Make(SendOrder::kLayer, 12, 1000ms);
    LayerOrderByScan ref;
    ref.timeout = 1000ms;
    auto now = t0;
    uint64_t next_id = 1;
    int64_t clock = 1;
    size_t picks = 0;
    for (int event = 0; event < 400; ++event) {
      const int what = static_cast<int>(rng() % 10);
      if (what < 2 && ref.ops.size() < 8) {  // a new operation
        const int type = static_cast<int>(rng() % 8);
        const Kind kind = type < 3 ? Kind::kPush : type < 7 ? Kind::kPull : Kind::kBarrier;
        if (kind == Kind::kPush && rng() % 2 == 0) ++clock;
        Chunks chunks(1 + rng() % 5);
        for (auto& c : chunks) {
          if (kind == Kind::kBarrier && rng() % 2 == 0) continue;  // a control request: no chunks
          const uint32_t first = static_cast<uint32_t>(rng() % 12);
          for (uint32_t i = first; i < std::min<uint32_t>(12, first + 1 + rng() % 3); ++i) c.push_back(i);
        }
        LayerOrderByScan::O o{kind, clock, now, {}};
        for (const auto& c : chunks) o.parts.push_back({c});
        ref.ops[next_id] = o;
        q->Add(next_id++, kind, clock, now, chunks);
      } else if (what < 6) {  // the link sends what the queue names
        const auto want = ref.Next(now);
        const auto got = q->Next(now);
        ASSERT_EQ(want.has_value(), got.has_value()) << "trial " << trial << " event " << event;
        if (!got) continue;
        ASSERT_EQ(got->op, want->op) << "trial " << trial << " event " << event;
        ASSERT_EQ(got->part, want->part) << "trial " << trial << " event " << event;
        ++picks;
        ref.ops[got->op].parts[got->part].unsent = false;
        q->Gone(got->op, got->part);
      } else if (what < 8 && !ref.ops.empty()) {  // a sent part back (a refusal, a restart) or answered
        auto it = ref.ops.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % ref.ops.size()));
        const size_t k = rng() % it->second.parts.size();
        LayerOrderByScan::P& p = it->second.parts[k];
        if (rng() % 3 == 0) {
          p.unsent = false;
          q->Gone(it->first, k);
        } else {
          p.unsent = true;
          p.not_before = rng() % 2 == 0 ? SendQueue::Clock::time_point{} : now + std::chrono::milliseconds(rng() % 200);
          q->Unsent(it->first, k, p.not_before);
        }
      } else if (what == 8 && !ref.ops.empty() && rng() % 3 == 0) {  // an operation ends
        auto it = ref.ops.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % ref.ops.size()));
        q->Remove(it->first);
        ref.ops.erase(it);
      } else {
        now += std::chrono::milliseconds(rng() % 120);
      }
    }
    EXPECT_GT(picks, 50u) << "trial " << trial;
  }
}

}  // namespace
}  // namespace downpour
