// factors_test.cc — sufficient-factor pushes (docs/factors.md) end to end:
//  * engine: a factored inner-product weight's gradient span holds [δ | a] with δᵀ·a equal to the
//    dW the layer computes unfactored (oneDNN and reference backends, dropout feeding the layer),
//    and the layer skips dW; only inner-product weights can be factored;
//  * a whole training run (Trainer → PsChannel → PsClient → two in-process ShardServers,
//    momentum and weight decay on, dropout active, several batches) with compression.factors on
//    ends at the weights of the same run with it off, within 1e-5 relative (bit-identical on
//    oneDNN here, <= 3e-7 on the reference backend, which sums dW in double); a too-small fc layer
//    goes dense, logged once; on a small net and on fmnist_small;
//  * client + server on chunks that cut rows (partial first and last rows, both servers); with
//    shared memory on, factor groups go over the socket and the dense chunks through the region;
//  * bad factor payloads (lengths, factorBatch 0 or huge, two tensors, no activations frame,
//    NaN, a tensor that is not a matrix, an init push) are refused and counted, weights byte for
//    byte unchanged;
//  * a large factor push is expanded off the shard's loop: another worker is served meanwhile,
//    the pusher's next pull waits behind it, and the loop never calls into its transport;
//  * a factor push whose ack died is resent (same bytes) to the server recovered from its
//    write-ahead log, recognised and applied once;
//  * the write-ahead log keeps a factor push as its factors (fewer bytes than the dense gradient),
//    and a shard recovered from it is the live one to the byte; DC-ASGD's pushes, and a factor
//    push no smaller than its gradient, are logged dense;
//  * bytes: AlexNet's push bytes per worker step at batch 128 with 2 servers, with and without
//    factors (the activations counted once per server holding the tensor).
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/ps/ps_client.h"
#include "client/worker/factor_choice.h"
#include "client/worker/ps_channel.h"
#include "client/worker/trainer.h"
#include "common/grad_codec.h"
#include "common/inproc_transport.h"
#include "downpour_config.h"
#include "server/factor_push.h"
#include "server/shard.h"
#include "tests/client/factor_product.h"
#include "tests/testing/release_counting_endpoint.h"
#include "tests/testing/stamping_endpoint.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

// data 1×16×16 → fc1 (128) → ReLU → dropout → fc2 (64) → ReLU → dropout → fc3 (4) → loss.
// At batch 8: fc1 factors 8×(128+256) = 3072 floats < 32768, fc2 1536 < 8192, fc3 544 > 256
// (too small: dense).
constexpr const char* kMlp = R"(name = "factornet"
[input]
channels = 1
height = 16
width = 16
[[layer]]
name = "fc1"
type = "InnerProduct"
bottom = ["data"]
top = ["fc1"]
num_output = 128
weight_filler = { type = "gaussian", std = 0.1 }
bias_filler = { type = "constant", value = 0.1 }
[[layer]]
name = "relu1"
type = "ReLU"
bottom = ["fc1"]
top = ["relu1"]
[[layer]]
name = "drop1"
type = "Dropout"
bottom = ["relu1"]
top = ["drop1"]
dropout_ratio = 0.5
[[layer]]
name = "fc2"
type = "InnerProduct"
bottom = ["drop1"]
top = ["fc2"]
num_output = 64
weight_filler = { type = "gaussian", std = 0.1 }
bias_filler = { type = "constant", value = 0.0 }
[[layer]]
name = "relu2"
type = "ReLU"
bottom = ["fc2"]
top = ["relu2"]
[[layer]]
name = "drop2"
type = "Dropout"
bottom = ["relu2"]
top = ["drop2"]
dropout_ratio = 0.3
[[layer]]
name = "fc3"
type = "InnerProduct"
bottom = ["drop2"]
top = ["fc3"]
num_output = 4
weight_filler = { type = "gaussian", std = 0.3 }
bias_filler = { type = "constant", value = 0.0 }
[[layer]]
name = "loss"
type = "SoftmaxWithLoss"
bottom = ["fc3", "label"]
top = ["loss"]
)";

engine::NetSpec MlpSpec() {
  engine::NetSpec spec;
  const Status s = engine::ParseNetSpecString(kMlp, "factornet", &spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return spec;
}

engine::NetSpec ModelSpec(const std::string& file) {
  engine::NetSpec spec;
  const Status s = engine::ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/" + file, &spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return spec;
}

// A batch of gaussian images and labels in [0, classes), the same for a given step.
struct Batch {
  std::vector<float> images;
  std::vector<int> labels;
};
Batch MakeBatch(const engine::NetSpec& spec, int n, int classes, int step) {
  std::mt19937 rng(static_cast<uint32_t>(7000 + step));
  std::normal_distribution<float> d(0.0f, 1.0f);
  Batch b;
  b.images.resize(static_cast<size_t>(n) * spec.input_channels * spec.input_height * spec.input_width);
  for (float& x : b.images) x = d(rng);
  for (int i = 0; i < n; ++i) b.labels.push_back(static_cast<int>(rng() % static_cast<uint32_t>(classes)));
  return b;
}

// max |a - b| / max |b|, NaN-safe (a NaN anywhere gives +inf).
double RelDiff(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= diff)) diff = std::isnan(d) ? INFINITY : d;
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

using engine::testing::DenseFromFactors;

// ---------------------------------------------------------------------------------------------
// Engine

class EngineFactors : public ::testing::TestWithParam<bool> {};  // reference backend?

// Two of the MLP at `batch` with the same weights (seed 5), on the reference backend or oneDNN.
void TwinMlps(int batch, bool reference, std::unique_ptr<engine::Net>* a, std::unique_ptr<engine::Net>* b) {
  engine::NetOptions o;
  o.batch = batch;
  o.worker.threads = 1;
  o.reference = reference;
  ASSERT_TRUE(engine::Net::Create(MlpSpec(), o, a).ok());
  ASSERT_TRUE(engine::Net::Create(MlpSpec(), o, b).ok());
  (*a)->InitParams(5);
  (*b)->InitParams(5);
}

TEST_P(EngineFactors, FactoredSpanHoldsDeltaAndInputWhoseProductIsTheLayersDW) {
  constexpr int kB = 8;
  std::unique_ptr<engine::Net> dense, factored;
  ASSERT_NO_FATAL_FAILURE(TwinMlps(kB, GetParam(), &dense, &factored));
  ASSERT_TRUE(factored->SetFactoredParams({0, 2, 4}).ok());  // fc1, fc2, fc3 weights
  std::vector<int> ready;
  factored->SetGradReadyCallback([&](int t) {
    ready.push_back(t);
    // fc3 (4×64) does not pay at batch 8: dense; fc1, fc2 hold factors when their callback fires.
    EXPECT_EQ(factored->grad_is_factored(t), t == 0 || t == 2) << "tensor " << t;
  });
  for (int step = 1; step <= 3; ++step) {  // several batches, dropout masks differ per step
    SCOPED_TRACE(fmt::format("step {}", step));
    ready.clear();
    // A sentinel in every gradient: the tail of a factored span beyond [δ | a] must keep it,
    // since the layer skips computing dW for a factored weight.
    std::fill(factored->grads().begin(), factored->grads().end(), 12345.0f);
    const Batch b = MakeBatch(dense->spec(), kB, 4, step);
    const float ld = dense->ForwardBackward(b.images.data(), b.labels.data());
    const float lf = factored->ForwardBackward(b.images.data(), b.labels.data());
    EXPECT_EQ(ld, lf);
    EXPECT_EQ(ready.size(), 6u);
    for (int t : {0, 2}) {
      int64_t out = 0, in = 0;
      ASSERT_TRUE(factored->InnerProductDims(t, &out, &in));
      const std::vector<float> g = DenseFromFactors(factored->grad(t), kB, out, in);
      EXPECT_LE(RelDiff(g, dense->grad(t)), 1e-5) << factored->param_specs()[static_cast<size_t>(t)].name;
      const auto tail = factored->grad(t).subspan(static_cast<size_t>(kB * (out + in)));
      EXPECT_TRUE(std::all_of(tail.begin(), tail.end(), [](float x) { return x == 12345.0f; }))
          << "dW was computed for " << factored->param_specs()[static_cast<size_t>(t)].name;
    }
    for (int t : {1, 3, 4, 5})  // biases and the dense fc3 weight are the usual gradients
      EXPECT_EQ(RelDiff(factored->grad(t), dense->grad(t)), 0.0) << "tensor " << t;
  }
}

// δ packed in a layout's per-chunk row blocks (chunks of 3,000 floats over 2 servers cut fc1's and
// fc2's rows): the span is the unpacked net's [δ | a] in the push's form (PackedForPush) bit for
// bit, and the rest of the span keeps its sentinel.
TEST_P(EngineFactors, PackedSpanIsThePlainSpanInTheLayoutsBlocks) {
  constexpr int kB = 8;
  std::unique_ptr<engine::Net> plain, packed;
  ASSERT_NO_FATAL_FAILURE(TwinMlps(kB, GetParam(), &plain, &packed));
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(packed->param_specs(), 2, 3000, &layout).ok());
  const std::vector<std::vector<RowSpan>> blocks = {FactorRowBlocks(layout, 0), FactorRowBlocks(layout, 2)};
  ASSERT_GT(blocks[0].size(), 1u);
  ASSERT_GT(PackedRows(blocks[0]), 128) << "no chunk cuts a row of fc1";
  ASSERT_TRUE(plain->SetFactoredParams({0, 2}).ok());
  ASSERT_TRUE(packed->SetFactoredParams({0, 2}, blocks).ok());
  for (int step = 1; step <= 2; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    std::fill(packed->grads().begin(), packed->grads().end(), 12345.0f);
    const Batch b = MakeBatch(plain->spec(), kB, 4, step);
    EXPECT_EQ(plain->ForwardBackward(b.images.data(), b.labels.data()),
              packed->ForwardBackward(b.images.data(), b.labels.data()));
    for (int t : {0, 2}) {
      ASSERT_TRUE(packed->grad_is_factored(t));
      int64_t out = 0, in = 0;
      ASSERT_TRUE(packed->InnerProductDims(t, &out, &in));
      const std::vector<float> expected = engine::testing::PackedForPush(layout, t, plain->grad(t), kB);
      const auto got = packed->grad(t);
      const size_t used = static_cast<size_t>(kB * (PackedRows(FactorRowBlocks(layout, t)) + in));
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(used), expected.begin()))
          << packed->param_specs()[static_cast<size_t>(t)].name;
      EXPECT_TRUE(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(used), got.end(),
                              [](float x) { return x == 12345.0f; }));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineFactors, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Reference") : std::string("OneDnn"); });

TEST(EngineFactorsErrors, OnlyInnerProductWeightsCanBeFactored) {
  engine::NetOptions o;
  o.batch = 4;
  std::unique_ptr<engine::Net> net;
  ASSERT_TRUE(engine::Net::Create(MlpSpec(), o, &net).ok());
  Status s = net->SetFactoredParams({1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fc1.bias"), std::string::npos) << s.ToString();
  s = net->SetFactoredParams({6});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("index 6"), std::string::npos) << s.ToString();
  std::unique_ptr<engine::Net> conv;
  ASSERT_TRUE(engine::Net::Create(ModelSpec("fmnist_small.toml"), o, &conv).ok());
  s = conv->SetFactoredParams({0});
  EXPECT_NE(s.message().find("conv1.weight"), std::string::npos) << s.ToString();
  // Row blocks (fc1 is 128 rows): one list per tensor, inside the rows, covering them in order.
  const std::vector<std::pair<std::vector<RowSpan>, std::string>> bad = {
      {{{0, 64}, {64, 65}}, "[64, 129)"},  // past the last row
      {{{0, 64}, {65, 63}}, "[65, 128)"},  // row 64 skipped
      {{{0, 64}, {10, 0}}, "[10, 10)"},    // empty
      {{{0, 100}}, "cover rows [0, 100) of 128"},
  };
  for (const auto& [blocks, says] : bad) {
    s = net->SetFactoredParams({0}, {blocks});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << says;
    EXPECT_NE(s.message().find("fc1.weight"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.ToString();
  }
  s = net->SetFactoredParams({0, 2}, {{{0, 128}}});
  EXPECT_NE(s.message().find("2 factored tensors but row blocks for 1"), std::string::npos) << s.ToString();
  EXPECT_TRUE(net->SetFactoredParams({0}, {{{0, 64}, {63, 65}}}).ok());  // row 63 in both
}

// ---------------------------------------------------------------------------------------------
// A training run through real shard servers, factors on vs off.

class StepSource : public worker::TrainSource {
 public:
  StepSource(const engine::NetSpec& spec, int batch, int classes) : spec_(spec), batch_(batch), classes_(classes) {}
  Status Next(worker::BatchView* b) override {
    current_ = MakeBatch(spec_, batch_, classes_, static_cast<int>(step_++));
    *b = worker::BatchView{current_.images.data(), current_.labels.data(), batch_,
                           spec_.input_channels, spec_.input_height, spec_.input_width, 0};
    return Status::Ok();
  }
  int64_t shard_size() const override { return 0; }
  Status SeekToStep(int64_t) override { return Status::Ok(); }

 private:
  engine::NetSpec spec_;
  int batch_, classes_;
  int64_t step_ = 0;
  Batch current_;
};

struct RunOutcome {
  std::vector<float> initial, final_weights;
  std::vector<std::string> log;
  uint64_t rejected = 0;
  int multi_chunk_pushes = 0;  // push messages of more than one chunk (only factor groups are)
};

void TrainOnce(const engine::NetSpec& spec, int batch, int classes, int steps, bool factors, RunOutcome* out,
               bool reference = false) {
  engine::NetOptions no;
  no.batch = batch;
  no.worker.threads = 2;
  no.reference = reference;  // dW in double: the factored run then differs by fp32 rounding
  std::unique_ptr<engine::Net> net;
  ASSERT_TRUE(engine::Net::Create(spec, no, &net).ok());
  net->InitParams(11);
  out->initial.assign(net->params().begin(), net->params().end());
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(net->param_specs(), 2, 3000, &layout).ok());  // tensors cut mid-row

  InprocTransport transport;
  std::vector<std::unique_ptr<ShardServer>> shards(2);
  PsClientOptions co;
  for (int s = 0; s < 2; ++s) {
    ShardOptions o;
    o.server_id = s;
    o.solver.base_lr = 0.05f;
    o.solver.momentum = 0.9f;
    o.solver.weight_decay = 0.0005f;
    o.poll_interval = 5ms;
    ASSERT_TRUE(ShardServer::Create(layout, o, &shards[static_cast<size_t>(s)]).ok());
    const std::string address = fmt::format("factors-s{}", s);
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport.Bind(address, &ep).ok());
    shards[static_cast<size_t>(s)]->Start(std::move(ep));
    co.server_addresses.push_back(address);
  }
  co.reply_timeout = 20000ms;
  co.server_wait = 20000ms;
  std::atomic<int> multi{0};
  co.on_part_reply = [&multi](int, MsgType type, size_t chunks, double) {
    if (type == MsgType::kPush && chunks > 1) ++multi;
  };
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  spdlog::default_logger()->sinks().push_back(sink);
  {
    std::unique_ptr<PsClient> client;
    ASSERT_TRUE(PsClient::Create(&transport, layout, co, &client).ok());
    ASSERT_TRUE(client->Connect(5000ms).ok());
    ASSERT_TRUE(client->Wait(client->PushInit(net->params()), 5000ms).ok());
    {
      worker::PsChannel channel(client.get(), 20000ms);
      worker::TrainerOptions to;
      to.worker.batch_size = batch;
      to.worker.steps = steps;
      to.min_push_elems = 0;
      to.overlap_pull = true;
      to.compression.factors = factors;
      StepSource source(spec, batch, classes);
      worker::Trainer trainer(to, net.get(), nullptr, &layout, &channel, &source, nullptr, nullptr, nullptr);
      worker::TrainResult r;
      const Status s = trainer.Run(&r);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(r.steps, steps);
    }
    out->final_weights.assign(static_cast<size_t>(layout.total_elems()), 0.0f);
    ASSERT_TRUE(client->Wait(client->Pull(out->final_weights), 5000ms).ok());
  }
  spdlog::default_logger()->sinks().pop_back();
  out->log = sink->last_formatted();
  out->multi_chunk_pushes = multi.load();
  for (auto& s : shards) {
    out->rejected += s->Stats().pushes_rejected;
    s->Stop();
  }
  for (auto& s : shards) EXPECT_TRUE(s->Join().ok());
}

int CountLines(const std::vector<std::string>& log, const std::string& part) {
  return static_cast<int>(std::count_if(log.begin(), log.end(), [&](const std::string& l) {
    return l.find(part) != std::string::npos;
  }));
}

// Per tensor: the factored run's weights and its update (final − initial) against the dense run's.
void ExpectSameTraining(const engine::NetSpec& spec, int batch, const RunOutcome& dense, const RunOutcome& factored) {
  std::unique_ptr<engine::Net> net;
  engine::NetOptions no;
  no.batch = batch;
  ASSERT_TRUE(engine::Net::Create(spec, no, &net).ok());
  ASSERT_EQ(dense.final_weights.size(), factored.final_weights.size());
  for (size_t t = 0; t < net->param_specs().size(); ++t) {
    const size_t off = static_cast<size_t>(net->param_offset(static_cast<int>(t)));
    const size_t n = static_cast<size_t>(net->param_specs()[t].numel());
    std::span<const float> wd(dense.final_weights.data() + off, n), wf(factored.final_weights.data() + off, n);
    std::vector<float> ud(n), uf(n);
    for (size_t i = 0; i < n; ++i) {
      ud[i] = wd[i] - dense.initial[off + i];
      uf[i] = wf[i] - factored.initial[off + i];
    }
    const double rel_w = RelDiff(wf, wd), rel_u = RelDiff(uf, ud);
    std::printf("%-12s weights rel %.2e, update rel %.2e\n", net->param_specs()[t].name.c_str(), rel_w, rel_u);
    EXPECT_LE(rel_w, 1e-5) << net->param_specs()[t].name;
    EXPECT_LE(rel_u, 1e-5) << net->param_specs()[t].name << " (update)";
    float moved = 0.0f;
    for (float u : ud) moved = std::max(moved, std::fabs(u));
    EXPECT_GT(moved, 0.0f) << "the dense run did not train " << net->param_specs()[t].name;
  }
}

TEST(FactorTraining, SmallNetWithDropoutEqualsTheDenseRunAndTheSmallFcGoesDenseLoggedOnce) {
  const engine::NetSpec spec = MlpSpec();
  RunOutcome dense, factored;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 8, 4, 6, false, &dense));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 8, 4, 6, true, &factored));
  EXPECT_EQ(dense.rejected, 0u);
  EXPECT_EQ(factored.rejected, 0u);
  EXPECT_EQ(dense.multi_chunk_pushes, 0);
  EXPECT_GT(factored.multi_chunk_pushes, 0) << "no factor group went on the wire";
  ExpectSameTraining(spec, 8, dense, factored);
  EXPECT_EQ(CountLines(factored.log, "'fc1.weight' (128×256) pushed as sufficient factors"), 1);
  EXPECT_EQ(CountLines(factored.log, "'fc2.weight' (64×128) pushed as sufficient factors"), 1);
  EXPECT_EQ(CountLines(factored.log, "'fc3.weight' (4×64) pushed dense"), 1);
  EXPECT_EQ(CountLines(dense.log, "sufficient factors"), 0);
}

TEST(FactorTraining, OnTheReferenceBackendTheRunsDifferOnlyByRounding) {
  // The reference backend sums dW in double; the server's sgemm in float: not bit-identical, but
  // within 1e-5 relative after several momentum steps.
  const engine::NetSpec spec = MlpSpec();
  RunOutcome dense, factored;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 8, 4, 6, false, &dense, /*reference=*/true));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 8, 4, 6, true, &factored, /*reference=*/true));
  EXPECT_GT(factored.multi_chunk_pushes, 0);
  ExpectSameTraining(spec, 8, dense, factored);
  EXPECT_NE(dense.final_weights, factored.final_weights) << "expected fp32 rounding differences";
}

TEST(FactorTraining, FmnistSmallEqualsTheDenseRun) {
  const engine::NetSpec spec = ModelSpec("fmnist_small.toml");
  RunOutcome dense, factored;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 16, 10, 4, false, &dense));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(spec, 16, 10, 4, true, &factored));
  EXPECT_EQ(dense.multi_chunk_pushes, 0);
  EXPECT_GT(factored.multi_chunk_pushes, 0) << "no factor group went on the wire";
  ExpectSameTraining(spec, 16, dense, factored);
  EXPECT_EQ(CountLines(factored.log, "'fc1.weight' (256×2304) pushed as sufficient factors"), 1);
  EXPECT_EQ(CountLines(factored.log, "'fc2.weight' (10×256) pushed dense"), 1);
}

// The MLP at batch 8 and its layout over `servers` servers of 3000-float chunks.
void MlpAtBatch8(int servers, std::unique_ptr<engine::Net>* net, ParamLayout* layout) {
  engine::NetOptions no;
  no.batch = 8;
  ASSERT_TRUE(engine::Net::Create(MlpSpec(), no, net).ok());
  ASSERT_TRUE(ParamLayout::Build((*net)->param_specs(), servers, 3000, layout).ok());
}

TEST(FactorTraining, PushEveryAboveOneFallsBackToDenseWithOneLine) {
  std::unique_ptr<engine::Net> net;
  ParamLayout layout;
  ASSERT_NO_FATAL_FAILURE(MlpAtBatch8(2, &net, &layout));
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100);
  spdlog::default_logger()->sinks().push_back(sink);
  const std::vector<int> chosen = worker::ChooseFactoredTensors(*net, layout, {true, 2, -1, true, 3});
  const std::vector<int> clipped = worker::ChooseFactoredTensors(*net, layout, {true, 1, 10.0, true, 3});
  const std::vector<int> on = worker::ChooseFactoredTensors(*net, layout, {true, 1, -1, true, 3});
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_TRUE(chosen.empty());
  EXPECT_TRUE(clipped.empty());
  EXPECT_EQ(on, (std::vector<int>{0, 2}));
  EXPECT_EQ(CountLines(sink->last_formatted(), "push_every > 1"), 1);
  EXPECT_EQ(CountLines(sink->last_formatted(), "clip_gradients"), 1);
}

// The choice counts what goes on the wire: a to every server holding rows of the weight. fc1
// (128×256, 32,768 floats) at batch 8 has 8×(128+256) = 3,072 floats of factors, but over 24
// servers of ~1,726 floats it is held by 19 of them, and 19 copies of a (19×2,048) outweigh dW:
// dense, with one line naming the servers. fc2 (64×128) on 5 servers still pays; fc3 (4×64)
// never does. FactorWireFloats counts as FactorPushPayloadBytes does.
TEST(FactorTraining, AWeightSpreadOverManyServersStaysDenseWhenTheActivationsCopiesOutweighIt) {
  std::unique_ptr<engine::Net> net;
  ParamLayout layout;
  ASSERT_NO_FATAL_FAILURE(MlpAtBatch8(24, &net, &layout));
  int fc1_servers = 0, fc2_servers = 0;
  const int64_t fc1 = FactorWireFloats(layout, 0, 8, &fc1_servers), fc2 = FactorWireFloats(layout, 2, 8, &fc2_servers);
  EXPECT_EQ(fc1_servers, 19);
  EXPECT_EQ(fc2_servers, 5);
  EXPECT_GT(fc1, 128 * 256);
  EXPECT_LT(fc2, 64 * 128);
  // Counted by hand: each chunk's δ rows (rows cut by a chunk boundary in both) plus a per server.
  for (const auto& [t, servers, floats] : {std::tuple{0, fc1_servers, fc1}, std::tuple{2, fc2_servers, fc2}}) {
    const TensorSpec& spec = layout.tensors()[static_cast<size_t>(t)];
    const int64_t in = spec.shape[1], begin = layout.tensor_flat_offset(t);
    int64_t expect = 8 * in * servers;
    for (int32_t id : layout.ChunksInRange(begin, begin + spec.numel())) {
      const Chunk& c = layout.chunk(id);
      expect += 8 * ((c.tensor_offset + c.count - 1) / in - c.tensor_offset / in + 1);
    }
    EXPECT_EQ(floats, expect) << spec.name;
  }
  const std::vector<FactorTensor> both{{0, 8}, {2, 8}};
  EXPECT_EQ(FactorPushPayloadBytes(layout, both), 4u * static_cast<uint64_t>(layout.total_elems() - 128 * 256 - 64 * 128 + fc1 + fc2));

  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100);
  spdlog::default_logger()->sinks().push_back(sink);
  const std::vector<int> on = worker::ChooseFactoredTensors(*net, layout, {true, 1, -1, true, 3});
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(on, (std::vector<int>{2}));
  EXPECT_EQ(CountLines(sink->last_formatted(),
                       fmt::format("'fc1.weight' (128×256) pushed dense: 19 servers hold it, and its factors at batch 8 "
                                   "with a to each of them would be {} floats, dW is 32768", fc1)),
            1);
  EXPECT_EQ(CountLines(sink->last_formatted(), "'fc2.weight' (64×128) pushed as sufficient factors: δ 8×64 and a 8×128 "
                                               "to each of the 5 server(s) holding it"),
            1);
  EXPECT_EQ(CountLines(sink->last_formatted(), "'fc3.weight' (4×64) pushed dense: its factors at batch 8 would be"), 1);
}

// ---------------------------------------------------------------------------------------------
// Client + server on a small model: chunks that cut rows, both servers, and bad payloads.

// A peer of a shard without a PsClient, for pushes a client would not send: a header and payload
// frames out, one reply in.
class RawPeer {
 public:
  Status Connect(InprocTransport* transport, const std::string& address) {
    return transport->Connect(address, &ep_);
  }
  void Send(const MessageHeader& h, Frames payload) {
    Frames f(1);
    ASSERT_TRUE(HeaderFrame(h, &f[0]).ok());
    for (auto& p : payload) f.push_back(std::move(p));
    ASSERT_TRUE(ep_->Send(std::move(f)).ok());
  }
  MessageHeader Receive() {
    Frames f;
    EXPECT_TRUE(ep_->Receive(&f, 5000ms).ok());
    MessageHeader h;
    EXPECT_TRUE(ParseHeader(f, &h).ok());
    return h;
  }
  // A reply within `timeout`, or false.
  bool TryReceive(MessageHeader* h, std::chrono::milliseconds timeout) {
    Frames f;
    if (!ep_->Receive(&f, timeout).ok()) return false;
    return ParseHeader(f, h).ok();
  }
  void Close() { ep_.reset(); }

 private:
  std::unique_ptr<ClientEndpoint> ep_;
};

class FactorShard : public ::testing::Test {
 protected:
  static constexpr int kB = 2;                 // 2×(9 packed rows + 5) = 28 floats of factors fit W's 30
  static constexpr int64_t kOut = 6, kIn = 5;  // W 6×5; chunks of 8 floats cut rows

  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"w", {kOut, kIn}, 1.0f, 1.0f}, {"b", {kOut}, 2.0f, 0.0f}, {"v", {4, 3}, 1.0f, 1.0f}},
                                   2, 8, &layout_).ok());
    for (int s = 0; s < 2; ++s) {
      ShardOptions o;
      o.server_id = s;
      o.solver.base_lr = 0.5f;
      o.solver.momentum = 0.9f;
      o.solver.weight_decay = 0.01f;
      o.cluster.max_workers = 2;  // worker 1: the shared-memory client
      std::unique_ptr<ShardServer> shard;
      ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
      std::unique_ptr<ServerEndpoint> ep;
      ASSERT_TRUE(transport_.Bind(fmt::format("fshard{}", s), &ep).ok());
      addresses_.push_back(ep->address());
      shard->Start(std::move(ep));
      shards_.push_back(std::move(shard));
    }
    client_ = Client(0);
    std::vector<float> w0(static_cast<size_t>(layout_.total_elems()));
    for (size_t i = 0; i < w0.size(); ++i) w0[i] = 0.5f + 0.125f * static_cast<float>(i % 13);
    ASSERT_TRUE(client_->Wait(client_->PushInit(w0), 5000ms).ok());
  }
  void TearDown() override {
    client_.reset();
    for (auto& s : shards_) s->Stop();
    for (auto& s : shards_) EXPECT_TRUE(s->Join().ok());
  }
  std::unique_ptr<PsClient> Client(int worker, bool shared_memory = false) {
    PsClientOptions o;
    o.server_addresses = addresses_;
    o.worker_id = worker;
    o.reply_timeout = 10000ms;
    o.checksums = true;
    o.shared_memory = shared_memory;
    std::unique_ptr<PsClient> c;
    EXPECT_TRUE(PsClient::Create(&transport_, layout_, o, &c).ok());
    EXPECT_TRUE(c->Connect(5000ms).ok());
    return c;
  }
  std::vector<float> AllWeights() const {
    std::vector<float> w(static_cast<size_t>(layout_.total_elems()));
    for (const Chunk& c : layout_.chunks()) {
      auto cw = shards_[static_cast<size_t>(c.server)]->ChunkWeights(c.id);
      std::copy(cw.begin(), cw.end(), w.begin() + c.flat_offset);
    }
    return w;
  }
  uint64_t Rejected(RejectReason r) const {
    uint64_t n = 0;
    for (const auto& s : shards_) n += s->Stats().rejected_by_reason[static_cast<size_t>(r)];
    return n;
  }

  InprocTransport transport_;
  ParamLayout layout_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ShardServer>> shards_;
  std::unique_ptr<PsClient> client_;
};

TEST_F(FactorShard, ChunksCuttingRowsOnTwoServersApplyTheDenseUpdate) {
  // Three factor pushes of "w" (with the dense "b" and "v" in the same requests) through the
  // client and servers, against a twin pair of servers taking δᵀ·a dense: momentum and weight
  // decay carry each step into the next.
  InprocTransport twin_transport;
  std::vector<std::unique_ptr<ShardServer>> twin;
  PsClientOptions to;
  for (int s = 0; s < 2; ++s) {
    ShardOptions o;
    o.server_id = s;
    o.solver.base_lr = 0.5f;
    o.solver.momentum = 0.9f;
    o.solver.weight_decay = 0.01f;
    std::unique_ptr<ShardServer> shard;
    ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(twin_transport.Bind(fmt::format("twin{}", s), &ep).ok());
    to.server_addresses.push_back(ep->address());
    shard->Start(std::move(ep));
    twin.push_back(std::move(shard));
  }
  std::unique_ptr<PsClient> dense_client;
  ASSERT_TRUE(PsClient::Create(&twin_transport, layout_, to, &dense_client).ok());
  ASSERT_TRUE(dense_client->Connect(5000ms).ok());
  std::vector<float> w0 = AllWeights();
  ASSERT_TRUE(dense_client->Wait(dense_client->PushInit(w0), 5000ms).ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> plain(static_cast<size_t>(layout_.total_elems())), dense(plain.size());
    for (float& x : plain) x = d(rng);
    dense = plain;
    const std::vector<float> g =
        DenseFromFactors(std::span<const float>(plain).subspan(0, kB * (kOut + kIn)), kB, kOut, kIn);
    std::copy(g.begin(), g.end(), dense.begin());
    // w's δ packed by its chunks, as the worker's net writes it.
    const std::vector<float> factored = engine::testing::PackedForPush(layout_, 0, plain, kB);
    const std::vector<FactorTensor> f = {{0, kB}};
    const Status s = client_->Wait(client_->PushTensors(factored, 0, 3, step, f), 5000ms);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(dense_client->Wait(dense_client->PushTensors(dense, 0, 3, step), 5000ms).ok());
  }
  std::vector<float> twin_w(static_cast<size_t>(layout_.total_elems()));
  ASSERT_TRUE(dense_client->Wait(dense_client->Pull(twin_w), 5000ms).ok());
  EXPECT_LE(RelDiff(AllWeights(), twin_w), 1e-6);
  EXPECT_NE(AllWeights(), w0);
  // Both servers took factor chunks of "w" (layout: 8-float chunks dealt over 2 servers).
  bool server_has_w[2] = {false, false};
  for (const Chunk& c : layout_.chunks())
    if (c.tensor == 0) server_has_w[c.server] = true;
  EXPECT_TRUE(server_has_w[0] && server_has_w[1]);
  dense_client.reset();
  for (auto& s : twin) s->Stop();
  for (auto& s : twin) EXPECT_TRUE(s->Join().ok());
}

TEST_F(FactorShard, WithSharedMemoryFactorGroupsTakeTheSocketAndDenseChunksTheRegion) {
  std::unique_ptr<PsClient> shm = Client(1, /*shared_memory=*/true);
  std::vector<float> g(static_cast<size_t>(layout_.total_elems()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 17);
  const std::vector<float> before = AllWeights();
  const uint64_t region_before = shards_[0]->Stats().region_parts + shards_[1]->Stats().region_parts;
  const std::vector<FactorTensor> f = {{0, kB}};
  for (int step = 0; step < 3; ++step) {
    const Status s = shm->Wait(shm->PushTensors(g, 0, 3, step, f), 5000ms);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // The dense chunks ("b", "v") went through the region, three pushes each.
  EXPECT_GE(shards_[0]->Stats().region_parts + shards_[1]->Stats().region_parts, region_before + 3);
  EXPECT_EQ(shards_[0]->Stats().pushes_rejected + shards_[1]->Stats().pushes_rejected, 0u);
  EXPECT_NE(AllWeights(), before);
  // The factor expander's time forming δᵀ·a is counted (server_end's factor_s), beside the loop's.
  for (const auto& s : shards_) EXPECT_GT(s->Stats().factor_ns, 0u);
}

TEST_F(FactorShard, ClientRefusesATensorThatCannotHoldFactors) {
  std::vector<float> g(static_cast<size_t>(layout_.total_elems()), 1.0f);
  const std::vector<FactorTensor> bias = {{1, 1}}, too_big = {{0, 3}};
  Status s = client_->Wait(client_->PushTensors(g, 0, 3, 0, bias), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s.ToString();
  s = client_->Wait(client_->PushTensors(g, 0, 3, 0, too_big), 5000ms);  // 3×(9 packed rows + 5) > 30
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch 3"), std::string::npos) << s.ToString();
  const std::vector<float> now = AllWeights();
  std::vector<float> pulled(now.size());
  ASSERT_TRUE(client_->Wait(client_->Pull(pulled), 5000ms).ok());
  EXPECT_EQ(pulled, now);
}

// A server endpoint that notes where the frames of each factor push it receives point (the
// in-process transport hands frames over as they are, so these are the client's own bytes).
class FramePointerEndpoint : public ServerEndpoint {
 public:
  explicit FramePointerEndpoint(std::unique_ptr<ServerEndpoint> inner) : inner_(std::move(inner)) {}
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    DP_RETURN_IF_ERROR(inner_->Receive(from, frames, timeout, info));
    MessageHeader h;
    if (ParseHeader(*frames, &h).ok() && h.type == MsgType::kPush && !h.encodings.empty() &&
        h.encodings[0] == Encoding::kFactors) {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<std::pair<const std::byte*, size_t>> seen;
      for (size_t i = 1; i < frames->size(); ++i) seen.emplace_back((*frames)[i].data(), (*frames)[i].size());
      factor_pushes_.push_back(std::move(seen));
      factor_dtypes_.push_back(h.dtype);
    }
    return Status::Ok();
  }
  Status Send(const PeerId& to, Frames frames) override { return inner_->Send(to, std::move(frames)); }
  std::string address() const override { return inner_->address(); }
  void Wake() override { inner_->Wake(); }
  std::vector<std::vector<std::pair<const std::byte*, size_t>>> factor_pushes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return factor_pushes_;
  }
  std::vector<DType> factor_dtypes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return factor_dtypes_;
  }

 private:
  std::unique_ptr<ServerEndpoint> inner_;
  mutable std::mutex mu_;
  std::vector<std::vector<std::pair<const std::byte*, size_t>>> factor_pushes_;
  std::vector<DType> factor_dtypes_;
};

// The client copies no factor: each chunk's frame is its block of the caller's packed δ, and the
// activations frame is a, both where they lie in the caller's buffer (w 6×5 in four chunks of at
// most 8 floats, some cutting a row).
TEST(FactorClient, FactorFramesAreTheCallersPackedBlocksNotCopies) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}}, 1, 8, &layout).ok());
  InprocTransport transport;
  std::unique_ptr<ServerEndpoint> bound;
  ASSERT_TRUE(transport.Bind("zero-copy", &bound).ok());
  auto recording = std::make_unique<FramePointerEndpoint>(std::move(bound));
  FramePointerEndpoint* ep = recording.get();
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout, ShardOptions{}, &shard).ok());
  shard->Start(std::move(recording));
  PsClientOptions co;
  co.server_addresses = {"zero-copy"};
  co.checksums = true;
  std::unique_ptr<PsClient> client;
  ASSERT_TRUE(PsClient::Create(&transport, layout, co, &client).ok());
  ASSERT_TRUE(client->Connect(5000ms).ok());
  std::vector<float> g(static_cast<size_t>(layout.total_elems()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 23) - 0.1f;
  ASSERT_TRUE(client->Wait(client->PushInit(g), 5000ms).ok());
  const std::vector<FactorTensor> f = {{0, 2}};
  const Status s = client->Wait(client->PushTensors(g, 0, 2, 0, f), 5000ms);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto pushes = ep->factor_pushes();
  ASSERT_EQ(pushes.size(), 1u);
  const auto* base = reinterpret_cast<const std::byte*>(g.data());
  const std::vector<RowSpan> blocks = FactorRowBlocks(layout, 0);
  ASSERT_EQ(pushes[0].size(), blocks.size() + 1);  // each chunk's block, then a
  size_t at = 0;                                   // floats
  for (size_t k = 0; k < blocks.size(); ++k) {
    EXPECT_EQ(pushes[0][k].first, base + at * sizeof(float)) << "chunk " << k << "'s block was copied";
    EXPECT_EQ(pushes[0][k].second, static_cast<size_t>(2 * blocks[k].rows) * sizeof(float));
    at += static_cast<size_t>(2 * blocks[k].rows);
  }
  EXPECT_GT(at, 2u * 6) << "no chunk cuts a row";
  EXPECT_EQ(pushes[0].back().first, base + at * sizeof(float)) << "a was copied";
  EXPECT_EQ(pushes[0].back().second, 2 * 5 * sizeof(float));
  EXPECT_EQ(shard->Stats().pushes_rejected, 0u);
  client.reset();
  shard->Stop();
  EXPECT_TRUE(shard->Join().ok());
}

// x rounded to `dtype` (f16 / bf16) and widened back, as the host encoder and the server do.
std::vector<float> Rounded(std::span<const float> x, DType dtype) {
  std::vector<std::byte> bytes;
  EncodeDense(x, dtype, &bytes);
  std::vector<float> out(x.size());
  DecodeCheckedChunk(Encoding::kDense, dtype, bytes, out);
  return out;
}

// With compression.push = fp16 / bf16 a factor message carries its δ blocks and a in 16 bits
// (half the bytes, CRC-32Cs over them), and the server applies the update those values make:
// that of a dense f32 push of δᵀ·a formed from them, to within the sgemm's rounding. A message
// holding a value fp16 cannot (beyond ±65504) goes f32 as it is; bf16 holds it.
TEST(FactorClient, SixteenBitCodecsSendFactorsInSixteenBitsAndTheServerWidensThem) {
  constexpr int64_t kB = 2, kOut = 6, kIn = 5;
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"w", {kOut, kIn}, 1.0f, 1.0f}, {"b", {kOut}, 2.0f, 0.0f}}, 1, 8, &layout).ok());
  const std::vector<RowSpan> blocks = FactorRowBlocks(layout, 0);
  for (const WireCodec codec : {WireCodec::kFp16, WireCodec::kBf16}) {
    for (const bool big : {false, true}) {
      SCOPED_TRACE(fmt::format("{}{}", WireCodecName(codec), big ? ", a value of 1e5" : ""));
      const DType dtype = CodecDType(codec);
      InprocTransport transport;
      ShardOptions so;
      so.solver.base_lr = 0.5f;
      so.solver.momentum = 0.9f;
      std::unique_ptr<ServerEndpoint> bound, twin_ep;
      ASSERT_TRUE(transport.Bind("sixteen", &bound).ok());
      ASSERT_TRUE(transport.Bind("twin", &twin_ep).ok());
      auto recording = std::make_unique<FramePointerEndpoint>(std::move(bound));
      FramePointerEndpoint* ep = recording.get();
      std::unique_ptr<ShardServer> shard, twin;
      ASSERT_TRUE(ShardServer::Create(layout, so, &shard).ok());
      ASSERT_TRUE(ShardServer::Create(layout, so, &twin).ok());
      shard->Start(std::move(recording));
      twin->Start(std::move(twin_ep));
      PsClientOptions co;
      co.checksums = true;
      co.server_addresses = {"twin"};
      std::unique_ptr<PsClient> client, dense_client;
      ASSERT_TRUE(PsClient::Create(&transport, layout, co, &dense_client).ok());
      co.server_addresses = {"sixteen"};
      co.compression.push = codec;
      ASSERT_TRUE(PsClient::Create(&transport, layout, co, &client).ok());
      ASSERT_TRUE(client->Connect(5000ms).ok());
      ASSERT_TRUE(dense_client->Connect(5000ms).ok());
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      std::vector<float> w0(static_cast<size_t>(layout.total_elems()));
      for (float& x : w0) x = d(rng);
      ASSERT_TRUE(client->Wait(client->PushInit(w0), 5000ms).ok());
      ASSERT_TRUE(dense_client->Wait(dense_client->PushInit(w0), 5000ms).ok());
      // plain: [δ (B×out) | a (B×in)] in w's span, then b; the client gets δ packed by chunk.
      std::vector<float> plain(w0.size());
      for (float& x : plain) x = d(rng);
      if (big) plain[kB * kOut] = 1e5f;  // a's first value
      const int64_t factor_floats = kB * (kOut + kIn);
      const bool sixteen = !(big && codec == WireCodec::kFp16);
      std::vector<float> sent = Rounded(plain, dtype);  // b always goes 16-bit
      if (!sixteen) std::copy(plain.begin(), plain.begin() + factor_floats, sent.begin());
      std::vector<float> dense = sent;
      const std::vector<float> g =
          DenseFromFactors(std::span<const float>(sent).subspan(0, factor_floats), kB, kOut, kIn);
      std::copy(g.begin(), g.end(), dense.begin());
      const std::vector<FactorTensor> f = {{0, static_cast<int>(kB)}};
      const std::vector<float> packed = engine::testing::PackedForPush(layout, 0, plain, kB);
      Status s = client->Wait(client->PushTensors(packed, 0, 2, 0, f), 5000ms);
      ASSERT_TRUE(s.ok()) << s.ToString();
      s = dense_client->Wait(dense_client->PushTensors(dense, 0, 2, 0), 5000ms);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const auto pushes = ep->factor_pushes();
      const auto dtypes = ep->factor_dtypes();
      ASSERT_EQ(pushes.size(), 1u);
      ASSERT_EQ(pushes[0].size(), blocks.size() + 1);  // each chunk's block, then a
      EXPECT_EQ(dtypes[0], sixteen ? dtype : DType::kF32);
      const size_t elem = sixteen ? 2 : 4;
      for (size_t k = 0; k < blocks.size(); ++k)
        EXPECT_EQ(pushes[0][k].second, static_cast<size_t>(kB * blocks[k].rows) * elem) << "chunk " << k;
      EXPECT_EQ(pushes[0].back().second, static_cast<size_t>(kB * kIn) * elem);
      EXPECT_EQ(shard->Stats().pushes_rejected, 0u);
      std::vector<float> got(w0.size()), want(w0.size());
      ASSERT_TRUE(client->Wait(client->Pull(got), 5000ms).ok());
      ASSERT_TRUE(dense_client->Wait(dense_client->Pull(want), 5000ms).ok());
      EXPECT_LE(RelDiff(got, want), 1e-6);
      EXPECT_NE(got, w0);
      client.reset();
      dense_client.reset();
      shard->Stop();
      twin->Stop();
      EXPECT_TRUE(shard->Join().ok());
      EXPECT_TRUE(twin->Join().ok());
    }
  }
}

// Bad payloads from a raw peer: refused, counted by reason, weights byte for byte unchanged.
class BadFactors : public FactorShard {
 protected:
  void SetUp() override {
    FactorShard::SetUp();
    before_ = AllWeights();
    // Server 1 holds the last rows of "w", all of "b" and "v" (the layout deals chunks in order).
    ASSERT_TRUE(peer_.Connect(&transport_, addresses_[1]).ok());
    MessageHeader h;
    h.type = MsgType::kRegister;
    h.sender = 0;
    h.layout_hash = layout_.hash();
    Send(h, {});
    ASSERT_EQ(Receive().type, MsgType::kRegisterReply);
    for (int32_t id : layout_.ServerChunks(1))
      if (layout_.chunk(id).tensor == 0) w_chunks_.push_back(id);
    ASSERT_FALSE(w_chunks_.empty());
  }
  void Send(const MessageHeader& h, Frames payload) { peer_.Send(h, std::move(payload)); }
  MessageHeader Receive() { return peer_.Receive(); }
  int64_t Rows(int32_t id) const {
    const Chunk& c = layout_.chunk(id);
    return (c.tensor_offset + c.count - 1) / kIn - c.tensor_offset / kIn + 1;
  }
  // A valid factor push of server 1's chunks of "w" (all of them), batch kB.
  void GoodPush(MessageHeader* h, std::vector<std::vector<float>>* frames) const {
    h->type = MsgType::kPush;
    h->sender = 0;
    h->request_id = 77;
    h->layout_hash = layout_.hash();
    frames->clear();
    for (int32_t id : w_chunks_) {
      h->chunk_ids.push_back(static_cast<uint32_t>(id));
      h->versions.push_back(0);
      h->elem_counts.push_back(static_cast<uint64_t>(layout_.chunk(id).count));
      h->byte_lengths.push_back(static_cast<uint64_t>(kB * Rows(id) * 4));
      h->encodings.push_back(Encoding::kFactors);
      frames->push_back(std::vector<float>(static_cast<size_t>(kB * Rows(id)), 0.25f));
    }
    h->factor_batch = kB;
    frames->push_back(std::vector<float>(static_cast<size_t>(kB * kIn), 0.5f));  // a
  }
  // GoodPush with its header saying `dtype` (f16 / bf16): frames from SixteenBitFrames.
  void GoodPush16(DType dtype, MessageHeader* h, std::vector<std::vector<float>>* frames) const {
    GoodPush(h, frames);
    h->dtype = dtype;
    for (auto& n : h->byte_lengths) n /= 2;
  }
  static Frames ToFrames(const std::vector<std::vector<float>>& v) {
    Frames f;
    for (const auto& x : v) f.push_back(Frame::Copy(x.data(), x.size() * 4));
    return f;
  }
  void ExpectRefused(RejectReason reason, const std::string& text) {
    const MessageHeader r = Receive();
    EXPECT_EQ(r.type, MsgType::kError);
    EXPECT_NE(r.error_text.find(text), std::string::npos) << r.error_text;
    EXPECT_EQ(Rejected(reason), 1u) << RejectReasonName(reason);
    const std::vector<float> now = AllWeights();
    EXPECT_EQ(std::memcmp(now.data(), before_.data(), now.size() * 4), 0) << "weights changed";
  }

  RawPeer peer_;
  std::vector<float> before_;
  std::vector<int32_t> w_chunks_;
};

TEST_F(BadFactors, TheGoodPushIsTaken) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  Send(h, ToFrames(f));
  EXPECT_EQ(Receive().type, MsgType::kAck);
  EXPECT_NE(AllWeights(), before_);
}

TEST_F(BadFactors, DeltaFrameOfTheWrongLength) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  f[0].pop_back();
  h.byte_lengths[0] -= 4;
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kByteLength, "bytes of delta");
}

TEST_F(BadFactors, ActivationsFrameOfTheWrongLength) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  f.back().push_back(1.0f);
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kByteLength, "activations frame");
}

// The good push's values as bf16: taken. A bf16 message of factors with a dense chunk in it, or
// a δ frame of f32 length, or a NaN among its halves: refused.
Frames SixteenBitFrames(const std::vector<std::vector<float>>& v, DType dtype) {
  Frames f;
  for (const auto& x : v) {
    std::vector<std::byte> bytes;
    EncodeDense(x, dtype, &bytes);
    f.push_back(Frame::Copy(bytes.data(), bytes.size()));
  }
  return f;
}

TEST_F(BadFactors, TheGoodPushInBf16IsTaken) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush16(DType::kBf16, &h, &f);
  Send(h, SixteenBitFrames(f, DType::kBf16));
  EXPECT_EQ(Receive().type, MsgType::kAck);
  EXPECT_NE(AllWeights(), before_);
}

TEST_F(BadFactors, ASixteenBitDeltaFrameOfF32Length) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush16(DType::kF16, &h, &f);
  h.byte_lengths[0] *= 2;  // δ's frame and its length f32's
  Frames frames = SixteenBitFrames(f, DType::kF16);
  frames[0] = Frame::Copy(f[0].data(), f[0].size() * 4);
  Send(h, std::move(frames));
  ExpectRefused(RejectReason::kByteLength, "bytes of delta");
}

TEST_F(BadFactors, ADenseChunkInASixteenBitMessageOfFactors) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush16(DType::kF16, &h, &f);
  int32_t b_chunk = -1;  // server 1 holds "b": sent dense beside the factors
  for (int32_t id : layout_.ServerChunks(1))
    if (layout_.chunk(id).tensor == 1) b_chunk = id;
  ASSERT_GE(b_chunk, 0);
  const auto count = static_cast<uint64_t>(layout_.chunk(b_chunk).count);
  h.chunk_ids.push_back(static_cast<uint32_t>(b_chunk));
  h.versions.push_back(0);
  h.elem_counts.push_back(count);
  h.byte_lengths.push_back(count * 2);
  h.encodings.push_back(Encoding::kDense);
  f.insert(f.end() - 1, std::vector<float>(count, 0.25f));
  Send(h, SixteenBitFrames(f, DType::kF16));
  ExpectRefused(RejectReason::kDType, "factor chunks only");
}

TEST_F(BadFactors, NaNInSixteenBitActivations) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush16(DType::kF16, &h, &f);
  f.back()[1] = std::nanf("");
  Send(h, SixteenBitFrames(f, DType::kF16));
  ExpectRefused(RejectReason::kNonFinite, "activations");
}

TEST_F(BadFactors, FactorBatchZero) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  h.factor_batch = 0;
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kElemCount, "factorBatch 0");
}

TEST_F(BadFactors, FactorBatchHuge) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  h.factor_batch = 1u << 30;
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kElemCount, "factorBatch 1073741824");
}

TEST_F(BadFactors, FactorChunksOfTwoTensors) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  int32_t v_chunk = -1;
  for (int32_t id : layout_.ServerChunks(1))
    if (layout_.chunk(id).tensor == 2) v_chunk = id;
  ASSERT_GE(v_chunk, 0);
  const Chunk& c = layout_.chunk(v_chunk);
  const int64_t rows = (c.tensor_offset + c.count - 1) / 3 - c.tensor_offset / 3 + 1;
  h.chunk_ids.push_back(static_cast<uint32_t>(v_chunk));
  h.versions.push_back(0);
  h.elem_counts.push_back(static_cast<uint64_t>(c.count));
  h.byte_lengths.push_back(static_cast<uint64_t>(kB * rows * 4));
  h.encodings.push_back(Encoding::kFactors);
  f.insert(f.end() - 1, std::vector<float>(static_cast<size_t>(kB * rows), 1.0f));
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kDType, "two tensors");
}

TEST_F(BadFactors, MissingActivationsFrame) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  f.pop_back();
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kFrameCount, "activations");
}

TEST_F(BadFactors, NaNInDelta) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  f[1][1] = std::nanf("");
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kNonFinite, "NaN");
}

TEST_F(BadFactors, InfInActivations) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  f.back()[2] = INFINITY;
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kNonFinite, "activations");
}

// Finite δ and a whose product is not: refused like a NaN, nothing applied.
TEST_F(BadFactors, FactorsWhoseProductOverflowsAreRefused) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  for (auto& x : f) std::fill(x.begin(), x.end(), 1e20f);  // Σ_b δa = 2e40 > FLT_MAX
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kNonFinite, "overflows");
}

// Large factors the bound cannot clear (Σ_b |δ| × max |a| = 1e40) but whose product is finite
// (image 0's huge δ meets tiny activations, image 1's huge activations a zero δ): scanned, taken.
TEST_F(BadFactors, LargeFactorsWithAFiniteProductAreTaken) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  for (size_t i = 0; i + 1 < f.size(); ++i) {
    const size_t rows = f[i].size() / kB;
    std::fill(f[i].begin(), f[i].begin() + static_cast<std::ptrdiff_t>(rows), 1e30f);  // image 0
    std::fill(f[i].begin() + static_cast<std::ptrdiff_t>(rows), f[i].end(), 0.0f);     // image 1
  }
  std::fill(f.back().begin(), f.back().begin() + kIn, 1e-30f);  // a: image 0
  std::fill(f.back().begin() + kIn, f.back().end(), 1e10f);     // a: image 1
  Send(h, ToFrames(f));
  EXPECT_EQ(Receive().type, MsgType::kAck);
  EXPECT_EQ(Rejected(RejectReason::kNonFinite), 0u);
  EXPECT_NE(AllWeights(), before_);
}

TEST_F(BadFactors, ABiasCannotCarryFactors) {
  int32_t b_chunk = -1;
  for (int32_t id : layout_.ServerChunks(1))
    if (layout_.chunk(id).tensor == 1) b_chunk = id;
  ASSERT_GE(b_chunk, 0);
  MessageHeader h;
  h.type = MsgType::kPush;
  h.sender = 0;
  h.request_id = 5;
  h.layout_hash = layout_.hash();
  h.chunk_ids = {static_cast<uint32_t>(b_chunk)};
  h.versions = {0};
  h.elem_counts = {static_cast<uint64_t>(layout_.chunk(b_chunk).count)};
  h.byte_lengths = {static_cast<uint64_t>(kB * 4)};
  h.encodings = {Encoding::kFactors};
  h.factor_batch = kB;
  Frames f;
  std::vector<float> x(kB, 1.0f);
  f.push_back(Frame::Copy(x.data(), x.size() * 4));
  f.push_back(Frame::Copy(x.data(), x.size() * 4));
  Send(h, std::move(f));
  ExpectRefused(RejectReason::kDType, "only an inner-product weight");
}

TEST_F(BadFactors, AnInitPushCannotCarryFactors) {
  MessageHeader h;
  std::vector<std::vector<float>> f;
  GoodPush(&h, &f);
  h.flags = kFlagInit;
  h.versions.clear();
  Send(h, ToFrames(f));
  ExpectRefused(RejectReason::kDType, "init");
}

using test::StampingEndpoint;  // tests/testing/stamping_endpoint.h

// A shard of one 4096×4096 weight and a bias, two raw workers registered, weights at 0: factor
// pushes expanded off the loop (server/factor_expander.h).
class FactorLoop : public ::testing::Test {
 protected:
  static constexpr int64_t kOut = 4096, kIn = 4096, kBatch = 512;

  void SetUp() override {
    ASSERT_TRUE(
        ParamLayout::Build({{"fc", {kOut, kIn}, 1.0f, 1.0f}, {"b", {8}, 1.0f, 0.0f}}, 1, int64_t{1} << 22, &layout_)
            .ok());
    ShardOptions o;
    o.solver.base_lr = 0.5f;
    o.cluster.workers = 2;
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport_.Bind("factor-loop", &ep).ok());
    const std::string address = ep->address();
    ASSERT_TRUE(ShardServer::Create(layout_, o, &shard_).ok());
    shard_->Start(std::make_unique<test::ReleaseCountingEndpoint>(std::move(ep), &releases_));
    ASSERT_TRUE(pusher_.Connect(&transport_, address).ok());
    ASSERT_TRUE(other_.Connect(&transport_, address).ok());
    pusher_.Send(Header(MsgType::kRegister, 0), {});
    ASSERT_EQ(pusher_.Receive().type, MsgType::kRegisterReply);
    other_.Send(Header(MsgType::kRegister, 1), {});
    ASSERT_EQ(other_.Receive().type, MsgType::kRegisterReply);
    MessageHeader init = Header(MsgType::kPush, 0);
    init.flags = kFlagInit;
    init.request_id = 1;
    Frames zeros;
    const std::vector<float> zero(size_t{1} << 22, 0.0f);
    for (const Chunk& c : layout_.chunks()) {
      init.chunk_ids.push_back(static_cast<uint32_t>(c.id));
      init.elem_counts.push_back(static_cast<uint64_t>(c.count));
      init.byte_lengths.push_back(static_cast<uint64_t>(c.count) * 4);
      zeros.push_back(Frame::Copy(zero.data(), static_cast<size_t>(c.count) * 4));
    }
    pusher_.Send(init, std::move(zeros));
    ASSERT_EQ(pusher_.Receive().type, MsgType::kAck);
    for (const Chunk& c : layout_.chunks()) {
      if (c.tensor == 0) fc_chunks_.push_back(c.id);
    }
  }
  void TearDown() override {
    EXPECT_EQ(releases_.load(), 0) << "the loop called into its transport";
    shard_->Stop();
    EXPECT_TRUE(shard_->Join().ok());
  }
  MessageHeader Header(MsgType type, int32_t worker) const {
    MessageHeader h;
    h.type = type;
    h.sender = worker;
    h.layout_hash = layout_.hash();
    return h;
  }
  MessageHeader Pull(int32_t worker, uint64_t request_id, int32_t chunk) const {
    MessageHeader h = Header(MsgType::kPull, worker);
    h.request_id = request_id;
    h.chunk_ids = {static_cast<uint32_t>(chunk)};
    return h;
  }
  // One factor push of all of "fc" from worker 0, δ = 1/kBatch and a = 1: every element of its
  // gradient δᵀ·a is exactly 1. Forming it is an sgemm of 17 GFLOP, well over 10 ms on any CPU.
  void SendBigPush(uint64_t request_id) {
    MessageHeader push = Header(MsgType::kPush, 0);
    push.request_id = request_id;
    push.factor_batch = kBatch;
    Frames factors;
    const std::vector<float> delta(static_cast<size_t>(kBatch * kOut), 1.0f / kBatch);
    for (int32_t id : fc_chunks_) {
      const Chunk& c = layout_.chunk(id);
      const int64_t rows = c.count / kIn;  // chunks of 2^22 floats hold whole rows of 4096
      push.chunk_ids.push_back(static_cast<uint32_t>(id));
      push.versions.push_back(0);
      push.elem_counts.push_back(static_cast<uint64_t>(c.count));
      push.byte_lengths.push_back(static_cast<uint64_t>(kBatch * rows) * 4);
      push.encodings.push_back(Encoding::kFactors);
      factors.push_back(Frame::Copy(delta.data(), static_cast<size_t>(kBatch * rows) * 4));
    }
    const std::vector<float> a(static_cast<size_t>(kBatch * kIn), 1.0f);
    factors.push_back(Frame::Copy(a.data(), a.size() * 4));
    pusher_.Send(push, std::move(factors));
  }
  int32_t bias_chunk() const { return layout_.chunks().back().id; }

  InprocTransport transport_;
  ParamLayout layout_;
  std::atomic<int> releases_{0};
  std::unique_ptr<ShardServer> shard_;
  RawPeer pusher_, other_;
  std::vector<int32_t> fc_chunks_;
};

// While a large factor push is expanded (server/factor_expander.h), another worker's pull is
// answered; the pusher's own later pull waits behind its push and sees it applied; and the loop
// never calls into its transport meanwhile (no ReleaseDue, TearDown).
TEST_F(FactorLoop, ALargeFactorPushDoesNotHoldTheOtherWorkersAndItsPeersNextPullSeesIt) {
  SendBigPush(2);
  pusher_.Send(Pull(0, 3, fc_chunks_[0]), {});  // sent after the push on the same connection: answered after it
  std::this_thread::sleep_for(2ms);             // the push is on the expander by now
  other_.Send(Pull(1, 4, bias_chunk()), {});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(other_.Receive().type, MsgType::kPullReply);
  const double other_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MessageHeader early;
  EXPECT_FALSE(pusher_.TryReceive(&early, 0ms)) << "the push was acknowledged before another worker's pull ("
                                                << other_ms << " ms): the loop waited for the expansion";
  const MessageHeader ack = pusher_.Receive();
  ASSERT_EQ(ack.type, MsgType::kAck) << ack.error_text;
  const MessageHeader own = pusher_.Receive();
  ASSERT_EQ(own.type, MsgType::kPullReply);
  ASSERT_EQ(own.versions.size(), 1u);
  EXPECT_EQ(own.versions[0], 1) << "the pusher's pull sent after its push sees it";
  for (int32_t id : fc_chunks_) {
    const std::vector<float> w = shard_->ChunkWeights(id);
    ASSERT_FALSE(w.empty());
    EXPECT_EQ(w.front(), -0.5f);  // 0 − lr·1
    EXPECT_EQ(w.back(), -0.5f);
  }
  const uint64_t factor_ns = shard_->Stats().factor_ns;
  EXPECT_GT(factor_ns, 0u);
  std::printf("another worker's pull answered in %.2f ms; the push's expansion took %.1f ms\n", other_ms,
              1e-6 * static_cast<double>(factor_ns));
}

// More messages behind a push than the shard holds for one connection (64): the loop then waits
// for the expander, and every message is still answered once, in the order it was sent.
TEST_F(FactorLoop, MessagesBehindAPushPastTheBoundAreAnsweredInOrder) {
  constexpr int kPulls = 150;
  SendBigPush(2);
  for (int i = 0; i < kPulls; ++i) pusher_.Send(Pull(0, 100 + static_cast<uint64_t>(i), bias_chunk()), {});
  const MessageHeader ack = pusher_.Receive();
  ASSERT_EQ(ack.type, MsgType::kAck) << ack.error_text;
  EXPECT_EQ(ack.request_id, 2u);
  for (int i = 0; i < kPulls; ++i) {
    const MessageHeader r = pusher_.Receive();
    ASSERT_EQ(r.type, MsgType::kPullReply) << r.error_text;
    ASSERT_EQ(r.request_id, 100 + static_cast<uint64_t>(i)) << "out of order";
  }
  MessageHeader extra;
  EXPECT_FALSE(pusher_.TryReceive(&extra, 50ms)) << "answered twice";
  EXPECT_EQ(shard_->Stats().pulls_served, static_cast<uint64_t>(kPulls));
  EXPECT_EQ(shard_->ChunkVersion(fc_chunks_[0]), 1);
}

TEST(FactorResend, AFactorPushWhoseAckDiedIsResentToTheRecoveredServerAndAppliedOnce) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}}, 1, 8, &layout).ok());
  const std::string dir = ::testing::TempDir() + "/factors_resend_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ShardOptions o;
  o.solver.base_lr = 0.5f;
  o.solver.momentum = 0.9f;
  o.solver.weight_decay = 0.01f;
  o.wal_path = dir + "/server-0.wal";
  o.checkpoint.wal_fsync_ms = 0;
  InprocTransport transport;
  auto serve = [&](std::unique_ptr<ShardServer>* shard, uint64_t incarnation) -> StampingEndpoint* {
    std::unique_ptr<ServerEndpoint> ep;
    EXPECT_TRUE(transport.Bind("r0", &ep).ok());
    auto stamping = std::make_unique<StampingEndpoint>(std::move(ep), incarnation);
    StampingEndpoint* raw = stamping.get();
    (*shard)->Start(std::move(stamping));
    return raw;
  };
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout, o, &shard).ok());
  StampingEndpoint* ep = serve(&shard, 1007);
  PsClientOptions co;
  co.server_addresses = {"r0"};
  co.reply_timeout = 5000ms;
  co.server_wait = 5000ms;
  co.probe_every = 50ms;
  std::unique_ptr<PsClient> client;
  ASSERT_TRUE(PsClient::Create(&transport, layout, co, &client).ok());
  ASSERT_TRUE(client->Connect(5000ms).ok());
  std::vector<float> w0(static_cast<size_t>(layout.total_elems()));
  for (size_t i = 0; i < w0.size(); ++i) w0[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  ASSERT_TRUE(client->Wait(client->PushInit(w0), 5000ms).ok());
  // [δ packed (2×9) | a (2×5)] in w's span, b dense.
  std::vector<float> g(w0.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.1f * static_cast<float>((i * 5) % 11) - 0.4f;
  const std::vector<FactorTensor> f = {{0, 2}};
  const uint64_t applied = shard->Stats().pushes_applied;
  ep->drop_acks.store(true);
  const RequestId id = client->PushTensors(g, 0, 2, 0, f);
  // Two messages: w's four chunks as one factor group, then b's chunk dense.
  for (int i = 0; i < 2000 && shard->Stats().pushes_applied < applied + 2; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(shard->Stats().pushes_applied, applied + 2);
  for (int i = 0; i < 2000 && ep->dropped_acks.load() < 2; ++i) std::this_thread::sleep_for(2ms);  // once logged
  ASSERT_EQ(ep->dropped_acks.load(), 2);
  EXPECT_EQ(client->Wait(id, 100ms).code(), StatusCode::kTimeout);
  shard->Stop();
  ASSERT_TRUE(shard->Join().ok());
  std::vector<float> first(w0.size());
  for (const Chunk& c : layout.chunks()) {
    const auto cw = shard->ChunkWeights(c.id);
    std::copy(cw.begin(), cw.end(), first.begin() + c.flat_offset);
  }
  shard.reset();
  ASSERT_TRUE(ShardServer::Create(layout, o, &shard).ok());  // a new process, recovered from its log
  RecoverReport report;
  ASSERT_TRUE(shard->Recover(&report).ok());
  serve(&shard, 2007);
  ASSERT_TRUE(client->Wait(id, 5000ms).ok());  // probed, registered again, resent
  EXPECT_EQ(client->resent_parts(0), 2u);
  const ShardStatsWire st = shard->Stats();
  EXPECT_EQ(st.duplicates, 2u) << "the resent pushes were not recognised";
  EXPECT_EQ(st.pushes_applied, 0u) << "applied twice";
  std::vector<float> now(w0.size());
  ASSERT_TRUE(client->Wait(client->Pull(now), 5000ms).ok());
  EXPECT_EQ(std::memcmp(now.data(), first.data(), now.size() * 4), 0);
  EXPECT_NE(now, w0);
  client.reset();
  shard->Stop();
  EXPECT_TRUE(shard->Join().ok());
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// The write-ahead log keeps a factor push as its factors (server/wal.h kCodedPush).

class FactorLog : public ::testing::Test {
 protected:
  static constexpr int kB = 4;
  static constexpr int64_t kOut = 64, kIn = 48;  // W 64×48 in chunks of 1024 floats: rows cut

  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"w", {kOut, kIn}, 1.0f, 1.0f}, {"b", {kOut}, 2.0f, 0.0f}}, 1, 1024, &layout_).ok());
    dir_ = ::testing::TempDir() + "/factor_log_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    options_.solver.base_lr = 0.05f;
    options_.solver.momentum = 0.9f;
    options_.solver.weight_decay = 0.01f;
    options_.cluster.max_workers = 2;
    options_.compression.factor_threads = 3;  // the recovered shard forms the factors on one thread
    options_.wal_path = dir_ + "/server-0.wal";
    options_.checkpoint.wal_fsync_ms = 0;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Serves a shard with `options_`, pushes initial weights and `steps` factor pushes of "w"
  // (random δ and a; "b" dense) as worker 0, and stops it.
  std::unique_ptr<ShardServer> Run(int steps, WireCodec push = WireCodec::kFp32) {
    std::unique_ptr<ShardServer> shard;
    EXPECT_TRUE(ShardServer::Create(layout_, options_, &shard).ok());
    std::unique_ptr<ServerEndpoint> ep;
    EXPECT_TRUE(transport_.Bind(fmt::format("log{}", runs_++), &ep).ok());
    PsClientOptions co;
    co.server_addresses = {ep->address()};
    co.reply_timeout = 5000ms;
    co.checksums = true;
    co.compression.push = push;
    shard->Start(std::move(ep));
    std::unique_ptr<PsClient> client;
    EXPECT_TRUE(PsClient::Create(&transport_, layout_, co, &client).ok());
    EXPECT_TRUE(client->Connect(5000ms).ok());
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 0.5f);
    std::vector<float> w0(static_cast<size_t>(layout_.total_elems()));
    for (float& x : w0) x = d(rng);
    EXPECT_TRUE(client->Wait(client->PushInit(w0), 5000ms).ok());
    const std::vector<FactorTensor> f = {{0, kB}};
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g(w0.size());  // [δ packed | a (kB×kIn)] in w's span, then b
      for (float& x : g) x = d(rng);
      const Status s = client->Wait(client->PushTensors(g, 0, 2, step, f), 5000ms);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    client.reset();
    shard->Stop();
    EXPECT_TRUE(shard->Join().ok());
    return shard;
  }
  // A second process of the shard, recovered from the log alone (no checkpoint).
  std::unique_ptr<ShardServer> Recovered(RecoverReport* report) {
    ShardOptions o = options_;
    o.compression.factor_threads = 1;
    std::unique_ptr<ShardServer> shard;
    EXPECT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
    const Status s = shard->Recover(report);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return shard;
  }
  void ExpectSameShard(const ShardServer& a, const ShardServer& b) const {
    for (const Chunk& c : layout_.chunks()) {
      const auto wa = a.ChunkWeights(c.id), wb = b.ChunkWeights(c.id);
      ASSERT_EQ(wa.size(), wb.size());
      EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0) << "weights of chunk " << c.id;
      const auto ha = a.ChunkHistory(c.id), hb = b.ChunkHistory(c.id);
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * 4), 0) << "momentum of chunk " << c.id;
      EXPECT_EQ(a.ChunkVersion(c.id), b.ChunkVersion(c.id));
    }
  }
  struct Logged {
    WalKind kind;
    uint64_t payload_bytes;  // coded push: its payload frames
  };
  std::vector<Logged> LogRecords() const {
    std::vector<Logged> out;
    WalScanInfo info;
    const Status s = ScanWal(options_.wal_path, [&](const WalRecord& r) {
      uint64_t bytes = 0;
      for (size_t i = 1; i < r.frames.size(); ++i) bytes += r.frames[i].size();
      out.push_back({r.kind, bytes});
      return Status::Ok();
    }, &info);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  ParamLayout layout_;
  ShardOptions options_;
  std::string dir_;
  InprocTransport transport_;
  int runs_ = 0;
};

// Each step's push of "w" is logged as its δ blocks and a (what the wire carried), 6.7× fewer
// bytes than its dense gradient; a shard recovered from the log, forming the factors on one
// thread where the live one used three, has the live shard's weights, momentum and versions to
// the byte.
TEST_F(FactorLog, AFactorPushIsLoggedAsItsFactorsAndRecoversByteForByte) {
  constexpr int kSteps = 4;
  const std::unique_ptr<ShardServer> live = Run(kSteps);
  uint64_t factor_bytes = kB * kIn * 4;  // a, once per message
  for (const Chunk& c : layout_.chunks()) {
    if (c.tensor == 0) factor_bytes += static_cast<uint64_t>(kB * RowsOf(c, kIn).rows * 4);
  }
  const uint64_t dense_bytes = kOut * kIn * 4;
  int coded = 0, dense = 0;
  for (const Logged& r : LogRecords()) {
    if (r.kind == WalKind::kCodedPush) {
      ++coded;
      EXPECT_EQ(r.payload_bytes, factor_bytes);
    } else if (r.kind == WalKind::kPush) {
      ++dense;  // the init pushes and "b"
    }
  }
  EXPECT_EQ(coded, kSteps);
  EXPECT_EQ(dense, static_cast<int>(layout_.chunks().size()) + kSteps);
  const ShardStatsWire st = live->Stats();
  EXPECT_EQ(st.wal_coded_records, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(st.wal_records, static_cast<uint64_t>(coded + dense));
  WalScanInfo scanned;  // the log's records, without a direct writer's block padding
  ASSERT_TRUE(ScanWal(options_.wal_path, nullptr, &scanned).ok());
  EXPECT_EQ(st.wal_bytes, scanned.valid_bytes);
  EXPECT_GE(static_cast<double>(dense_bytes) / static_cast<double>(factor_bytes), 6.5)
      << factor_bytes << " bytes of factors against " << dense_bytes;
  RecoverReport report;
  const std::unique_ptr<ShardServer> back = Recovered(&report);
  EXPECT_EQ(report.replayed_pushes, static_cast<uint64_t>(layout_.chunks().size() + 2 * kSteps));
  ExpectSameShard(*live, *back);
  EXPECT_EQ(back->ChunkVersion(0), kSteps);
}

// With compression.push = bf16 / fp16 the factors travel, and are logged, in 16 bits: half the
// bytes of the f32 factors; the shard recovered from the log (widening them again) has the live
// shard's weights, momentum and versions to the byte.
TEST_F(FactorLog, SixteenBitFactorsAreLoggedAsSentAndRecoverByteForByte) {
  constexpr int kSteps = 3;
  uint64_t factor_bytes = kB * kIn * 2;  // a, once per message, 2 bytes a value
  for (const Chunk& c : layout_.chunks()) {
    if (c.tensor == 0) factor_bytes += static_cast<uint64_t>(kB * RowsOf(c, kIn).rows * 2);
  }
  for (const WireCodec codec : {WireCodec::kBf16, WireCodec::kFp16}) {
    SCOPED_TRACE(WireCodecName(codec));
    std::filesystem::remove(options_.wal_path);
    const std::unique_ptr<ShardServer> live = Run(kSteps, codec);
    int factors = 0;
    for (const Logged& r : LogRecords()) {
      // "b" goes dense in 16 bits too: a coded record of kOut halves.
      if (r.kind == WalKind::kCodedPush && r.payload_bytes != kOut * 2) {
        ++factors;
        EXPECT_EQ(r.payload_bytes, factor_bytes);
      }
    }
    EXPECT_EQ(factors, kSteps);
    RecoverReport report;
    const std::unique_ptr<ShardServer> back = Recovered(&report);
    EXPECT_EQ(report.replayed_pushes, static_cast<uint64_t>(layout_.chunks().size() + 2 * kSteps));
    ExpectSameShard(*live, *back);
    EXPECT_EQ(back->ChunkVersion(0), kSteps);
  }
}

// DC-ASGD applies a compensated gradient made of the pulled copies, which the log does not keep:
// its factor pushes are logged as the f32 gradient applied, and recover to the byte too.
TEST_F(FactorLog, UnderDcAsgdAFactorPushIsLoggedAsTheGradientApplied) {
  options_.consistency.algorithm = Algorithm::kDcAsgd;
  const std::unique_ptr<ShardServer> live = Run(3);
  for (const Logged& r : LogRecords()) EXPECT_NE(r.kind, WalKind::kCodedPush);
  RecoverReport report;
  const std::unique_ptr<ShardServer> back = Recovered(&report);
  ExpectSameShard(*live, *back);
  EXPECT_EQ(back->ChunkVersion(0), 3);
}

// A factor push that is not smaller than its gradient (one chunk of few rows, a long a) is
// logged dense: the log takes the smaller form. Sent by a raw peer (a client refuses factors
// that do not pay for the whole tensor; per server they may not).
TEST_F(FactorLog, AFactorPushNoSmallerThanItsGradientIsLoggedDense) {
  std::unique_ptr<ShardServer> live = Run(1);
  ASSERT_TRUE(ShardServer::Create(layout_, options_, &live).ok());
  RecoverReport report;
  ASSERT_TRUE(live->Recover(&report).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport_.Bind("raw-log", &ep).ok());
  RawPeer peer;
  ASSERT_TRUE(peer.Connect(&transport_, ep->address()).ok());
  live->Start(std::move(ep));
  MessageHeader reg;
  reg.type = MsgType::kRegister;
  reg.sender = 1;
  reg.layout_hash = layout_.hash();
  peer.Send(reg, {});
  ASSERT_EQ(peer.Receive().type, MsgType::kRegisterReply);
  // Chunk 0 (1024 floats, 22 rows) at batch 32: δ 32×22 + a 32×48 = 2240 floats.
  const Chunk& c = layout_.chunk(0);
  constexpr int kBig = 32;
  const int64_t rows = RowsOf(c, kIn).rows;
  MessageHeader h;
  h.type = MsgType::kPush;
  h.sender = 1;
  h.request_id = 5;
  h.clock = 1;
  h.layout_hash = layout_.hash();
  h.chunk_ids = {0};
  h.versions = {live->ChunkVersion(0)};
  h.elem_counts = {static_cast<uint64_t>(c.count)};
  h.byte_lengths = {static_cast<uint64_t>(kBig * rows * 4)};
  h.encodings = {Encoding::kFactors};
  h.factor_batch = kBig;
  const std::vector<float> delta(static_cast<size_t>(kBig * rows), 0.01f), a(kBig * kIn, 0.02f);
  Frames payload;
  payload.push_back(Frame::Copy(delta.data(), delta.size() * 4));
  payload.push_back(Frame::Copy(a.data(), a.size() * 4));
  peer.Send(h, std::move(payload));
  const MessageHeader ack = peer.Receive();
  ASSERT_EQ(ack.type, MsgType::kAck) << ack.error_text;
  peer.Close();
  live->Stop();
  ASSERT_TRUE(live->Join().ok());
  const std::vector<Logged> records = LogRecords();
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back().kind, WalKind::kPush) << "2240 floats of factors logged for a 1024-float gradient";
  const std::unique_ptr<ShardServer> back = Recovered(&report);
  ExpectSameShard(*live, *back);
}

// ---------------------------------------------------------------------------------------------
// Bytes

// Push payload bytes per worker step (payload frames; headers are a few hundred bytes), dense or
// with every inner-product weight factored where that is fewer floats at `batch`.
struct PushBytes {
  uint64_t dense = 0, factored = 0;
};
PushBytes AlexNetPushBytes(const std::string& model, int batch, int servers) {
  engine::NetShapes shapes;
  const engine::NetSpec spec = ModelSpec(model);
  EXPECT_TRUE(engine::InferShapes(spec, batch, &shapes).ok());
  ParamLayout layout;
  EXPECT_TRUE(ParamLayout::Build(shapes.params, servers, int64_t{1} << 20, &layout).ok());  // cluster.chunk_elems default
  std::vector<FactorTensor> factors;
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    if (spec.layers[li].type != engine::LayerType::kInnerProduct) continue;
    const int t = shapes.layer_params[li][0];
    const TensorSpec& w = shapes.params[static_cast<size_t>(t)];
    if (int64_t{batch} * (w.shape[0] + w.numel() / w.shape[0]) < w.numel()) factors.push_back({t, batch});
  }
  PushBytes b;
  b.dense = static_cast<uint64_t>(layout.total_elems()) * 4;
  b.factored = FactorPushPayloadBytes(layout, factors);
  return b;
}

TEST(FactorBytes, AlexNetAtBatch128WithTwoServers) {
  for (const char* model : {"alexnet.toml", "alexnet_fashion.toml"}) {
    const PushBytes b = AlexNetPushBytes(model, 128, 2);
    const double ratio = static_cast<double>(b.dense) / static_cast<double>(b.factored);
    std::printf("%-22s batch 128, 2 servers: push %.1f MB dense, %.1f MB with factors: %.2fx fewer\n", model,
                b.dense / 1e6, b.factored / 1e6, ratio);
    const PushBytes one = AlexNetPushBytes(model, 128, 1);
    std::printf("%-22s batch 128, 1 server:  push %.1f MB dense, %.1f MB with factors: %.2fx fewer\n", model,
                one.dense / 1e6, one.factored / 1e6, static_cast<double>(one.dense) / static_cast<double>(one.factored));
    EXPECT_GE(ratio, 7.5) << model;
  }
  // AlexNet on Fashion (10 classes: fc8 stays dense) reaches the issue's 8×.
  const PushBytes fashion = AlexNetPushBytes("alexnet_fashion.toml", 128, 2);
  EXPECT_GE(static_cast<double>(fashion.dense) / static_cast<double>(fashion.factored), 8.0);
}

// AlexNet (1000 classes, batch 128, 1 Mi-float chunks) over many servers: fc6 is held by 41 of 64
// servers and by 81 of 128, and those copies of a outweigh its gradient. The scaling model counts
// the same floats (tests/tools/test_scaling.py,
// test_factors_at_many_servers_go_dense_where_the_activations_copies_outweigh_the_gradient).
TEST(FactorBytes, AlexNetsFc6OverManyServersCostsMoreAsFactorsThanDense) {
  struct Case {
    int servers;
    int fc6_holders;
    int64_t fc6_floats;
  };
  for (const Case& k : {Case{2, 2, 2888192}, Case{64, 41, 48894976}, Case{128, 81, 96086016}}) {
    ParamLayout layout;
    ASSERT_TRUE(ParamLayout::Build(AlexNetTensorSpecs(), k.servers, kDefaultChunkElems, &layout).ok());
    const int fc6 = layout.TensorIndex("fc6.weight");
    int holders = 0;
    EXPECT_EQ(FactorWireFloats(layout, fc6, 128, &holders), k.fc6_floats) << k.servers;
    EXPECT_EQ(holders, k.fc6_holders) << k.servers;
  }
}

TEST(FactorBytes, PayloadBytesCountDeltaRowsPerChunkAndTheActivationsOncePerServer) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"w", {6, 5}, 1, 1}, {"b", {6}, 1, 1}}, 2, 8, &layout).ok());
  // w's chunks: [0,8) rows 0-1, [8,16) rows 1-3, [16,24) rows 3-4, [24,30) rows 4-5, dealt over
  // both servers; b dense.
  uint64_t expect = 6 * 4;  // b
  std::vector<bool> server_has(2, false);
  for (const Chunk& c : layout.chunks()) {
    if (c.tensor != 0) continue;
    expect += static_cast<uint64_t>(2 * ((c.tensor_offset + c.count - 1) / 5 - c.tensor_offset / 5 + 1) * 4);
    server_has[static_cast<size_t>(c.server)] = true;
  }
  for (bool h : server_has) expect += h ? 2 * 5 * 4 : 0;
  const std::vector<FactorTensor> f = {{0, 2}};
  EXPECT_EQ(FactorPushPayloadBytes(layout, f), expect);
  EXPECT_EQ(FactorPushPayloadBytes(layout, {}), 36u * 4);
}

// A push of every chunk of a 6×5 weight cut into chunks of 7 floats (chunks cut rows), with
// seeded factors; and its dense gradient chunk by chunk, computed here by hand.
struct SmallFactorPush {
  static constexpr int64_t kOut = 6, kIn = 5, kBatch = 3;
  explicit SmallFactorPush(const ParamLayout& layout, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    a.resize(kBatch * kIn);
    for (float& x : a) x = d(rng);
    header.type = MsgType::kPush;
    header.factor_batch = kBatch;
    for (const Chunk& c : layout.chunks()) {
      const int64_t r0 = c.tensor_offset / kIn, rows = (c.tensor_offset + c.count - 1) / kIn - r0 + 1;
      deltas.emplace_back(static_cast<size_t>(kBatch * rows));
      for (float& x : deltas.back()) x = d(rng);
      std::vector<float> dense(static_cast<size_t>(c.count));
      for (int64_t e = 0; e < c.count; ++e) {
        const int64_t row = (c.tensor_offset + e) / kIn - r0, col = (c.tensor_offset + e) % kIn;
        double sum = 0;
        for (int64_t b = 0; b < kBatch; ++b) sum += double{deltas.back()[b * rows + row]} * a[b * kIn + col];
        dense[static_cast<size_t>(e)] = static_cast<float>(sum);
      }
      expected.push_back(std::move(dense));
      header.chunk_ids.push_back(static_cast<uint32_t>(c.id));
      header.versions.push_back(0);
      header.elem_counts.push_back(static_cast<uint64_t>(c.count));
      header.byte_lengths.push_back(deltas.back().size() * 4);
      header.encodings.push_back(Encoding::kFactors);
    }
  }
  // The push's frames (borrowing this object's factors).
  Frames MakeFrames() const {
    Frames frames(1);
    for (const auto& x : deltas) frames.push_back(Frame::Borrow(x.data(), x.size() * 4, nullptr));
    frames.push_back(Frame::Borrow(a.data(), a.size() * 4, nullptr));
    return frames;
  }
  // Every dense chunk of `frames` equals the hand-computed gradient.
  void ExpectDense(const Frames& frames) const {
    ASSERT_EQ(frames.size(), expected.size() + 1);
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(frames[i + 1].size(), expected[i].size() * 4) << "chunk " << i;
      const auto* got = reinterpret_cast<const float*>(frames[i + 1].data());
      for (size_t e = 0; e < expected[i].size(); ++e)
        EXPECT_NEAR(got[e], expected[i][e], 1e-5f * (1.0f + std::fabs(expected[i][e])))
            << "chunk " << i << " elem " << e;
    }
  }
  MessageHeader header;
  std::vector<float> a;
  std::vector<std::vector<float>> deltas;
  std::vector<std::vector<float>> expected;
};

// The server's reused buffers (common/buffer_pool.h): a buffer a push's frames still hold is
// never handed out again, a released one is (no new buffer), and the number kept is bounded.
TEST(FactorScratch, HeldBuffersAreNeverReusedReleasedOnesAreAndTheCountIsBounded) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"fc.weight", {SmallFactorPush::kOut, SmallFactorPush::kIn}, 1, 1}}, 1, 7,
                                 &layout).ok());
  const size_t chunks = layout.chunks().size();
  ASSERT_GE(chunks, 4u);
  BufferPool<float> scratch(1 << 20);
  const SmallFactorPush p1(layout, 1), p2(layout, 2), p3(layout, 3);
  auto expand = [&](const SmallFactorPush& p, Frames* frames) {
    MessageHeader h = p.header;
    *frames = p.MakeFrames();
    RejectReason reason = RejectReason::kCount;
    const Status s = ExpandFactorPush(layout, &h, frames, &reason, &scratch);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(h.encodings.empty());
  };
  Frames f1, f2, f3;
  expand(p1, &f1);
  EXPECT_EQ(scratch.blocks(), chunks);
  expand(p2, &f2);  // while p1's frames live: new buffers, p1's untouched
  EXPECT_EQ(scratch.blocks(), 2 * chunks);
  p1.ExpectDense(f1);
  p2.ExpectDense(f2);
  f1 = Frames();
  expand(p3, &f3);  // p1's buffers are free again: taken, nothing new
  EXPECT_EQ(scratch.blocks(), 2 * chunks);
  p2.ExpectDense(f2);
  p3.ExpectDense(f3);

  // Bounded: the kept buffers hold at most 20 floats (two of a chunk's 2 rows × 5); the rest of
  // a push gets buffers of its own, freed with its frames.
  BufferPool<float> small(20);
  Frames g1, g2;
  {
    MessageHeader h = p1.header;
    g1 = p1.MakeFrames();
    RejectReason reason = RejectReason::kCount;
    ASSERT_TRUE(ExpandFactorPush(layout, &h, &g1, &reason, &small).ok());
    h = p2.header;
    g2 = p2.MakeFrames();
    ASSERT_TRUE(ExpandFactorPush(layout, &h, &g2, &reason, &small).ok());
  }
  EXPECT_GE(small.blocks(), 1u);
  EXPECT_LE(small.elements(), 20u);
  p1.ExpectDense(g1);
  p2.ExpectDense(g2);
  // Without a scratch: the same gradients; every chunk reported expanded (finite, not to be
  // scanned again).
  Frames g3 = p3.MakeFrames();
  MessageHeader h = p3.header;
  RejectReason reason = RejectReason::kCount;
  std::vector<bool> expanded;
  ASSERT_TRUE(ExpandFactorPush(layout, &h, &g3, &reason, nullptr, 1, &expanded).ok());
  p3.ExpectDense(g3);
  EXPECT_EQ(expanded, std::vector<bool>(chunks, true));
  // compression.factor_threads: the chunks side by side on three threads give the same floats,
  // bit for bit (each chunk is one sgemm on one thread either way).
  ASSERT_GT(std::count(p3.header.encodings.begin(), p3.header.encodings.end(), Encoding::kFactors), 1);
  for (int threads : {1, 2, 3, 8}) {
    Frames t = p3.MakeFrames();
    MessageHeader ht = p3.header;
    ASSERT_TRUE(ExpandFactorPush(layout, &ht, &t, &reason, &scratch, threads).ok());
    ASSERT_EQ(t.size(), g3.size());
    for (size_t i = 1; i < t.size(); ++i) {
      ASSERT_EQ(t[i].size(), g3[i].size());
      EXPECT_EQ(std::memcmp(t[i].data(), g3[i].data(), t[i].size()), 0) << threads << " threads, chunk " << i;
    }
  }
}

// The server's cost of forming δᵀ·a for fc6 (4096×9216) at batch 128 in chunks of the default
// 1 Mi floats: 4.8 GFLOP. A measurement, not a check (run with --gtest_also_run_disabled_tests).
TEST(FactorBytes, DISABLED_ServerGemmTimeForFc6AtBatch128) {
  constexpr int64_t kOut = 4096, kIn = 9216, kBatch = 128;
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"fc6.weight", {kOut, kIn}, 1, 1}}, 1, int64_t{1} << 20, &layout).ok());
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(kBatch * kIn));
  for (float& x : a) x = d(rng);
  std::vector<std::vector<float>> deltas;
  MessageHeader base;
  base.type = MsgType::kPush;
  base.factor_batch = kBatch;
  for (const Chunk& c : layout.chunks()) {
    const int64_t rows = (c.tensor_offset + c.count - 1) / kIn - c.tensor_offset / kIn + 1;
    deltas.emplace_back(static_cast<size_t>(kBatch * rows));
    for (float& x : deltas.back()) x = d(rng);
    base.chunk_ids.push_back(static_cast<uint32_t>(c.id));
    base.versions.push_back(0);
    base.elem_counts.push_back(static_cast<uint64_t>(c.count));
    base.byte_lengths.push_back(deltas.back().size() * 4);
    base.encodings.push_back(Encoding::kFactors);
  }
  // As a shard runs it: the dense gradients in its reused buffers (the first round fills them),
  // with compression.factor_threads 1 and 2.
  BufferPool<float> scratch(2 * static_cast<size_t>(kOut * kIn));
  for (int threads : {1, 2}) {
    for (int rep = 0; rep < 4; ++rep) {
      MessageHeader h = base;
      Frames frames(1);
      for (const auto& x : deltas) frames.push_back(Frame::Borrow(x.data(), x.size() * 4, nullptr));
      frames.push_back(Frame::Borrow(a.data(), a.size() * 4, nullptr));
      RejectReason reason = RejectReason::kCount;
      const auto t0 = std::chrono::steady_clock::now();
      const Status s = ExpandFactorPush(layout, &h, &frames, &reason, &scratch, threads);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::printf("fc6 at batch 128, %zu chunks, %d thread(s)%s: expand (validate + sgemm) %.1f ms, %.1f GFLOP/s\n",
                  layout.chunks().size(), threads, rep == 0 && threads == 1 ? ", fresh buffers" : "", 1e3 * sec,
                  2.0 * kOut * kIn * kBatch / sec / 1e9);
    }
  }
}

}  // namespace
}  // namespace downpour
