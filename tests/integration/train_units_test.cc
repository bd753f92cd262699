// Unit tests of the worker's pieces: the push planner (every chunk released exactly once,
// groups per server, overlap with backward), the progress line, the JSONL writer, gradient
// clipping by global norm on what the loop pushes, and the step without an acknowledgement
// barrier.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "client/worker/local_solver.h"
#include "client/worker/progress.h"
#include "client/worker/push_planner.h"
#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/worker/trainer.h"
#include "common/layout.h"
#include "common/solver/lr_policy.h"
#include "common/solver/update_rule.h"
#include "tests/client/test_nets.h"

namespace downpour::worker {
namespace {

// The small Fashion-MNIST net's tensors (conv1 32×1×5×5, conv2 64×32×5×5, fc1 256×2304,
// fc2 10×256, each with a bias).
std::vector<TensorSpec> SmallNetSpecs() {
  return {{"conv1.weight", {32, 1, 5, 5}},  {"conv1.bias", {32}, 2, 0},  {"conv2.weight", {64, 32, 5, 5}},
          {"conv2.bias", {64}, 2, 0},       {"fc1.weight", {256, 2304}}, {"fc1.bias", {256}, 2, 0},
          {"fc2.weight", {10, 256}},        {"fc2.bias", {10}, 2, 0}};
}

// Backward order: later layers first, bias before weight.
std::vector<int> BackwardOrder(int tensors) {
  std::vector<int> order;
  for (int layer = tensors / 2 - 1; layer >= 0; --layer) {
    order.push_back(2 * layer + 1);
    order.push_back(2 * layer);
  }
  return order;
}

TEST(PushPlanner, ReleasesEveryChunkOnceToItsOwner) {
  for (int servers : {1, 2, 3}) {
    for (int64_t chunk : {int64_t{1} << 20, int64_t{50000}, int64_t{4096}}) {
      ParamLayout layout;
      ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), servers, chunk, &layout).ok());
      PushPlanner planner(layout);
      std::multiset<int32_t> seen;
      for (int t : BackwardOrder(8)) {
        for (const PushGroup& g : planner.OnTensorReady(t)) {
          int64_t elems = 0;
          EXPECT_TRUE(std::is_sorted(g.chunk_ids.begin(), g.chunk_ids.end()));
          for (int32_t id : g.chunk_ids) {
            EXPECT_EQ(layout.chunk(id).server, g.server);
            // Only chunks of tensors already final may be released.
            EXPECT_TRUE(std::find(BackwardOrder(8).begin(), BackwardOrder(8).end(), layout.chunk(id).tensor) !=
                        BackwardOrder(8).end());
            elems += layout.chunk(id).count;
            seen.insert(id);
          }
          EXPECT_EQ(elems, g.elems);
        }
      }
      EXPECT_TRUE(planner.Flush().empty());
      EXPECT_TRUE(planner.AllReleased());
      ASSERT_EQ(static_cast<int>(seen.size()), layout.num_chunks()) << servers << " servers, chunk " << chunk;
      for (int id = 0; id < layout.num_chunks(); ++id) EXPECT_EQ(seen.count(id), 1u);
    }
  }
}

TEST(PushPlanner, OverlapsBackwardAcrossServers) {
  // 2 servers: server 1 holds the tail of the flat space (fc1's end, fc2), which backward
  // finishes first, so server 1's gradients must leave before conv1 (server 0) is final.
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), 2, int64_t{1} << 20, &layout).ok());
  // No size threshold: a server is released exactly when its last tensor is final.
  PushPlanner planner(layout, std::numeric_limits<int64_t>::max());
  std::vector<int> release_step(2, -1);
  const auto order = BackwardOrder(8);
  for (size_t i = 0; i < order.size(); ++i)
    for (const PushGroup& g : planner.OnTensorReady(order[i]))
      if (release_step[static_cast<size_t>(g.server)] < 0) release_step[static_cast<size_t>(g.server)] = static_cast<int>(i);
  ASSERT_GE(release_step[1], 0);
  EXPECT_EQ(release_step[1], 3) << "server 1's last tensor is fc1.weight (4th in backward)";
  EXPECT_EQ(release_step[0], static_cast<int>(order.size()) - 1) << "server 0 completes with conv1.weight";
}

TEST(PushPlanner, ThresholdSplitsBigServers) {
  // One server, threshold 1000 floats: fc1.weight (589,824 floats) is released as soon as it
  // is final, long before conv1 is.
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), 1, int64_t{1} << 20, &layout).ok());
  PushPlanner planner(layout, 1000);
  planner.OnTensorReady(7);
  planner.OnTensorReady(6);  // fc2: 2,570 floats ≥ 1000 → released with fc2.weight
  planner.Reset();
  EXPECT_TRUE(planner.OnTensorReady(7).empty());  // 10 floats < 1000
  const auto groups = planner.OnTensorReady(6);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].elems, 2570);
  EXPECT_EQ(groups[0].chunk_ids.size(), 2u);
  EXPECT_FALSE(planner.AllReleased());
}

TEST(Progress, FormatsStepRateLossAndEta) {
  ProgressState p;
  p.worker_id = 1;
  p.epoch = 2;
  p.step = 100;
  p.total_steps = 400;
  p.images_per_s = 812.4;
  p.loss = 0.43219;
  p.elapsed_s = 20;  // 0.2 s/step → 300 steps left = 60 s
  EXPECT_EQ(FormatProgress(p), "w1 epoch 2 step 100/400 (25%) 812 img/s loss 0.4322 eta 1m00s");
  EXPECT_EQ(FormatDuration(3723), "1h02m03s");
  EXPECT_EQ(FormatDuration(7.4), "7s");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(Progress, QuietPrintsNothing) {
  const auto path = std::filesystem::temp_directory_path() / "train_progress_quiet.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  ProgressReporter quiet(f, ProgressReporter::Mode::kQuiet);
  ProgressState p;
  quiet.Update(p, true);
  quiet.Note("eval");
  quiet.Finish();
  ProgressReporter plain(f, ProgressReporter::Mode::kAuto, 0.0, 0.0);
  plain.Update(p, true);
  std::fclose(f);
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, "w0 epoch 0 step 0 0 img/s loss 0.0000\n");  // only the non-quiet line
  std::filesystem::remove(path);
}

// Records what the loop pushes: the flat gradient as the pushes read it.
class RecordingChannel : public ParamChannel {
 public:
  explicit RecordingChannel(const ParamLayout& layout) : layout_(layout), pushed_(layout.total_elems(), 0.0f) {}
  Status Pull(int64_t, std::span<float>, PullInfo*) override { return Status::Ok(); }  // weights stay
  Status StartPull(int64_t, std::span<const int32_t>, std::span<float>, PullHandle* h) override {
    *h = 0;
    return Status::Ok();
  }
  Status WaitPull(PullHandle, PullInfo*) override { return Status::Ok(); }
  Status StartPush(int64_t, const PushGroup& group, std::span<const float> grads, PushHandle* handle) override {
    if (handle != nullptr) *handle = static_cast<PushHandle>(chunks_pushed_ + 1);
    for (int32_t id : group.chunk_ids) {
      const auto& c = layout_.chunks()[static_cast<size_t>(id)];
      std::copy_n(grads.begin() + c.flat_offset, c.count, pushed_.begin() + c.flat_offset);
      ++chunks_pushed_;
    }
    return Status::Ok();
  }
  Status WaitPush(PushHandle, PushInfo*) override { return Status::Ok(); }
  Status WaitPushes(PushInfo*) override { return Status::Ok(); }
  Status Clock(int64_t) override { return Status::Ok(); }
  Status Leave() override { return Status::Ok(); }
  const std::vector<float>& pushed() const { return pushed_; }
  int64_t chunks_pushed() const { return chunks_pushed_; }

 private:
  const ParamLayout& layout_;
  std::vector<float> pushed_;
  int64_t chunks_pushed_ = 0;
};

// One random batch, forever; or, with `fresh`, a different one every step (the same sequence in
// every run).
class FixedSource : public TrainSource {
 public:
  FixedSource(int n, int c, int h, int w, bool fresh = false)
      : n_(n), c_(c), h_(h), w_(w), fresh_(fresh), data_(size_t(n) * c * h * w), labels_(n) {
    Draw(7);
  }
  Status Next(BatchView* b) override {
    if (fresh_) Draw(500 + static_cast<uint32_t>(step_++));
    *b = BatchView{data_.data(), labels_.data(), n_, c_, h_, w_, 0};
    return Status::Ok();
  }
  int64_t shard_size() const override { return 0; }
  Status SeekToStep(int64_t) override { return Status::Ok(); }

 private:
  void Draw(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : data_) x = d(rng);
    for (int i = 0; i < n_; ++i) labels_[size_t(i)] = static_cast<int>(rng() % 10);
  }
  int n_, c_, h_, w_;
  bool fresh_;
  int64_t step_ = 0;
  std::vector<float> data_;
  std::vector<int> labels_;
};

// conv1 → fc1 → fc2 on 1×8×8 inputs (tests/client/test_nets.h).
constexpr const char* kNet = engine::testing::kTinyConvNet;

// One training step through the loop with solver.clip_gradients = `clip`; returns the pushed
// gradient (every chunk must have been pushed exactly once).
std::vector<float> PushedGradient(float clip) {
  engine::NetSpec spec;
  const Status ps = engine::ParseNetSpecString(kNet, "tinyconv", &spec);
  EXPECT_TRUE(ps.ok()) << ps.ToString();
  engine::NetOptions no;
  no.batch = 8;
  no.worker.threads = 1;
  std::unique_ptr<engine::Net> net;
  const Status ns = engine::Net::Create(spec, no, &net);
  EXPECT_TRUE(ns.ok()) << ns.ToString();
  if (!ns.ok()) return {};
  net->InitParams(5);
  ParamLayout layout;
  EXPECT_TRUE(ParamLayout::Build(net->param_specs(), 2, 64, &layout).ok());
  TrainerOptions to;
  to.worker.batch_size = 8;
  to.worker.steps = 1;
  to.solver.clip_gradients = clip;
  to.min_push_elems = 0;  // per-tensor pushes, as fine-grained as the planner goes
  RecordingChannel channel(layout);
  FixedSource source(8, 1, 8, 8);
  Trainer trainer(to, net.get(), nullptr, &layout, &channel, &source, nullptr, nullptr, nullptr);
  TrainResult r;
  const Status s = trainer.Run(&r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(channel.chunks_pushed(), static_cast<int64_t>(layout.chunks().size()));
  return channel.pushed();
}

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

TEST(Trainer, ClipsThePushedGradientToTheGlobalNorm) {
  const std::vector<float> raw = PushedGradient(-1.0f);  // clipping off
  const double norm = Norm(raw);
  ASSERT_GT(norm, 0.0);
  // A threshold below the norm: the whole gradient is scaled to exactly that norm, same direction.
  const float limit = static_cast<float>(norm / 4);
  const std::vector<float> clipped = PushedGradient(limit);
  ASSERT_EQ(clipped.size(), raw.size());
  EXPECT_NEAR(Norm(clipped), limit, 1e-4 * limit);
  for (size_t i = 0; i < raw.size(); ++i)
    ASSERT_NEAR(clipped[i], raw[i] * (limit / norm), 1e-6 + 1e-5 * std::fabs(raw[i])) << i;
  // A threshold above the norm changes nothing.
  const std::vector<float> loose = PushedGradient(static_cast<float>(norm * 2));
  for (size_t i = 0; i < raw.size(); ++i) ASSERT_EQ(loose[i], raw[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// The local solver (local_solver.h): the one update of a reference run, EASGD's local steps and a
// multi-model stage's.

TEST(LocalSolver, CountsTheRunsBatchesAsTheSchedulesIteration) {
  EXPECT_EQ(LocalIteration(0, 1, 1), 0);
  EXPECT_EQ(LocalIteration(5, 1, 1), 5);    // a reference run: one batch per update
  EXPECT_EQ(LocalIteration(5, 3, 1), 15);   // push_every = 3: each update averages 3 batches
  EXPECT_EQ(LocalIteration(5, 1, 4), 20);   // one of 4 EASGD workers / a stage's 4 holders
  EXPECT_EQ(LocalIteration(5, 2, 4), 40);
  EXPECT_EQ(LocalIteration(5, 0, 0), 5);    // counts below 1 count as 1 (ScheduleIterations)
}

// One LocalSolver step equals the rule applied by hand: the clipped gradient, at the schedule's
// rate for the iteration (here poly with a warm-up), with the rule's state carried between steps.
TEST(LocalSolver, AStepIsTheClippedGradientAtTheSchedulesRate) {
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecString(kNet, "tinyconv", &spec).ok());
  engine::NetOptions no;
  no.batch = 8;
  no.worker.threads = 1;
  std::unique_ptr<engine::Net> a, b;
  ASSERT_TRUE(engine::Net::Create(spec, no, &a).ok());
  ASSERT_TRUE(engine::Net::Create(spec, no, &b).ok());
  a->InitParams(5);
  b->InitParams(5);
  SolverConfig solver;
  solver.base_lr = 0.05f;
  solver.lr_policy = LrPolicy::kPoly;
  solver.max_iter = 100;
  solver.warmup_iters = 10;
  solver.momentum = 0.9f;
  solver.clip_gradients = 0.01f;  // below the gradient's norm: every step clips
  LocalSolver local(solver);
  local.Reset(a->params().size());
  const std::unique_ptr<UpdateRule> rule = MakeUpdateRule(solver);
  std::vector<float> state(b->params().size(), rule->initial_state());
  FixedSource source(8, 1, 8, 8);
  for (int64_t iter : {3, 4}) {
    BatchView batch;
    ASSERT_TRUE(source.Next(&batch).ok());
    a->ForwardBackward(batch.data, batch.labels);
    b->ForwardBackward(batch.data, batch.labels);
    local.Step(a.get(), iter);
    const auto g = b->grads();
    const double norm = Norm(std::vector<float>(g.begin(), g.end()));
    ASSERT_GT(norm, solver.clip_gradients);
    for (float& x : g) x *= static_cast<float>(solver.clip_gradients / norm);
    b->Update(*rule, LearningRateAt(solver, iter), solver.momentum, solver.weight_decay, state);
    for (size_t i = 0; i < a->params().size(); ++i) ASSERT_NEAR(a->params()[i], b->params()[i], 1e-7f) << iter << " " << i;
    EXPECT_NEAR(local.grad_norm(), norm, 1e-6 * norm);
  }
  EXPECT_EQ(local.clipped_steps(), 2);
}

// ---------------------------------------------------------------------------------------------
// No acknowledgement barrier (trainer.h, push_window.h), against a channel that reads each pushed
// gradient as late as the contract allows (at the push's acknowledgement) and compares it with
// what was there when the push started: no step waits for its own acknowledgements (step t+1's
// clock report comes before step t's pushes are acknowledged), yet no gradient a push still reads
// is overwritten (push_every 1: the net's gradients; 2: the accumulator; with clipping); and a
// step's progress (what a resume starts after) is saved only once its pushes are all
// acknowledged, each step once, in order, the last marked finished.

// No servers: pulls leave the weights as they are; a push is read twice, when started and when
// acknowledged (the latest a zero-copy push may read), and the two reads compared.
class LateReadChannel : public ParamChannel {
 public:
  enum Kind { kPush, kAck, kClock };
  struct Event {
    Kind kind;
    int64_t clock;
  };
  explicit LateReadChannel(const ParamLayout& layout) : layout_(layout) {}

  Status Pull(int64_t, std::span<float>, PullInfo*) override { return Status::Ok(); }
  Status StartPull(int64_t, std::span<const int32_t>, std::span<float>, PullHandle* h) override {
    *h = 0;
    return Status::Ok();
  }
  Status WaitPull(PullHandle, PullInfo*) override { return Status::Ok(); }
  Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads, PushHandle* handle) override {
    Push& p = pending_[next_];
    p.clock = clock;
    p.chunks = group.chunk_ids;
    p.grads = grads;
    p.early = Read(p);
    *handle = next_++;
    events.push_back({kPush, clock});
    return Status::Ok();
  }
  Status WaitPush(PushHandle handle, PushInfo*) override {
    auto it = pending_.find(handle);
    if (it == pending_.end()) return InvalidArgument("push {} waited twice", handle);
    if (Read(it->second) != it->second.early) ++overwritten;
    events.push_back({kAck, it->second.clock});
    pending_.erase(it);
    return Status::Ok();
  }
  Status WaitPushes(PushInfo* info) override {
    while (!pending_.empty()) DP_RETURN_IF_ERROR(WaitPush(pending_.begin()->first, info));
    return Status::Ok();
  }
  Status Clock(int64_t clock) override {
    events.push_back({kClock, clock});
    return Status::Ok();
  }
  Status Leave() override { return Status::Ok(); }

  // Pushes of clocks below `clock` not yet acknowledged.
  int UnackedBefore(int64_t clock) const {
    return static_cast<int>(std::count_if(pending_.begin(), pending_.end(),
                                          [&](const auto& kv) { return kv.second.clock < clock; }));
  }
  std::vector<Event> events;
  int overwritten = 0;  // late reads that differed from the early ones

 private:
  struct Push {
    int64_t clock = 0;
    std::vector<int32_t> chunks;
    std::span<const float> grads;
    std::vector<float> early;
  };
  std::vector<float> Read(const Push& p) const {
    std::vector<float> out;
    for (int32_t c : p.chunks) {
      const Chunk& chunk = layout_.chunk(c);
      out.insert(out.end(), p.grads.begin() + chunk.flat_offset, p.grads.begin() + chunk.flat_offset + chunk.count);
    }
    return out;
  }
  const ParamLayout& layout_;
  std::map<PushHandle, Push> pending_;
  PushHandle next_ = 1;
};

constexpr int kBatch = 8;

struct Outcome {
  std::vector<LateReadChannel::Event> events;
  int overwritten = 0;
  std::vector<WorkerProgress> saved;
  int unacked_at_save = 0;  // progress saved while a push of an earlier clock was unacknowledged
};

void Train(int steps, int push_every, float clip, Outcome* out) {
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecString(kNet, "tinyconv", &spec).ok());
  engine::NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  std::unique_ptr<engine::Net> net;
  ASSERT_TRUE(engine::Net::Create(spec, no, &net).ok());
  net->InitParams(3);
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(net->param_specs(), 2, 40, &layout).ok());
  LateReadChannel channel(layout);
  TrainerOptions to;
  to.worker.batch_size = kBatch;
  to.worker.steps = steps;
  to.worker.push_every = push_every;
  to.solver.clip_gradients = clip;
  to.min_push_elems = 0;  // a group per tensor
  to.on_progress = [&](const WorkerProgress& p) {
    out->unacked_at_save += channel.UnackedBefore(p.clock);
    out->saved.push_back(p);
  };
  FixedSource source(kBatch, 1, 8, 8, /*fresh=*/true);
  Trainer trainer(to, net.get(), nullptr, &layout, &channel, &source, nullptr, nullptr, nullptr);
  TrainResult r;
  const Status s = trainer.Run(&r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(channel.UnackedBefore(1 << 30), 0) << "a push left unacknowledged at the end";
  out->events = channel.events;
  out->overwritten = channel.overwritten;
}

struct Case {
  int push_every;
  float clip;
};

class AckWindow : public ::testing::TestWithParam<Case> {};

TEST_P(AckWindow, AStepGoesOnBeforeItsAcksButNoPushedGradientIsOverwritten) {
  constexpr int kSteps = 6;
  Outcome o;
  ASSERT_NO_FATAL_FAILURE(Train(kSteps, GetParam().push_every, GetParam().clip, &o));
  EXPECT_EQ(o.overwritten, 0);
  const int pushes = kSteps / GetParam().push_every;
  // Clock c is reported at the end of the push step that sent clock c - 1's pushes. The clock
  // report after them (c + 1) comes before their first acknowledgement: nobody waited for them.
  for (int64_t c = 0; c + 1 < pushes; ++c) {
    SCOPED_TRACE(fmt::format("pushes of clock {}", c));
    size_t first_ack = o.events.size(), next_clock = o.events.size();
    for (size_t i = 0; i < o.events.size(); ++i) {
      const auto& e = o.events[i];
      if (e.kind == LateReadChannel::kAck && e.clock == c) first_ack = std::min(first_ack, i);
      if (e.kind == LateReadChannel::kClock && e.clock == c + 1) next_clock = std::min(next_clock, i);
    }
    ASSERT_LT(first_ack, o.events.size()) << "never acknowledged";
    EXPECT_LT(next_clock, first_ack);
  }
}

TEST_P(AckWindow, ProgressIsSavedOnlyForAcknowledgedSteps) {
  constexpr int kSteps = 6;
  Outcome o;
  ASSERT_NO_FATAL_FAILURE(Train(kSteps, GetParam().push_every, GetParam().clip, &o));
  EXPECT_EQ(o.unacked_at_save, 0);
  ASSERT_EQ(o.saved.size(), static_cast<size_t>(kSteps) + 1);  // each step, then finished
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(o.saved[static_cast<size_t>(i)].step, i + 1);
    EXPECT_FALSE(o.saved[static_cast<size_t>(i)].finished);
  }
  EXPECT_EQ(o.saved.back().step, kSteps);
  EXPECT_TRUE(o.saved.back().finished);
}

INSTANTIATE_TEST_SUITE_P(Modes, AckWindow,
                         ::testing::Values(Case{1, -1.0f}, Case{2, -1.0f}, Case{1, 0.5f}),
                         [](const auto& info) {
                           return fmt::format("push_every_{}{}", info.param.push_every,
                                              info.param.clip > 0 ? "_clipped" : "");
                         });

}  // namespace
}  // namespace downpour::worker
