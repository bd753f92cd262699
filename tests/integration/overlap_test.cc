// overlap_test.cc — the worker's overlapped pull (trainer.h, "Overlapped pulls") against real
// shard servers in-process (inproc transport, two ShardServers, one worker's PsClient):
//  * ordering: for every chunk and step t, the pull for step t+1 is started after the push of
//    step t and before the end of that backward (it overlaps), the server served it after
//    applying that push (1 worker, async: every chunk's version equals the pull's clock), and
//    forward of step t+1 waits for the pulls in layer order (conv1's first);
//  * exactness: with one worker and one server async training is deterministic, so the
//    overlapped loop must give bit-identical weights to the blocking loop — also when every
//    pull is held back until the trainer waits for it (a forward that read a layer before
//    waiting would then compute with the previous step's weights and drift), and on a device
//    stand-in whose uploads and gradient downloads complete later on another thread;
//  * the channel's wire spans (comm_ms of the step-time breakdown): one per waited request;
//  * ssp:0 with the overlap (pulls at clock t+1 before the clock report) does not stall;
//  * one step of lag (worker.outstanding_steps = 2): no forward waits for a pull that follows its
//    previous step's pushes, and with pulls delivered as late as allowed the run is delayed SGD
//    with a delay of one step, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "client/engine/emulated_copy_backend.h"
#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/ps/ps_client.h"
#include "client/worker/ps_channel.h"
#include "client/worker/trainer.h"
#include "common/inproc_transport.h"
#include "server/shard.h"
#include "tests/client/test_nets.h"

namespace downpour::worker {
namespace {

using namespace std::chrono_literals;

constexpr const char* kNet = engine::testing::kTinyConvNet;  // conv1 → fc1 → fc2 on 1×8×8

constexpr int kBatch = 8;
constexpr int kSteps = 5;

// A different random batch every step, the same sequence in every run.
class StepSource : public TrainSource {
 public:
  StepSource() : data_(size_t{kBatch} * 64), labels_(kBatch) {}
  Status Next(BatchView* b) override {
    std::mt19937 rng(static_cast<uint32_t>(1000 + step_++));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : data_) x = d(rng);
    for (int i = 0; i < kBatch; ++i) labels_[static_cast<size_t>(i)] = static_cast<int>(rng() % 10);
    *b = BatchView{data_.data(), labels_.data(), kBatch, 1, 8, 8, 0};
    return Status::Ok();
  }
  int64_t shard_size() const override { return 0; }
  Status SeekToStep(int64_t) override { return Status::Ok(); }

 private:
  int64_t step_ = 0;
  std::vector<float> data_;
  std::vector<int> labels_;
};

// What the trainer asked of the channel, in call order.
struct Event {
  enum Kind { kPull, kStartPull, kWaitPull, kPush } kind;
  int64_t clock = 0;
  std::vector<int32_t> chunks;
  PullInfo info;  // kWaitPull: versions the servers returned
};

// How the recording channel hands pulls on.
enum class Pulls {
  kOnWire,    // at once, as the trainer asked
  kHeld,      // only remembered: it goes on the wire when the trainer waits for it, so the weights
              // change at the WaitPull, not before (a layer read before its wait would see the
              // previous step's weights)
  kSnapshot,  // on the wire at once into a buffer of the channel's, written to the trainer's at
              // the WaitPull: the weights the servers had when it was asked, delivered as late as
              // allowed, and never reported done before that (the pipeline's timing is then fixed)
};

// Records every call and forwards it to a PsChannel, handing pulls on as `pulls` says.
class RecordingChannel : public ParamChannel {
 public:
  RecordingChannel(PsChannel* inner, Pulls pulls) : inner_(inner), hold_pulls_(pulls == Pulls::kHeld), pulls_(pulls) {}
  Status Pull(int64_t clock, std::span<float> weights, PullInfo* info) override {
    events.push_back({Event::kPull, clock, {}, {}});
    return inner_->Pull(clock, weights, info);
  }
  Status StartPull(int64_t clock, std::span<const int32_t> chunk_ids, std::span<float> weights,
                   PullHandle* handle) override {
    events.push_back({Event::kStartPull, clock, {chunk_ids.begin(), chunk_ids.end()}, {}});
    *handle = next_++;
    Held& h = held_[*handle];
    h = Held{clock, {chunk_ids.begin(), chunk_ids.end()}, weights, 0, {}};
    if (pulls_ == Pulls::kSnapshot) {
      h.snapshot = std::make_shared<std::vector<float>>(weights.size());
      return inner_->StartPull(clock, chunk_ids, *h.snapshot, &h.inner);
    }
    if (!hold_pulls_) return inner_->StartPull(clock, chunk_ids, weights, &h.inner);
    return Status::Ok();
  }
  Status WaitPull(PullHandle handle, PullInfo* info) override {
    Held h = held_.at(handle);
    held_.erase(handle);
    if (hold_pulls_) DP_RETURN_IF_ERROR(inner_->StartPull(h.clock, h.chunks, h.weights, &h.inner));
    DP_RETURN_IF_ERROR(inner_->WaitPull(h.inner, info));
    if (h.snapshot) {
      for (int32_t c : h.chunks) {
        const Chunk& chunk = inner_layout_->chunk(c);
        std::copy_n(h.snapshot->begin() + chunk.flat_offset, chunk.count, h.weights.begin() + chunk.flat_offset);
      }
    }
    events.push_back({Event::kWaitPull, h.clock, h.chunks, *info});
    return Status::Ok();
  }
  bool PullDone(PullHandle handle) override {
    const Held& h = held_.at(handle);
    return pulls_ == Pulls::kOnWire && inner_->PullDone(h.inner);
  }
  Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads, PushHandle* handle) override {
    events.push_back({Event::kPush, clock, group.chunk_ids, {}});
    return inner_->StartPush(clock, group, grads, handle);
  }
  Status WaitPush(PushHandle handle, PushInfo* info) override { return inner_->WaitPush(handle, info); }
  void SetPushVersions(std::span<const int64_t> versions) override { inner_->SetPushVersions(versions); }
  Status Pull16(int64_t clock, std::span<uint16_t> weights, PullInfo* info) override {
    events.push_back({Event::kPull, clock, {}, {}});
    pulled16 = true;
    return inner_->Pull16(clock, weights, info);
  }
  Status StartPull16(int64_t clock, std::span<const int32_t> chunk_ids, std::span<uint16_t> weights,
                     PullHandle* handle) override {
    EXPECT_EQ(pulls_, Pulls::kOnWire) << "16-bit pulls are recorded, not held";
    events.push_back({Event::kStartPull, clock, {chunk_ids.begin(), chunk_ids.end()}, {}});
    *handle = next_++;
    Held& h = held_[*handle];
    h = Held{clock, {chunk_ids.begin(), chunk_ids.end()}, {}, 0, {}};
    pulled16 = true;
    return inner_->StartPull16(clock, chunk_ids, weights, &h.inner);
  }
  bool pulls16() const override { return inner_->pulls16(); }
  Status SetPushCast(std::span<const uint16_t> cast) override {
    if (!cast.empty()) cast_set = true;
    return inner_->SetPushCast(cast);
  }
  Status SetPushFactors(std::span<const PushFactor> factors) override {
    if (!factors.empty()) ++factor_calls;
    return inner_->SetPushFactors(factors);
  }
  int64_t PulledVersion(int32_t chunk) const override { return inner_->PulledVersion(chunk); }
  Status WaitPushes(PushInfo* info) override { return inner_->WaitPushes(info); }
  Status Clock(int64_t clock) override { return inner_->Clock(clock); }
  Status Leave() override { return inner_->Leave(); }
  std::vector<WireSpan> TakeWireSpans() override { return inner_->TakeWireSpans(); }

  std::vector<Event> events;
  bool cast_set = false;  // the worker handed over gradients cast on its device
  bool pulled16 = false;  // the worker pulled 16-bit weights for its device to widen
  int factor_calls = 0;   // SetPushFactors naming a factored tensor (each push group of a step)

 private:
  struct Held {
    int64_t clock = 0;
    std::vector<int32_t> chunks;
    std::span<float> weights;
    PullHandle inner = 0;
    std::shared_ptr<std::vector<float>> snapshot;  // kSnapshot: where the inner pull writes
  };
  PsChannel* inner_;
  bool hold_pulls_;
  Pulls pulls_;

 public:
  const ParamLayout* inner_layout_ = nullptr;  // kSnapshot: the chunks' places

 private:
  std::map<PullHandle, Held> held_;
  PullHandle next_ = 1;
};

struct RunSetup {
  int servers = 2;
  int64_t chunk_elems = 100;  // fc1 (2304 floats) spans many chunks, biases one each
  bool overlap = true;
  Pulls pulls = Pulls::kOnWire;
  int weights_lag = 0;
  bool emulated_copies = false;
  ConsistencyConfig consistency;
  WireCodec push = WireCodec::kFp32;  // compression.push of the worker's client
  WireCodec pull = WireCodec::kFp32;  // compression.pull
  bool factors = false;               // compression.factors (fc1 pays at one server)
  SendOrder send_order = SendOrder::kCall;  // cluster.send_order of the worker's client
  uint64_t inflight_bytes = 0;              // cluster.inflight_mb in bytes; 0 = the client's default
};

struct RunOutcome {
  std::vector<Event> events;
  std::vector<float> final_weights;  // pulled from the servers after the run
  ParamLayout layout;
  std::vector<std::vector<int32_t>> layer_chunks;  // per layer with parameters, in net order
  int64_t staleness_chunks = 0, staleness_sum = 0;  // from the acks (the servers' measure)
  bool cast_on_device = false;                      // the pushes sent the net's device-cast 16-bit gradients
  bool widened_on_device = false;                   // the pulls kept 16-bit weights, widened by the net's device
  int factor_calls = 0;                             // the channel's factor_calls
};

// The test's net with its initial weights (the same in every run). `emulated_copies`: on the CPU
// backend behind a copy engine that completes every host ↔ device copy later on a thread
// (engine/emulated_copy_backend.h), as a GPU worker's transfers are.
void MakeNet(std::unique_ptr<engine::Net>* net, bool emulated_copies = false) {
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecString(kNet, "overlapnet", &spec).ok());
  engine::NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  std::unique_ptr<engine::Backend> backend;
  ASSERT_TRUE(engine::CreateBackend(no, &backend).ok());
  if (emulated_copies)
    backend = std::make_unique<engine::EmulatedCopyBackend>(std::move(backend), std::chrono::microseconds(300));
  ASSERT_TRUE(engine::Net::CreateWithBackend(spec, no, std::move(backend), net).ok());
  (*net)->InitParams(11);
}

// One worker training kSteps against fresh in-process servers (momentum SGD on the servers).
void TrainOnce(const RunSetup& setup, RunOutcome* out) {
  std::unique_ptr<engine::Net> net;
  ASSERT_NO_FATAL_FAILURE(MakeNet(&net, setup.emulated_copies));
  ASSERT_TRUE(ParamLayout::Build(net->param_specs(), setup.servers, setup.chunk_elems, &out->layout).ok());
  for (int li = 0; li < net->num_layers(); ++li) {
    std::vector<int32_t> ids;
    for (int t : net->layer_param_tensors(li)) {
      const auto in = out->layout.ChunksInRange(out->layout.tensor_flat_offset(t), out->layout.tensor_flat_offset(t + 1));
      ids.insert(ids.end(), in.begin(), in.end());
    }
    if (!ids.empty()) out->layer_chunks.push_back(ids);
  }

  InprocTransport transport;
  std::vector<std::unique_ptr<ShardServer>> shards(static_cast<size_t>(setup.servers));
  PsClientOptions co;
  for (int s = 0; s < setup.servers; ++s) {
    ShardOptions o;
    o.server_id = s;
    o.solver.base_lr = 0.05f;
    o.solver.momentum = 0.9f;
    o.solver.weight_decay = 0.0005f;
    o.consistency = setup.consistency;
    o.poll_interval = 5ms;
    ASSERT_TRUE(ShardServer::Create(out->layout, o, &shards[static_cast<size_t>(s)]).ok());
    const std::string address = fmt::format("overlap-s{}", s);
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport.Bind(address, &ep).ok());
    shards[static_cast<size_t>(s)]->Start(std::move(ep));
    co.server_addresses.push_back(address);
  }
  co.reply_timeout = 20000ms;
  co.server_wait = 20000ms;
  co.compression.push = setup.push;
  co.compression.pull = setup.pull;
  co.send_order = setup.send_order;
  if (setup.inflight_bytes > 0) co.max_inflight_bytes = setup.inflight_bytes;
  {
    std::unique_ptr<PsClient> client;
    ASSERT_TRUE(PsClient::Create(&transport, out->layout, co, &client).ok());
    ASSERT_TRUE(client->Connect(5000ms).ok());
    ASSERT_TRUE(client->Wait(client->PushInit(net->params()), 5000ms).ok());
    {
      PsChannel ps(client.get(), 20000ms);
      RecordingChannel channel(&ps, setup.pulls);
      channel.inner_layout_ = &out->layout;
      TrainerOptions to;
      to.worker.batch_size = kBatch;
      to.worker.steps = kSteps;
      to.min_push_elems = 0;  // a group per tensor: the finest overlap
      to.overlap_pull = setup.overlap;
      to.weights_lag = setup.weights_lag;
      to.compression.push = setup.push;
      to.compression.pull = setup.pull;
      to.compression.factors = setup.factors;
      StepSource source;
      Trainer trainer(to, net.get(), nullptr, &out->layout, &channel, &source, nullptr, nullptr, nullptr);
      TrainResult r;
      const Status s = trainer.Run(&r);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(r.steps, kSteps);
      out->staleness_chunks = r.staleness_chunks;
      out->staleness_sum = r.staleness_sum;
      out->events = channel.events;
      out->cast_on_device = channel.cast_set;
      out->widened_on_device = channel.pulled16;
      out->factor_calls = channel.factor_calls;
    }
    out->final_weights.assign(static_cast<size_t>(out->layout.total_elems()), 0.0f);
    ASSERT_TRUE(client->Wait(client->Pull(out->final_weights), 5000ms).ok());
  }
  for (auto& s : shards) s->Stop();
  for (auto& s : shards) EXPECT_TRUE(s->Join().ok());
}

// `host` run as given, on the host's memory, and again behind the emulated copy engine, as a
// device worker.
void TrainOnHostAndDevice(const RunSetup& host, RunOutcome* on_host, RunOutcome* on_device) {
  RunSetup device = host;
  device.emulated_copies = true;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(host, on_host));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(device, on_device));
}

TEST(Overlap, EachLayersPullFollowsItsPushAndForwardWaitsForIt) {
  RunOutcome run;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(RunSetup{}, &run));
  const int chunks = run.layout.num_chunks();
  // Only the first step pulls everything at once; every later step's weights come layer by layer.
  ASSERT_FALSE(run.events.empty());
  EXPECT_EQ(run.events[0].kind, Event::kPull);
  EXPECT_EQ(std::count_if(run.events.begin(), run.events.end(), [](const Event& e) { return e.kind == Event::kPull; }),
            1);
  for (int64_t t = 0; t + 1 < kSteps; ++t) {
    SCOPED_TRACE(fmt::format("step {} → {}", t, t + 1));
    std::map<int32_t, size_t> push_at, pull_at;  // chunk → event index
    size_t last_push = 0;
    for (size_t i = 0; i < run.events.size(); ++i) {
      const Event& e = run.events[i];
      if (e.kind == Event::kPush && e.clock == t) {
        for (int32_t c : e.chunks) push_at[c] = i;
        last_push = i;
      }
      if (e.kind == Event::kStartPull && e.clock == t + 1) {
        for (int32_t c : e.chunks) {
          EXPECT_EQ(pull_at.count(c), 0u) << "chunk " << c << " pulled twice";
          pull_at[c] = i;
        }
      }
    }
    ASSERT_EQ(static_cast<int>(push_at.size()), chunks);
    ASSERT_EQ(static_cast<int>(pull_at.size()), chunks);
    size_t first_pull = run.events.size();
    for (int32_t c = 0; c < chunks; ++c) {
      EXPECT_GT(pull_at[c], push_at[c]) << "chunk " << c << " pulled before its push";
      first_pull = std::min(first_pull, pull_at[c]);
    }
    // Overlap: pulls of the later layers leave while earlier layers still push (backward goes on).
    EXPECT_LT(first_pull, last_push);
    // Forward of step t+1 waits for its pulls in layer order, conv1's first, and each waited pull
    // carries the versions after this worker's t+1 pushes: the server applied push t first.
    std::vector<const Event*> waits;
    for (const Event& e : run.events) {
      if (e.kind == Event::kWaitPull && e.clock == t + 1) waits.push_back(&e);
    }
    ASSERT_FALSE(waits.empty());
    for (const Event* w : waits) {
      EXPECT_EQ(w->info.version_min, t + 1);
      EXPECT_EQ(w->info.version_max, t + 1);
    }
    auto layer_of = [&](int32_t c) {
      for (size_t l = 0; l < run.layer_chunks.size(); ++l) {
        const auto& ids = run.layer_chunks[l];
        if (std::find(ids.begin(), ids.end(), c) != ids.end()) return static_cast<int>(l);
      }
      return -1;
    };
    int previous_layer = 0;
    for (const Event* w : waits) {
      int first_layer = 1 << 30;
      for (int32_t c : w->chunks) first_layer = std::min(first_layer, layer_of(c));
      EXPECT_GE(first_layer, previous_layer) << "a pull of layer " << first_layer << " waited after layer "
                                             << previous_layer;
      previous_layer = first_layer;
    }
    const auto& conv1 = run.layer_chunks.front();
    EXPECT_NE(std::find(conv1.begin(), conv1.end(), waits.front()->chunks.front()), conv1.end());
  }
  // One worker whose every step computes on its own last push: no staleness.
  EXPECT_EQ(run.staleness_chunks, kSteps * chunks);
  EXPECT_EQ(run.staleness_sum, 0);
}

// fp16 / bf16 pushes from a device worker are cast by the device (Net::SetGradDType, a cast per
// gradient download) and sent as they are; a host worker's are cast by its client's encoder on the
// link's I/O thread. Pulls likewise: a device worker keeps the 16-bit weights and its device
// widens them as they upload (Net::SetWeightDType); a host worker's client widens them. Both round
// alike, so the servers end with the same weights bit for bit, blocking or overlapped.
TEST(Overlap, SixteenBitsCastAndWidenedOnTheDeviceGiveTheHostsWeightsBitForBit) {
  for (WireCodec codec : {WireCodec::kFp16, WireCodec::kBf16}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, overlap {}", WireCodecName(codec), overlap));
      RunSetup host;
      host.push = host.pull = codec;
      host.overlap = overlap;
      RunOutcome on_host, on_device;
      ASSERT_NO_FATAL_FAILURE(TrainOnHostAndDevice(host, &on_host, &on_device));
      EXPECT_FALSE(on_host.cast_on_device || on_host.widened_on_device);
      EXPECT_TRUE(on_device.cast_on_device);
      EXPECT_TRUE(on_device.widened_on_device);
      EXPECT_EQ(on_device.final_weights, on_host.final_weights);
    }
    RunSetup host;
    host.push = host.pull = codec;
    RunOutcome on_host;
    ASSERT_NO_FATAL_FAILURE(TrainOnce(host, &on_host));
    // Each codec matters on its own, or the comparison above proves nothing for it.
    for (bool push32 : {true, false}) {
      RunSetup other = host;
      (push32 ? other.push : other.pull) = WireCodec::kFp32;
      RunOutcome run;
      ASSERT_NO_FATAL_FAILURE(TrainOnce(other, &run));
      EXPECT_NE(run.final_weights, on_host.final_weights)
          << (push32 ? "fp32 pushes" : "fp32 pulls") << " changed nothing";
    }
  }
}

// Sufficient factors with fp16 / bf16 pushes: a device worker's device packs δ, copies a beside
// it and casts both (Backend::ReadFactorsCastAsync), and they are sent as they are; a host
// worker's client casts them on the link's I/O thread. Both round alike, so the servers end with
// the same weights bit for bit.
TEST(Overlap, SixteenBitFactorsCastOnTheDeviceGiveTheHostsWeightsBitForBit) {
  for (WireCodec codec : {WireCodec::kFp16, WireCodec::kBf16}) {
    SCOPED_TRACE(WireCodecName(codec));
    RunSetup host;
    host.servers = 1;
    host.push = codec;
    host.factors = true;
    RunOutcome on_host, on_device;
    ASSERT_NO_FATAL_FAILURE(TrainOnHostAndDevice(host, &on_host, &on_device));
    EXPECT_GE(on_host.factor_calls, kSteps);  // every step pushed factors
    EXPECT_EQ(on_device.factor_calls, on_host.factor_calls);
    EXPECT_FALSE(on_host.cast_on_device);
    EXPECT_TRUE(on_device.cast_on_device);
    EXPECT_EQ(on_device.final_weights, on_host.final_weights);
    // The factors matter: rounding δ and a is not rounding δᵀ·a.
    RunSetup dense = host;
    dense.factors = false;
    RunOutcome run;
    ASSERT_NO_FATAL_FAILURE(TrainOnce(dense, &run));
    EXPECT_EQ(run.factor_calls, 0);
    EXPECT_NE(run.final_weights, on_host.final_weights) << "factors changed nothing";
  }
}

TEST(Overlap, GivesTheBlockingLoopsWeightsBitForBit) {
  RunSetup blocking;
  blocking.servers = 1;
  blocking.overlap = false;
  RunOutcome reference;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(blocking, &reference));
  EXPECT_EQ(std::count_if(reference.events.begin(), reference.events.end(),
                          [](const Event& e) { return e.kind == Event::kStartPull; }),
            0);
  for (int variant = 0; variant < 4; ++variant) {
    const bool hold = variant == 1, copies = variant == 2, by_layer = variant == 3;
    SCOPED_TRACE(hold       ? "pulls held until waited"
                 : copies   ? "copies completed later, as a GPU's"
                 : by_layer ? "sent by layer through a window of one chunk"
                            : "pulls on the wire at once");
    RunSetup overlapped = blocking;
    overlapped.overlap = true;
    overlapped.pulls = hold ? Pulls::kHeld : Pulls::kOnWire;
    overlapped.emulated_copies = copies;
    if (by_layer) {  // conv1's push and pull overtake fc1's waiting chunks; each chunk keeps its order
      overlapped.send_order = SendOrder::kLayer;
      overlapped.inflight_bytes = static_cast<uint64_t>(blocking.chunk_elems) * sizeof(float);
    }
    RunOutcome run;
    ASSERT_NO_FATAL_FAILURE(TrainOnce(overlapped, &run));
    EXPECT_GT(std::count_if(run.events.begin(), run.events.end(),
                            [](const Event& e) { return e.kind == Event::kStartPull; }),
              0);
    ASSERT_EQ(run.final_weights.size(), reference.final_weights.size());
    size_t differ = 0;
    for (size_t i = 0; i < run.final_weights.size(); ++i) differ += run.final_weights[i] != reference.final_weights[i];
    EXPECT_EQ(differ, 0u) << "of " << run.final_weights.size() << " weights";
  }
}

// worker.outstanding_steps = 2 in async (weights_lag 1): a step may compute without its own
// previous step's push. With every pull delivered as late as the trainer allows (the servers'
// weights when it was asked, written at its wait, never reported done earlier), step u computes
// on W(u-1), the servers' weights after u-1 pushes, and steps 0 and 1 on W(0): delayed SGD with
// a delay of one step, which the test computes itself and the servers must hold bit for bit.
// And no forward waits for a pull that follows the previous step's pushes.
TEST(Overlap, WithOneStepOfLagAStepComputesWithoutItsPreviousPush) {
  RunSetup lagged;
  lagged.servers = 1;
  lagged.pulls = Pulls::kSnapshot;
  lagged.weights_lag = 1;
  RunOutcome run;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(lagged, &run));

  // The step a waited pull was waited in: after the last push of the step before.
  int64_t step = 0;
  int waits = 0;
  for (const Event& e : run.events) {
    if (e.kind == Event::kPush) step = e.clock + 1;
    if (e.kind != Event::kWaitPull) continue;
    ++waits;
    // A pull for clock c follows the pushes of step c - 1; step u may lack step u - 1's only.
    EXPECT_LE(e.clock, step - 1) << "a pull that follows step " << e.clock - 1 << "'s pushes waited in step " << step;
  }
  EXPECT_GT(waits, 0);
  // The servers measure each push's staleness from the version it was computed from: step 0's
  // is 0, every later step's 1 (its own previous push applied since), not 0 as the last pulled
  // weights (newer than those computed on) would claim.
  const int64_t chunks = run.layout.num_chunks();
  EXPECT_EQ(run.staleness_chunks, kSteps * chunks);
  EXPECT_EQ(run.staleness_sum, (kSteps - 1) * chunks);

  std::unique_ptr<engine::Net> ref;
  ASSERT_NO_FATAL_FAILURE(MakeNet(&ref));
  const auto params = ref->params();
  std::vector<std::vector<float>> w = {std::vector<float>(params.begin(), params.end())};  // W(0), W(1), ...
  std::vector<float> history(params.size(), 0.0f);
  StepSource source;
  for (int u = 0; u < kSteps; ++u) {
    const std::vector<float>& used = w[static_cast<size_t>(std::max(0, u - 1))];
    std::copy(used.begin(), used.end(), params.begin());
    BatchView b;
    ASSERT_TRUE(source.Next(&b).ok());
    ref->ForwardBackward(b.data, b.labels);
    std::copy(w.back().begin(), w.back().end(), params.begin());
    ref->SgdUpdate(0.05f, 0.9f, 0.0005f, history);  // the servers' solver in TrainOnce
    w.emplace_back(params.begin(), params.end());
  }
  ASSERT_EQ(run.final_weights.size(), w.back().size());
  size_t differ = 0;
  for (size_t i = 0; i < w.back().size(); ++i) differ += run.final_weights[i] != w.back()[i];
  EXPECT_EQ(differ, 0u) << "of " << w.back().size() << " weights";
}

// The step-time breakdown's comm_ms comes from the channel's wire spans: one per waited request,
// each from its issue to its completion (never before it was issued, never after its wait
// returned), and a span is handed out once.
TEST(Overlap, ChannelReportsOneWireSpanPerWaitedRequest) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {40, 10}, 1, 1}, {"b", {40}, 1, 1}}, 1, 100, &layout).ok());
  InprocTransport transport;
  std::unique_ptr<ShardServer> shard;
  ShardOptions o;
  o.poll_interval = 5ms;
  ASSERT_TRUE(ShardServer::Create(layout, o, &shard).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport.Bind("spans-s0", &ep).ok());
  shard->Start(std::move(ep));
  {
    PsClientOptions co;
    co.server_addresses = {"spans-s0"};
    std::unique_ptr<PsClient> client;
    ASSERT_TRUE(PsClient::Create(&transport, layout, co, &client).ok());
    ASSERT_TRUE(client->Connect(5000ms).ok());
    std::vector<float> weights(static_cast<size_t>(layout.total_elems()), 0.5f);
    const std::vector<float> grads(weights.size(), 0.1f);
    ASSERT_TRUE(client->Wait(client->PushInit(weights), 5000ms).ok());
    PsChannel channel(client.get(), 5000ms);
    const double before = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    PushGroup group;
    group.server = 0;
    group.chunk_ids = {0, 1};
    ASSERT_TRUE(channel.StartPush(0, group, grads, nullptr).ok());
    PullHandle h = 0;
    const std::vector<int32_t> ids = {0, 1, 2, 3, 4};
    ASSERT_TRUE(channel.StartPull(1, ids, weights, &h).ok());
    PushInfo push_info;
    ASSERT_TRUE(channel.WaitPushes(&push_info).ok());
    PullInfo info;
    ASSERT_TRUE(channel.WaitPull(h, &info).ok());
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    EXPECT_EQ(info.version_min, 0);  // chunks 2-4 were never pushed
    EXPECT_EQ(info.version_max, 1);  // chunks 0-1 were, before the pull on the same link
    const std::vector<WireSpan> spans = channel.TakeWireSpans();
    ASSERT_EQ(spans.size(), 2u);
    for (const WireSpan& w : spans) {
      EXPECT_GE(w.issued_s, before);
      EXPECT_GE(w.done_s, w.issued_s);
      EXPECT_LE(w.done_s, after);
    }
    EXPECT_TRUE(channel.TakeWireSpans().empty());
    EXPECT_EQ(channel.WaitPull(h, &info).code(), StatusCode::kInvalidArgument);  // waited once
  }
  shard->Stop();
  EXPECT_TRUE(shard->Join().ok());
}

TEST(Overlap, SspZeroDoesNotStallOnPullsAheadOfTheClock) {
  RunSetup ssp;
  ssp.consistency.mode = ConsistencyMode::kSsp;
  ssp.consistency.staleness_bound = 0;
  RunOutcome run;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(ssp, &run));
  EXPECT_GT(std::count_if(run.events.begin(), run.events.end(),
                          [](const Event& e) { return e.kind == Event::kWaitPull; }),
            0);
}

}  // namespace
}  // namespace downpour::worker
