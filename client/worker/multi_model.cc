// multi_model.cc — see multi_model.h.
#include "client/worker/multi_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <thread>

#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/ps/ps_client.h"
#include "client/worker/loader_sources.h"
#include "client/worker/local_solver.h"
#include "client/worker/ps_channel.h"
#include "client/worker/run_setup.h"
#include "client/worker/trainer.h"
#include "common/codec.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/process_net.h"
#include "common/rendezvous.h"
#include "common/rotation.h"
#include "common/zmq_transport.h"
#include "data/input_check.h"

namespace downpour::worker {
namespace {

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One model as this worker holds it.
struct ModelSlot {
  std::string name;
  std::string config;
  SolverConfig solver;  // ModelSolver: a poly max_iter of 0 resolved
  std::unique_ptr<engine::Net> net;
  ParamLayout layout;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<LocalSolver> local;  // the rule's state of the current local stage (or independent job)
  std::vector<float> start;    // weights at the start of the current local stage
  int64_t iter = 0;            // the model's lr-schedule iteration as this worker last knew it
  std::unique_ptr<engine::Net> eval_net;  // batch kEvalBatch, made at the first evaluation
};

int64_t MinOf(std::span<const int64_t> v) {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int64_t x : v) m = std::min(m, x);
  return v.empty() ? 0 : m;
}

// Best first: top-1 descending, then loss ascending, then model id (the leaderboard's order).
void SortBestFirst(std::vector<LeaderboardRow>* rows) {
  std::sort(rows->begin(), rows->end(), [](const LeaderboardRow& x, const LeaderboardRow& y) {
    return x.top1 != y.top1 ? x.top1 > y.top1 : x.loss != y.loss ? x.loss < y.loss : x.model < y.model;
  });
}

class MultiModelWorker {
 public:
  MultiModelWorker(const RunConfig& c, const WorkerArgs& a) : c_(c), a_(a), id_(a.id) {}

  Status Setup(bool* started);
  // Trains every stage of this worker; `*result` gets its totals over them (no evaluation).
  Status Run(TrainResult* result);

 private:
  Status OpenPartition(int partition, TrainSource** out);
  int64_t StageSteps(const StageTask& t, TrainSource* source) const;
  Status PullWhenMoved(ModelSlot& m, int model, int64_t version, int stage, double* wait_s);
  Status LocalStage(ModelSlot& m, const StageTask& t, int stage, TrainSource* source, int64_t steps, double* loss);
  Status DataParallelStage(ModelSlot& m, TrainSource* source, int64_t steps, int64_t clock_base);
  Status WaitForEveryWorker();
  Status EvaluateModels();
  // The model's weights as this worker last left them (its net), on eval.test_batches test batches.
  Status EvaluateStage(ModelSlot& m, int model, int stage, int64_t images, double run_s);
  Status EvalNetOf(ModelSlot& m, engine::Net** out);
  // Payload bytes this worker's clients moved through same-host shared memory (all models).
  TrafficCounts SharedMemoryTraffic() const;
  std::unique_ptr<TestSource> test_;

  const RunConfig& c_;
  const WorkerArgs& a_;
  const int id_;
  // Destroyed in reverse: the follower before the clients, the clients and the rendezvous link
  // before the transport whose ZeroMQ context they use.
  ProcessNet pnet_;
  std::unique_ptr<ProcessTransport> transport_;
  std::unique_ptr<RendezvousClient> link_;
  std::vector<ModelSlot> models_;
  std::unique_ptr<ServerMoveFollower> follow_;
  std::map<int, std::unique_ptr<TrainSource>> partitions_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::chrono::milliseconds wait_{0};
  int64_t image_bytes_ = 0;  // pixel bytes of one training image (C × H × W, uint8 records)
  int64_t train_images_ = 1; // the training set: this worker's partition × W (partitions differ by a record)
};

Status MultiModelWorker::Setup(bool* started) {
  if (a_.local) {
    return InvalidArgument("--local: the run config trains {} models ([[models]]); a multi-model run needs its "
                           "servers: start it with downpour-launch",
                           c_.models.size());
  }
  if (id_ < 0 || id_ >= c_.cluster.workers) {
    return InvalidArgument("--id {}: a multi-model run's workers are 0..{} (its rotation is planned for "
                           "cluster.workers; no worker joins it)",
                           id_, c_.cluster.workers - 1);
  }
  const int K = static_cast<int>(c_.models.size());
  // A restarted worker (the launcher's --resume) finds its first unfinished stage from the
  // models' versions: possible when each of its stages is its own (one holder, a move push).
  if (a_.resume && !EveryStageHasOneHolder(c_.rotation.scheme, K, c_.cluster.workers)) {
    return InvalidArgument(
        "--resume: worker {} of this multi-model run shares stages with other workers (rotation.scheme = \"{}\", "
        "{} models on {} workers): a restarted worker cannot tell its own updates of a shared stage from the "
        "others'; only runs whose stages each have one holder (a pipeline with K >= W, or \"independent\") "
        "take a restarted worker back (docs/multi_model.md)",
        id_, RotationSchemeName(c_.rotation.scheme), K, c_.cluster.workers);
  }
  std::vector<ParamLayout> layouts;
  for (int k = 0; k < K; ++k) {
    const RunConfig one = ModelRunConfig(c_, k);
    DP_RETURN_IF_ERROR(data::CheckRunDataFitsModel(one));
    ModelSlot m;
    m.name = c_.models[static_cast<size_t>(k)].name;
    m.config = c_.models[static_cast<size_t>(k)].config;
    m.solver = ModelSolver(c_, k);
    engine::NetSpec spec;
    DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(m.config, &spec));
    DP_RETURN_IF_ERROR(engine::Net::Create(spec, NetOptionsFor(one, c_.worker.batch_size), &m.net));
    m.net->InitParams(static_cast<uint64_t>(c_.run.seed));
    DP_RETURN_IF_ERROR(ParamLayout::Build(m.net->param_specs(), c_.cluster.servers, c_.cluster.chunk_elems, &m.layout));
    layouts.push_back(m.layout);
    image_bytes_ = int64_t{m.net->input_channels()} * m.net->input_height() * m.net->input_width();
    models_.push_back(std::move(m));
  }
  const auto metrics_dir = std::filesystem::path(a_.run_dir) / "metrics";
  std::error_code ec;
  std::filesystem::create_directories(metrics_dir, ec);
  if (ec) return IoError("run dir {}: cannot create {}: {}", a_.run_dir, metrics_dir.string(), ec.message());
  DP_RETURN_IF_ERROR(SetUpProcessNet(c_, a_.net, NetRole::kWorker, a_.run_dir, &pnet_));
  // The worker's own partition is opened before anything starts (a missing shard is bad input).
  TrainSource* own = nullptr;
  DP_RETURN_IF_ERROR(OpenPartition(id_, &own));
  train_images_ = std::max<int64_t>(1, own->shard_size() * c_.cluster.workers);
  DP_RETURN_IF_ERROR(
      MetricsWriter::Open((metrics_dir / fmt::format("worker-{}.jsonl", id_)).string(), "worker", id_, &metrics_));
  if (started != nullptr) *started = true;

  spdlog::info("worker {}: {}", id_, pnet_.Describe(""));
  transport_ = std::make_unique<ProcessTransport>(pnet_);
  RendezvousOptions ro;
  ro.coordinator = pnet_.coordinator;
  ro.token = pnet_.token;
  ro.role = Role::kWorker;
  ro.requested_id = id_;
  ro.layout_hash = CombinedLayoutHash(layouts);
  ro.heartbeat_interval = std::chrono::milliseconds(c_.cluster.heartbeat_ms);
  RendezvousInfo info;
  DP_RETURN_IF_ERROR(RendezvousClient::Register(transport_.get(), ro, std::chrono::seconds(120), &link_, &info));
  if (info.id != id_) return FailedPrecondition("worker {}: the coordinator answered with id {}", id_, info.id);
  link_->StartHeartbeats({});
  wait_ = RequestWait(c_.cluster);
  std::vector<PsClient*> clients;
  for (int k = 0; k < K; ++k) {
    ModelSlot& m = models_[static_cast<size_t>(k)];
    PsClientOptions po = WorkerClientOptions(c_, a_.run_dir, info, id_, pnet_.token);
    po.model_id = static_cast<uint32_t>(k);
    DP_RETURN_IF_ERROR(PsClient::Create(transport_.get(), m.layout, po, &m.client));
    clients.push_back(m.client.get());
  }
  follow_ = std::make_unique<ServerMoveFollower>(link_.get(), clients, fmt::format("worker {}", id_));
  for (ModelSlot& m : models_) {
    DP_RETURN_IF_ERROR(m.client->Connect(wait_));
    // Every worker offers the same seeded weights; the servers keep the first.
    DP_RETURN_IF_ERROR(m.client->Wait(m.client->PushInit(m.net->params()), wait_));
  }
  return Status::Ok();
}

Status MultiModelWorker::OpenPartition(int partition, TrainSource** out) {
  auto it = partitions_.find(partition);
  if (it == partitions_.end()) {
    std::unique_ptr<TrainSource> source;
    // Worker `partition`'s LMDB (data.sharding = "own"), shuffled by this worker's own seed.
    const int classes = models_.empty() ? 0 : models_[0].net->num_classes();
    DP_RETURN_IF_ERROR(OpenLoaderTrainSource(c_, partition, a_.shuffle, classes, &source));
    it = partitions_.emplace(partition, std::move(source)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

int64_t MultiModelWorker::StageSteps(const StageTask& t, TrainSource* source) const {
  const int64_t per_unit =
      c_.rotation.stage_steps > 0
          ? c_.rotation.stage_steps
          : std::max<int64_t>(1, (source->shard_size() + c_.worker.batch_size - 1) / c_.worker.batch_size);
  return per_unit * t.units;
}

// A stage's holder pulls the model once it has taken every update of the stages before
// (VersionsBefore): the model's chunk versions count its move pushes and its gradient updates.
Status MultiModelWorker::PullWhenMoved(ModelSlot& m, int model, int64_t version, int stage, double* wait_s) {
  const double t0 = NowS();
  bool said = false;
  while (true) {
    DP_RETURN_IF_ERROR(m.client->Wait(m.client->Pull(m.net->params(), 0), wait_));
    if (MinOf(m.client->last_versions()) >= version) break;
    if (link_->shutdown_requested()) {
      return Unavailable("worker {}: the run ended while stage {} waited for model {} ({})", id_, stage, model, m.name);
    }
    if (!said) {
      spdlog::info("worker {}: stage {}: waiting for model {} ({}) to arrive ({} of {} earlier updates so far)", id_,
                   stage, model, m.name, MinOf(m.client->last_versions()), version);
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *wait_s = NowS() - t0;
  m.iter = MinOf(m.client->last_iters());
  return Status::Ok();
}

Status MultiModelWorker::LocalStage(ModelSlot& m, const StageTask& t, int stage, TrainSource* source, int64_t steps,
                                    double* loss) {
  engine::Net& net = *m.net;
  const auto params = net.params();
  if (m.local == nullptr) m.local = std::make_unique<LocalSolver>(m.solver);
  if (t.pull || !m.local->ready(params.size())) m.local->Reset(params.size());
  m.start.assign(params.begin(), params.end());
  double loss_sum = 0;
  for (int64_t s = 0; s < steps; ++s) {
    BatchView batch;
    DP_RETURN_IF_ERROR(source->Next(&batch));
    DP_RETURN_IF_ERROR(net.CheckLabels(batch.labels, batch.n));
    if (batch.n != net.batch_size() || batch.c != net.input_channels() || batch.h != net.input_height() ||
        batch.w != net.input_width()) {
      return InvalidArgument("worker {}: model {} ({}): batch {}x{}x{}x{} does not match the net's input {}x{}x{}x{}",
                             id_, t.model, m.name, batch.n, batch.c, batch.h, batch.w, net.batch_size(),
                             net.input_channels(), net.input_height(), net.input_width());
    }
    const float l = net.ForwardBackward(batch.data, batch.labels);
    if (!std::isfinite(l)) {
      return FailedPrecondition("worker {}: model {} ({}) diverged: training loss {} at stage {} step {} (lower its "
                                "base_lr)",
                                id_, t.model, m.name, l, stage, s);
    }
    loss_sum += l;
    // The model's place on its schedule: batches it has processed, this stage's other holders'
    // included (they train at the same time).
    m.local->Step(&net, m.iter + LocalIteration(s, 1, t.group));
    if (a_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a_.step_delay_ms));
  }
  std::vector<float> change(params.size());
  const float inv = 1.0f / static_cast<float>(t.group);
  for (size_t i = 0; i < change.size(); ++i) change[i] = (params[i] - m.start[i]) * inv;
  if (steps > static_cast<int64_t>(kMaxMoveBatches)) {
    return InvalidArgument("worker {}: a stage of {} steps is more than a move push can say", id_, steps);
  }
  DP_RETURN_IF_ERROR(m.client->Wait(m.client->PushMove(change, static_cast<uint32_t>(steps)), wait_));
  m.iter += LocalIteration(steps, 1, t.group);
  *loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0;
  return Status::Ok();
}

// The stage's holders train the model together through the servers, per step, in the run's
// consistency mode; the trainer's clocks start at clock_base (sync: the model's round).
Status MultiModelWorker::DataParallelStage(ModelSlot& m, TrainSource* source, int64_t steps, int64_t clock_base) {
  TrainerOptions to;
  to.clock_base = clock_base;
  to.worker_id = id_;
  to.worker = c_.worker;
  to.worker.steps = steps;
  to.worker.epochs = 0;
  to.solver = m.solver;
  to.overlap_pull = a_.overlap && c_.consistency.mode != ConsistencyMode::kSync;
  to.compression = c_.compression;
  to.step_delay = std::chrono::milliseconds(a_.step_delay_ms);
  RendezvousClient* link = link_.get();
  PsChannel channel(m.client.get(), wait_, [link](int64_t clock) {
    link->set_clock(clock);
    return Status::Ok();
  });
  // The stage's own records are written by Run (one "stage" line); the trainer writes none.
  Trainer trainer(to, m.net.get(), nullptr, &m.layout, &channel, source, nullptr, nullptr, nullptr);
  TrainResult r;
  return trainer.Run(&r);  // its per-step losses go unrecorded (no metrics writer)
}

Status MultiModelWorker::Run(TrainResult* result) {
  const int K = static_cast<int>(c_.models.size());
  const int W = c_.cluster.workers;
  const std::vector<StageTask> stages =
      WorkerStages(c_.rotation.scheme, K, W, c_.rotation.passes, id_, c_.rotation.groups);
  // A restarted worker (Setup checked that each of its stages is its own) skips the stages whose
  // move the servers have taken (the model's version is past the stage's end, and no later
  // holder moves it before this stage's move arrives) and redoes the first other one from the
  // servers' copy of the model: no move is lost or applied twice.
  size_t first = 0;
  if (a_.resume) {
    for (; first < stages.size(); ++first) {
      const StageTask& t = stages[first];
      ModelSlot& m = models_[static_cast<size_t>(t.model)];
      DP_RETURN_IF_ERROR(m.client->Wait(m.client->Pull(m.net->params(), 0), wait_));
      if (MinOf(m.client->last_versions()) < VersionsAfter(t, c_.consistency.mode, 0)) break;
    }
    spdlog::info("worker {}: restarted: {} of its {} stages were done; it goes on at stage {}", id_, first,
                 stages.size(), first + 1);
  }
  (void)metrics_->Write("mm_start", {{"models", K},
                                     {"workers", W},
                                     {"scheme", RotationSchemeName(c_.rotation.scheme)},
                                     {"mode", ConsistencyModeString(c_.consistency)},
                                     {"groups", RotationGroupsName(c_.rotation.groups)},
                                     {"passes", c_.rotation.passes},
                                     {"stages", static_cast<int64_t>(stages.size())},
                                     {"resumed", a_.resume},
                                     {"first_stage", static_cast<int64_t>(first)},
                                     {"batch_size", c_.worker.batch_size}});
  const double t_run = NowS();
  int64_t total_steps = 0, total_images = 0, total_model_bytes = 0, total_data_moved = 0;
  double total_wait = 0, total_eval = 0;
  for (size_t i = first; i < stages.size(); ++i) {
    StageTask t = stages[i];
    if (a_.resume && i == first) t.pull = true;  // an independent job's weights were lost with the process
    const int stage = static_cast<int>(i);
    ModelSlot& m = models_[static_cast<size_t>(t.model)];
    TrainSource* source = nullptr;
    DP_RETURN_IF_ERROR(OpenPartition(t.partition, &source));
    const int64_t steps = StageSteps(t, source);
    const TrafficCounts before = transport_->traffic();
    const TrafficCounts shm_before = SharedMemoryTraffic();
    const double t0 = NowS();
    double wait_s = 0, loss = 0;
    const int64_t floats = m.layout.total_elems();
    int64_t model_bytes = 0;
    const ConsistencyMode mode = c_.consistency.mode;
    const int64_t versions_before = VersionsBefore(t, mode, steps);
    if (t.data_parallel) {
      // A pipeline group's holders start once the model has taken the earlier stages' updates
      // (a sync round waits for them anyway; async must not train from the old weights).
      if (versions_before > 0) DP_RETURN_IF_ERROR(PullWhenMoved(m, t.model, versions_before, stage, &wait_s));
      DP_RETURN_IF_ERROR(DataParallelStage(m, source, steps, mode == ConsistencyMode::kSync ? versions_before : 0));
    } else {
      if (t.pull) {
        DP_RETURN_IF_ERROR(PullWhenMoved(m, t.model, versions_before, stage, &wait_s));
        model_bytes += floats * 4;
      }
      DP_RETURN_IF_ERROR(LocalStage(m, t, stage, source, steps, &loss));
      model_bytes += floats * 4;
    }
    const TrafficCounts after = transport_->traffic();
    const TrafficCounts shm_after = SharedMemoryTraffic();
    if (t.data_parallel) {
      // The model's payload a data-parallel stage moves: every pull and every gradient push of a
      // whole model (f32), counted as it is asked for, not from the wire counters, which miss
      // what goes through same-host shared memory.
      const int64_t pulls = (steps + c_.worker.pull_every - 1) / c_.worker.pull_every;
      model_bytes = (pulls + steps / c_.worker.push_every) * floats * 4;
    }
    const int64_t images = steps * c_.worker.batch_size;
    const int64_t data_moved = t.partition == id_ ? 0 : images * image_bytes_;
    total_steps += steps;
    total_images += images;
    total_model_bytes += model_bytes;
    total_data_moved += data_moved;
    total_wait += wait_s;
    const double seconds = NowS() - t0;
    // The model as it moves on, on the test set: the curve of each model over the images it saw.
    // A local stage's holder evaluates the copy it handed on (not when a group averages copies);
    // a data-parallel stage's first holder (worker 0 in sequential, worker i < K in a pipeline
    // group) the servers' copy once it has taken every holder's updates of the stage.
    const bool first_holder = c_.rotation.scheme == RotationScheme::kSequential ? id_ == 0 : id_ < K;
    const bool eval_due = c_.eval.every_steps > 0 && !c_.data.test.empty() &&
                          (t.data_parallel ? first_holder : t.group == 1);
    if (eval_due) {
      if (t.data_parallel) {
        double waited = 0;
        DP_RETURN_IF_ERROR(PullWhenMoved(m, t.model, VersionsAfter(t, mode, steps), stage, &waited));
        total_wait += waited;
        m.iter = MinOf(m.client->last_iters());
      }
      const double e0 = NowS();
      DP_RETURN_IF_ERROR(EvaluateStage(m, t.model, stage, m.iter * c_.worker.batch_size, NowS() - t_run));
      total_eval += NowS() - e0;
    }
    (void)metrics_->Write("stage", {{"stage", stage},
                                    {"model", t.model},
                                    {"name", m.name},
                                    {"partition", t.partition},
                                    {"own", t.partition == id_},
                                    {"group", t.group},
                                    {"steps", steps},
                                    {"images", images},
                                    {"loss", t.data_parallel ? MetricValue() : MetricValue(loss)},
                                    {"seconds", seconds},
                                    {"wait_s", wait_s},
                                    {"model_bytes", model_bytes},
                                    {"data_bytes_moved", data_moved},
                                    {"tx_bytes", static_cast<int64_t>(after.sent_bytes - before.sent_bytes)},
                                    {"rx_bytes", static_cast<int64_t>(after.received_bytes - before.received_bytes)},
                                    {"shm_tx_bytes", static_cast<int64_t>(shm_after.sent_bytes - shm_before.sent_bytes)},
                                    {"shm_rx_bytes",
                                     static_cast<int64_t>(shm_after.received_bytes - shm_before.received_bytes)},
                                    {"run_s", NowS() - t_run}});
    if (!a_.quiet) {
      spdlog::info("worker {}: stage {}/{}: model {} ({}) on partition {}: {} steps in {:.1f} s{}{}", id_, stage + 1,
                   stages.size(), t.model, m.name, t.partition, steps, seconds,
                   t.data_parallel ? std::string() : fmt::format(", loss {:.4f}", loss),
                   wait_s > 0.05 ? fmt::format(" (waited {:.1f} s for it)", wait_s) : std::string());
    }
  }
  const TrafficCounts traffic = transport_->traffic();
  const TrafficCounts shm = SharedMemoryTraffic();
  const double wall = NowS() - t_run;
  result->steps = total_steps;
  result->images = total_images;
  result->wall_s = wall;
  result->train_s = wall - total_wait - total_eval;
  result->images_per_s = result->train_s > 0 ? static_cast<double>(total_images) / result->train_s : 0;
  (void)metrics_->Write("done", {{"images", total_images},
                                 {"wall_s", wall},
                                 // Training time: waits for models and evaluations left out.
                                 {"train_s", wall - total_wait - total_eval},
                                 {"eval_s", total_eval},
                                 {"wait_s", total_wait},
                                 {"model_bytes", total_model_bytes},
                                 {"data_bytes_moved", total_data_moved},
                                 {"tx_bytes_total", static_cast<int64_t>(traffic.sent_bytes)},
                                 {"rx_bytes_total", static_cast<int64_t>(traffic.received_bytes)},
                                 {"shm_tx_bytes_total", static_cast<int64_t>(shm.sent_bytes)},
                                 {"shm_rx_bytes_total", static_cast<int64_t>(shm.received_bytes)}});
  DP_RETURN_IF_ERROR(link_->AnnounceFinished(std::chrono::milliseconds(10000)));
  if (id_ == 0 && !c_.data.test.empty()) {
    DP_RETURN_IF_ERROR(WaitForEveryWorker());
    DP_RETURN_IF_ERROR(EvaluateModels());
  }
  const Status done = link_->AnnounceDone(std::chrono::milliseconds(10000));
  if (!done.ok()) spdlog::warn("worker {}: could not tell the coordinator it is done: {}", id_, done.ToString());
  return Status::Ok();
}

TrafficCounts MultiModelWorker::SharedMemoryTraffic() const {
  TrafficCounts sum;
  for (const ModelSlot& m : models_) {
    if (!m.client) continue;
    const TrafficCounts c = m.client->shared_memory_traffic();
    sum.sent_bytes += c.sent_bytes;
    sum.received_bytes += c.received_bytes;
  }
  return sum;
}

Status MultiModelWorker::EvalNetOf(ModelSlot& m, engine::Net** out) {
  if (!m.eval_net) {
    engine::NetSpec spec;
    DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(m.config, &spec));
    const RunConfig one = ModelRunConfig(c_, static_cast<int>(&m - models_.data()));
    DP_RETURN_IF_ERROR(engine::Net::Create(spec, NetOptionsFor(one, kEvalBatch), &m.eval_net));
  }
  if (!test_) DP_RETURN_IF_ERROR(OpenTestSource(c_, kEvalBatch, m.eval_net->num_classes(), &test_));
  *out = m.eval_net.get();
  return Status::Ok();
}

Status MultiModelWorker::EvaluateStage(ModelSlot& m, int model, int stage, int64_t images, double run_s) {
  engine::Net* net = nullptr;
  DP_RETURN_IF_ERROR(EvalNetOf(m, &net));
  const auto from = m.net->params();
  std::copy(from.begin(), from.end(), net->params().begin());
  const double t0 = NowS();
  EvalRecord r;
  DP_RETURN_IF_ERROR(EvaluateNet(net, test_.get(), c_.eval.test_batches, &r));
  (void)metrics_->Write("model_curve", {{"model", model},
                                        {"name", m.name},
                                        {"stage", stage},
                                        {"train_images", images},
                                        {"epoch", static_cast<double>(images) / static_cast<double>(train_images_)},
                                        {"top1", r.top1},
                                        {"top5", r.top5},
                                        {"loss", r.loss},
                                        {"test_images", r.images},
                                        {"byte_input", r.byte_input},
                                        {"eval_s", NowS() - t0},
                                        {"run_s", run_s}});
  return Status::Ok();
}

// The final evaluation is of the finished run: every other worker has finished (or died).
Status MultiModelWorker::WaitForEveryWorker() {
  bool said = false;
  while (!link_->shutdown_requested()) {
    const std::vector<int32_t> gone = link_->gone_workers();
    std::vector<int32_t> waiting;
    for (int32_t w = 0; w < c_.cluster.workers; ++w) {
      if (w != id_ && std::find(gone.begin(), gone.end(), w) == gone.end()) waiting.push_back(w);
    }
    if (waiting.empty() && link_->live_workers() <= 0) break;
    if (!waiting.empty() && !said) {
      spdlog::info("worker {}: waiting for worker(s) {} to finish before evaluating the models", id_,
                   fmt::join(waiting, ", "));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Ok();
}

Status MultiModelWorker::EvaluateModels() {
  std::vector<LeaderboardRow> rows;
  const std::filesystem::path models_dir = std::filesystem::path(a_.run_dir) / "models";
  std::error_code ec;
  std::filesystem::create_directories(models_dir, ec);
  if (ec) return IoError("run dir {}: cannot create {}: {}", a_.run_dir, models_dir.string(), ec.message());
  for (size_t k = 0; k < models_.size(); ++k) {
    ModelSlot& m = models_[k];
    const RunConfig one = ModelRunConfig(c_, static_cast<int>(k));
    engine::NetSpec spec;
    DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(m.config, &spec));
    std::unique_ptr<engine::Net> eval_net;
    DP_RETURN_IF_ERROR(engine::Net::Create(spec, NetOptionsFor(one, kEvalBatch), &eval_net));
    DP_RETURN_IF_ERROR(m.client->Wait(m.client->Pull(eval_net->params(), 0), wait_));
    const int64_t iter = MinOf(m.client->last_iters());
    std::unique_ptr<TestSource> test;
    DP_RETURN_IF_ERROR(OpenTestSource(one, kEvalBatch, eval_net->num_classes(), &test));
    EvalRecord r;
    DP_RETURN_IF_ERROR(EvaluateNet(eval_net.get(), test.get(), c_.eval.test_batches, &r));
    const std::string path = (models_dir / (m.name + ".dpt")).string();
    DP_RETURN_IF_ERROR(SaveModel(*eval_net, path));
    LeaderboardRow row;
    row.model = static_cast<int>(k);
    row.name = m.name;
    row.top1 = r.top1;
    row.top5 = r.top5;
    row.loss = r.loss;
    row.images = iter * c_.worker.batch_size;
    rows.push_back(row);
    (void)metrics_->Write("model_eval", {{"model", row.model},
                                         {"name", row.name},
                                         {"top1", r.top1},
                                         {"top5", r.top5},
                                         {"loss", r.loss},
                                         {"test_images", r.images},
                                         {"byte_input", r.byte_input},
                                         {"train_images", row.images},
                                         {"base_lr", m.solver.base_lr},
                                         {"weight_decay", m.solver.weight_decay},
                                         {"path", path}});
  }
  const std::string json = LeaderboardJson(rows);
  DP_RETURN_IF_ERROR(WriteFileAtomic((std::filesystem::path(a_.run_dir) / "leaderboard.json").string(), json));
  SortBestFirst(&rows);
  std::printf("leaderboard (%zu models, best first):\n", rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("  %2zu. %-40s top-1 %6.2f%%  top-5 %6.2f%%  loss %.4f  (%lld training images)\n", i + 1,
                rows[i].name.c_str(), 100 * rows[i].top1, 100 * rows[i].top5, rows[i].loss,
                static_cast<long long>(rows[i].images));
  }
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

std::string LeaderboardJson(std::vector<LeaderboardRow> rows) {
  SortBestFirst(&rows);
  std::string out = "{\"models\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const LeaderboardRow& r = rows[i];
    std::string name;
    for (char ch : r.name) {  // names are [A-Za-z0-9_.=+-] (run_config.cc); escape anyway
      if (ch == '"' || ch == '\\') name += '\\';
      name += ch;
    }
    out += fmt::format("{}\n  {{\"rank\": {}, \"model\": {}, \"name\": \"{}\", \"top1\": {}, \"top5\": {}, "
                       "\"loss\": {}, \"train_images\": {}}}",
                       i ? "," : "", i + 1, r.model, name, r.top1, r.top5, r.loss, r.images);
  }
  return out + "\n]}\n";
}

Status RunMultiModelWorker(const RunConfig& config, const WorkerArgs& args, TrainResult* result, bool* started) {
  MultiModelWorker w(config, args);
  DP_RETURN_IF_ERROR(w.Setup(started));
  return w.Run(result);
}

}  // namespace downpour::worker
