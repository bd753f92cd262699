// worker_app.cc — see worker_app.h.
#include "client/worker/worker_app.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <thread>

#include "client/caffe/weights_io.h"
#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/ps/ps_client.h"
#include "client/worker/loader_sources.h"
#include "client/worker/multi_model.h"
#include "client/worker/progress.h"
#include "client/worker/ps_channel.h"
#include "client/worker/reslicing_source.h"
#include "client/worker/run_setup.h"
#include "client/worker/sources.h"
#include "client/worker/worker_state.h"
#include "common/ack_history.h"
#include "common/file_io.h"
#include "common/grad_codec.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/process_net.h"
#include "common/rendezvous.h"
#include "common/tensorboard.h"
#include "common/trace.h"
#include "common/zmq_transport.h"
#include "data/input_check.h"

namespace downpour::worker {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Slice `slice` of the training set for worker `id` (slice sharding; `own` reads the worker's
// LMDB whatever the slice). The shuffle seed comes from the id.
Status OpenSliceSource(const RunConfig& c, int id, const DataSlice& slice, bool shuffle, int num_classes,
                       std::unique_ptr<TrainSource>* out) {
  std::string labels;
  if (IsIdxImagePath(c.data.train, &labels)) {
    IdxSourceOptions o;
    o.images_path = c.data.train;
    o.labels_path = labels;
    o.batch_size = c.worker.batch_size;
    o.scale = c.data.scale;
    o.shard_index = slice.index;
    o.shard_count = slice.count;
    o.shuffle = shuffle;
    o.seed = static_cast<uint64_t>(c.run.seed) + static_cast<uint64_t>(id / c.cluster.workers) * 0x9E3779B97F4A7C15ull;
    return OpenIdxTrainSource(o, out);
  }
  return OpenLoaderTrainSource(c, id, shuffle, num_classes, out, slice.index, slice.count);
}

Status OpenTrainSource(const RunConfig& c, int id, bool shuffle, int num_classes, std::unique_ptr<TrainSource>* out) {
  std::string labels;
  if (IsIdxImagePath(c.data.train, &labels)) {
    if (c.data.sharding != DataSharding::kSlice)
      return InvalidArgument("data.sharding = \"own\" needs per-worker LMDBs; data.train = {} is one IDX file",
                             c.data.train);
    IdxSourceOptions o;
    o.images_path = c.data.train;
    o.labels_path = labels;
    o.batch_size = c.worker.batch_size;
    o.scale = c.data.scale;
    // A worker that joined (id >= workers) reads slice id mod workers, in an order of its own.
    o.shard_index = id % c.cluster.workers;
    o.shard_count = c.cluster.workers;
    o.shuffle = shuffle;
    o.seed = static_cast<uint64_t>(c.run.seed) + static_cast<uint64_t>(id / c.cluster.workers) * 0x9E3779B97F4A7C15ull;
    return OpenIdxTrainSource(o, out);
  }
  return OpenLoaderTrainSource(c, id, shuffle, num_classes, out);
}

Status BuildNets(const RunConfig& c, bool need_eval, std::unique_ptr<engine::Net>* net,
                 std::unique_ptr<engine::Net>* eval_net) {
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(c.model.config, &spec));
  engine::NetOptions o = NetOptionsFor(c, c.worker.batch_size);
  DP_RETURN_IF_ERROR(engine::Net::Create(spec, o, net));
  (*net)->InitParams(static_cast<uint64_t>(c.run.seed));
  if (!c.worker.emulate_ms.empty()) {
    DP_RETURN_IF_ERROR((*net)->SetEmulatedCompute(c.worker.emulate_ms));
    double ms = 0;
    for (float m : c.worker.emulate_ms) ms += m;
    spdlog::warn("emulated compute (worker.emulate_ms): this worker trains nothing; each step sleeps {:.1f} ms "
                 "through the model's layers and pushes zero gradients",
                 ms);
  }
  if (!c.model.weights.empty()) {
    // Fine-tuning as Caffe does it: tensors are copied by name; the file's extra layers are
    // ignored and the model's layers the file lacks keep their fillers (both listed).
    caffe_io::WeightsPolicy policy;
    policy.ignore_extra = true;
    policy.keep_missing = true;
    caffe_io::WeightsReport report;
    DP_RETURN_IF_ERROR(caffe_io::LoadWeightsFile(c.model.weights, net->get(), policy, &report));
    spdlog::info("initial weights from {}{}{}", c.model.weights,
                 report.kept.empty() ? "" : fmt::format("; kept at their fillers: {}", fmt::join(report.kept, ", ")),
                 report.skipped.empty() ? "" : fmt::format("; not in the model: {}", fmt::join(report.skipped, ", ")));
  }
  if (need_eval) {
    o.batch = kEvalBatch;
    DP_RETURN_IF_ERROR(engine::Net::Create(spec, o, eval_net));
  }
  return Status::Ok();
}

// After training: every server's counters (staleness histogram included) into the metrics,
// so the run's summary has the servers' own staleness measurements.
void LogServerStats(PsClient* client, int servers, MetricsWriter* metrics) {
  for (int s = 0; s < servers; ++s) {
    ShardStatsWire st;
    const Status status = client->Stats(s, &st, std::chrono::milliseconds(5000));
    if (!status.ok()) {
      (void)metrics->Write("server_stats", {{"server", s}, {"ok", false}, {"error", status.ToString()}});
      continue;
    }
    std::string hist = "[";
    for (size_t i = 0; i < st.staleness_histogram.size(); ++i)
      hist += fmt::format("{}{}", i ? "," : "", st.staleness_histogram[i]);
    hist += "]";
    (void)metrics->Write("server_stats", {{"server", s},
                                          {"ok", true},
                                          {"pushes_applied", st.pushes_applied},
                                          {"pushes_rejected", st.pushes_rejected},
                                          {"chunk_updates", st.chunk_updates},
                                          {"staleness_sum", st.staleness_sum},
                                          {"staleness_max", st.staleness_max},
                                          {"dropped_late", st.dropped_late},
                                          {"staleness_histogram", hist}});
  }
}

// After training: what this worker's client saw of each server — gradient push messages
// acknowledged (each once, resends included), messages resent and restarts noticed — to set
// against the servers' pushes_by_worker (equal: no acknowledged update lost, none doubled).
void LogPsAcks(const PsClient& client, int servers, MetricsWriter* metrics) {
  for (int s = 0; s < servers; ++s) {
    (void)metrics->Write("ps_acks", {{"server", s},
                                     {"pushes_acked", client.acked_pushes(s)},
                                     {"resent", client.resent_parts(s)},
                                     {"restarts_seen", client.restarts_seen(s)}});
  }
}

// In sync mode the servers' clock is the truth: a chunk at version v has applied clocks
// 0..v-1, so a worker (re)starts at clock v, the lowest over all chunks (a chunk already past it
// drops that clock's gradients as late), at step v·push_every.
Status PlaceAtServersClock(const RunConfig& c, PsClient* client, engine::Net* net, std::chrono::milliseconds wait,
                           WorkerProgress* p) {
  DP_RETURN_IF_ERROR(client->Wait(client->Pull(net->params(), 0), wait));
  int64_t clock = std::numeric_limits<int64_t>::max();
  for (int64_t v : client->last_versions()) clock = std::min(clock, v);
  p->clock = clock;
  p->step = clock * c.worker.push_every;
  p->images = p->step * c.worker.batch_size;
  p->finished = false;
  return Status::Ok();
}

// Where a resumed worker stands against the restored servers. Sync: at the servers' clock. In
// async/ssp each worker continues from its own saved step. Either way the servers hear the
// worker's clock before its first pull, which ssp waits on.
Status PlaceResumedWorker(const RunConfig& c, int id, PsClient* client, engine::Net* net,
                          std::chrono::milliseconds wait, WorkerProgress* p) {
  if (c.consistency.mode == ConsistencyMode::kSync) {
    const int64_t had = p->clock;
    DP_RETURN_IF_ERROR(PlaceAtServersClock(c, client, net, wait, p));
    if (had != p->clock) {
      spdlog::info("worker {}: sync resume at the servers' clock {} (this worker had reached clock {})", id, p->clock,
                   had);
    }
  }
  if (p->clock > 0) DP_RETURN_IF_ERROR(client->ReportClock(p->clock - 1, wait));
  spdlog::info("worker {}: resuming after step {} (clock {}, {:.1f} s of training so far)", id, p->step, p->clock,
               p->wall_s);
  return Status::Ok();
}

// A worker that joins a running job (elastic): in sync mode it starts at the servers' current
// clock, as a resumed worker does (the trainer then runs the steps left to the run's end); in
// async/ssp it starts at step 0 of its own.
Status PlaceJoiningWorker(const RunConfig& c, int id, PsClient* client, engine::Net* net,
                          std::chrono::milliseconds wait, std::optional<WorkerProgress>* resume) {
  if (c.consistency.mode != ConsistencyMode::kSync) {
    spdlog::info("worker {}: joins the running job", id);
    return Status::Ok();
  }
  WorkerProgress p;
  DP_RETURN_IF_ERROR(PlaceAtServersClock(c, client, net, wait, &p));
  if (p.clock > 0) DP_RETURN_IF_ERROR(client->ReportClock(p.clock - 1, wait));
  spdlog::info("worker {}: joins the running job at the servers' clock {} (step {})", id, p.clock, p.step);
  *resume = p;
  return Status::Ok();
}

// This worker's place in the cluster: its transport, its link to the coordinator and what the
// coordinator said (the servers' addresses, its id). Declared before what uses the transport.
struct ClusterLink {
  // The timeline (cluster.trace_events; off by default), before the transport that records into it.
  std::unique_ptr<TraceLog> trace;
  std::unique_ptr<ProcessTransport> transport;
  std::unique_ptr<RendezvousClient> rendezvous;
  RendezvousInfo info;
  bool joining = false;  // started by hand into a running job (id >= workers, or assigned)
};

// Rendezvous: the coordinator answers once every server has registered, with their addresses
// and this worker's id (assigned when `requested_id` is -1); heartbeats then carry this worker's
// clock (sync/ssp membership, dead-worker detection).
Status JoinCluster(const RunConfig& config, int requested_id, const ProcessNet& pnet, const ParamLayout& layout,
                   ClusterLink* out) {
  spdlog::info("worker {}: {}", requested_id, pnet.Describe(""));
  out->trace = std::make_unique<TraceLog>(fmt::format("worker {}", requested_id),
                                          static_cast<size_t>(config.cluster.trace_events));
  ProcessNet net = pnet;
  net.zmq.trace = out->trace.get();
  out->transport = std::make_unique<ProcessTransport>(net);
  RendezvousOptions ro;
  ro.coordinator = pnet.coordinator;
  ro.token = pnet.token;
  ro.role = Role::kWorker;
  ro.requested_id = requested_id;
  ro.layout_hash = layout.hash();
  ro.heartbeat_interval = std::chrono::milliseconds(config.cluster.heartbeat_ms);
  DP_RETURN_IF_ERROR(
      RendezvousClient::Register(out->transport.get(), ro, std::chrono::seconds(120), &out->rendezvous, &out->info));
  if (requested_id >= 0 && out->info.id >= 0 && out->info.id != requested_id) {
    return FailedPrecondition("worker {}: the coordinator answered with id {}", requested_id, out->info.id);
  }
  if (out->info.id < 0) return FailedPrecondition("worker {}: the coordinator assigned no id", requested_id);
  out->rendezvous->StartHeartbeats({});
  return Status::Ok();
}

// [compression]'s wire codecs (common/grad_codec.h; WorkerClientOptions sets them), said once at start.
void LogWireCodecs(const CompressionConfig& c, int32_t id) {
  std::string push = WireCodecName(c.push);
  if (c.push == WireCodec::kTopK) {
    push += fmt::format(" ({:g} of each chunk", c.top_k_fraction);
    if (c.top_k_warmup_pushes > 0 && c.top_k_fraction < kTopKWarmupStart) {
      push += fmt::format(", from {:g} over its first {} pushes", kTopKWarmupStart, c.top_k_warmup_pushes);
    }
    push += ")";
  }
  if (c.push == WireCodec::kTopK || c.push == WireCodec::kOneBit) {
    push += c.error_feedback ? " with error feedback" : " without error feedback";
  }
  spdlog::info("worker {}: wire codecs: push {}, pull {}", id, push, WireCodecName(c.pull));
}

Status RunDistributed(const RunConfig& config, const WorkerArgs& args, const ProcessNet& pnet,
                      const ParamLayout& layout, const TrainerOptions& to, engine::Net* net, engine::Net* eval_net,
                      TrainSource* train, TestSource* test, MetricsWriter* metrics, ProgressReporter* progress,
                      ClusterLink* cluster, TrainResult* out) {
  if (!cluster->rendezvous) DP_RETURN_IF_ERROR(JoinCluster(config, args.id, pnet, layout, cluster));
  RendezvousClient* link = cluster->rendezvous.get();
  const RendezvousInfo& info = cluster->info;
  // The timeline is written however the run ends (a failed run's is the one worth reading).
  TraceLog* trace = cluster->trace.get();
  trace->SetProcess(fmt::format("worker {}", info.id));
  const auto write = [run_dir = args.run_dir, id = info.id](TraceLog* t) {
    WriteTraceFile(*t, run_dir, fmt::format("worker-{}", id));
  };
  const std::unique_ptr<TraceLog, decltype(write)> write_trace(trace, write);
  PsClientOptions po = WorkerClientOptions(config, args.run_dir, info, args.id, pnet.token);
  po.trace = trace;
  if (config.checkpoint.history) {  // every acknowledged push, for downpour-history
    std::unique_ptr<AckHistoryWriter> acks;
    DP_RETURN_IF_ERROR(AckHistoryWriter::Open(AckHistoryPath(args.run_dir, info.id), &acks));
    po.on_push_acked = [acks = std::shared_ptr<AckHistoryWriter>(std::move(acks))](int s, uint64_t session,
                                                                                   uint64_t id) {
      acks->Add(AckRecord{s, session, id});
    };
  }
  if (const std::string link = EmulatedLinkNote(config); !link.empty()) spdlog::info("worker {}: {}", args.id, link);
  LogWireCodecs(config.compression, args.id);
  const auto wait = RequestWait(config.cluster);
  std::unique_ptr<PsClient> client;
  DP_RETURN_IF_ERROR(PsClient::Create(cluster->transport.get(), layout, po, &client));
  // A server restarted at another address (the coordinator's heartbeat replies say so) is
  // followed there.
  const ServerMoveFollower follow(link, client.get(), fmt::format("worker {}", args.id));
  // Put out of the run: whatever waits on the servers fails now (they may be gone already, the
  // run over), not after cluster.server_wait_ms. Cleared before the client goes.
  link->SetOnRemoved([c = client.get(), id = args.id] {
    c->Abort(FailedPrecondition("worker {} was declared dead by the coordinator while it was stopped or cut off, "
                                "and is out of the run (a restart with --resume joins again)",
                                id));
  });
  struct ClearOnRemoved {
    RendezvousClient* link;
    ~ClearOnRemoved() { link->SetOnRemoved({}); }
  } clear_on_removed{link};
  DP_RETURN_IF_ERROR(client->Connect(wait));
  // Every worker offers the same seeded initial weights; servers keep the first and pulls
  // wait until every chunk has weights (restored servers ignore them all).
  DP_RETURN_IF_ERROR(client->Wait(client->PushInit(net->params()), wait));
  TrainerOptions topts = to;
  topts.trace = trace;
  if (topts.resume) {
    DP_RETURN_IF_ERROR(PlaceResumedWorker(config, args.id, client.get(), net, wait, &*topts.resume));
    link->set_clock(topts.resume->clock);
  } else if (cluster->joining) {
    DP_RETURN_IF_ERROR(PlaceJoiningWorker(config, args.id, client.get(), net, wait, &topts.resume));
    if (topts.resume) link->set_clock(topts.resume->clock);
  }
  RendezvousClient* rendezvous = link;
  PsChannel channel(client.get(), wait, [rendezvous](int64_t clock) {
    rendezvous->set_clock(clock);
    return Status::Ok();
  });
  // Wire bytes per step and in total (step / done records): the process's one transport.
  topts.traffic = [transport = cluster->transport.get()] { return transport->traffic(); };
  // ... and the payloads that went through same-host shared memory instead (0 without a region).
  topts.shm_traffic = [c = client.get()] { return c->shared_memory_traffic(); };
  const bool final_eval = to.evaluate && test != nullptr;
  topts.on_training_done = [&, final_eval]() -> Status {
    DP_RETURN_IF_ERROR(rendezvous->AnnounceFinished(std::chrono::milliseconds(10000)));
    if (!final_eval) return Status::Ok();
    // The final evaluation and the saved model are of the finished run: wait until every other
    // worker, joiners included, has finished (or died), however far behind it is.
    const auto t0 = std::chrono::steady_clock::now();
    bool said = false, said_joiners = false;
    while (!rendezvous->shutdown_requested()) {
      std::vector<int32_t> gone = rendezvous->gone_workers();
      std::vector<int32_t> waiting;
      for (int32_t w = 0; w < config.cluster.workers; ++w) {
        if (w != args.id && std::find(gone.begin(), gone.end(), w) == gone.end()) waiting.push_back(w);
      }
      // Workers that joined the job by hand count too: the coordinator reports how many workers
      // are still live (this one, finished, is not among them).
      const int live = rendezvous->live_workers();
      if (waiting.empty() && live <= 0) break;
      if (!waiting.empty() && !said) {
        spdlog::info("worker {}: waiting for worker(s) {} to finish before the final evaluation", args.id,
                     fmt::join(waiting, ", "));
        said = true;
      } else if (waiting.empty() && !said_joiners) {
        spdlog::info("worker {}: waiting for {} worker(s) that joined the job to finish before the final evaluation",
                     args.id, live);
        said_joiners = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (metrics != nullptr) (void)metrics->Write("final_wait", {{"seconds", waited}});
    return Status::Ok();
  };
  Trainer trainer(topts, net, eval_net, &layout, &channel, train, test, metrics, progress);
  const Status trained = trainer.Run(out);
  // What this client saw acknowledged is recorded whatever ended the training: a failed or
  // removed worker's acknowledged pushes count in the history check as much as a finished one's.
  LogPsAcks(*client, config.cluster.servers, metrics);
  DP_RETURN_IF_ERROR(trained);
  LogServerStats(client.get(), config.cluster.servers, metrics);
  DP_RETURN_IF_ERROR(channel.Leave());
  // Done with everything (the final evaluation and the model are saved): the coordinator ends
  // a cluster run once every worker has said so or died. The work itself is complete, so a
  // coordinator that does not answer is a warning, not a failed worker.
  const Status done = rendezvous->AnnounceDone(std::chrono::milliseconds(10000));
  if (!done.ok()) spdlog::warn("worker {}: could not tell the coordinator it is done: {}", args.id, done.ToString());
  return Status::Ok();
}

}  // namespace

bool IsIdxImagePath(const std::string& path, std::string* labels_path) {
  if (!EndsWith(path, "idx3-ubyte") && !EndsWith(path, "idx3-ubyte.gz")) return false;
  std::string labels = path;
  const auto pos = labels.rfind("images-idx3");
  if (pos == std::string::npos) {
    labels.clear();
  } else {
    labels.replace(pos, std::string("images-idx3").size(), "labels-idx1");
  }
  if (labels_path != nullptr) *labels_path = labels;
  return !labels.empty();
}

namespace {
Status WriteModelTensorList(const std::string& model_config, const std::string& out_path) {
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(model_config, &spec));
  engine::NetShapes shapes;
  DP_RETURN_IF_ERROR(engine::InferShapes(spec, 1, &shapes));
  std::string text = fmt::format("# tensors of {} ({})\n", spec.name, model_config);
  for (const TensorSpec& t : shapes.params) {
    std::string dims;
    for (size_t i = 0; i < t.shape.size(); ++i) dims += fmt::format("{}{}", i ? "x" : "", t.shape[i]);
    text += fmt::format("{} {} {} {}\n", t.name, dims, t.lr_mult, t.decay_mult);
  }
  // Atomically: the tasks of a cluster job on a shared file system may each write the same list
  // while a server of the job reads it.
  return WriteFileAtomic(out_path, text, Durability::kProcessCrash);
}
}  // namespace

Status WriteTensorList(const std::string& config_path, const std::vector<std::string>& sets,
                       const std::string& out_path) {
  RunConfig config;
  DP_RETURN_IF_ERROR(LoadRunConfig(config_path, sets, &config));
  if (config.models.empty()) return WriteModelTensorList(config.model.config, out_path);
  // Several models: every model's list, tensors-model-<k>.txt beside out_path (common/layout.h).
  const std::string dir = std::filesystem::path(out_path).parent_path().string();
  for (size_t k = 0; k < config.models.size(); ++k) {
    DP_RETURN_IF_ERROR(WriteModelTensorList(config.models[k].config, ModelTensorListPath(dir, static_cast<int>(k))));
  }
  return Status::Ok();
}

Status TestSavedModel(const TestArgs& args, TestResult* result) {
  if (args.weights.empty()) return InvalidArgument("downpour-test: --weights is required (a saved model)");
  if (args.batch < 1) return InvalidArgument("downpour-test: --batch {} must be >= 1", args.batch);
  RunConfig config;
  DP_RETURN_IF_ERROR(LoadRunConfig(args.config_path, args.sets, &config));
  if (!args.data.empty()) config.data.test = args.data;
  if (config.data.test.empty()) {
    return InvalidArgument("{}: data.test is empty; give the test set with --data", args.config_path);
  }
  if (!config.models.empty()) {
    // A run of several models saves each as <run>/models/<name>.dpt: the file's name picks the
    // model (and so its net) to test.
    const std::string stem = std::filesystem::path(args.weights).stem().string();
    const auto it = std::find_if(config.models.begin(), config.models.end(),
                                 [&](const ModelEntry& m) { return m.name == stem; });
    if (it == config.models.end() || !std::filesystem::exists(args.weights)) {
      std::filesystem::path models_dir = std::filesystem::path(args.weights).parent_path();
      if (models_dir.filename() != "models") models_dir /= "models";
      return NotFound("{}: {} trains {} models ([[models]]), each saved as <run dir>/models/<name>.dpt; test one "
                      "with --weights {}/{}.dpt (names: {})",
                      args.weights, args.config_path, config.models.size(), models_dir.string(),
                      config.models.front().name,
                      fmt::join(config.models | std::views::transform(&ModelEntry::name), ", "));
    }
    config = ModelRunConfig(config, static_cast<int>(it - config.models.begin()));
  }
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(config.model.config, &spec));
  std::unique_ptr<engine::Net> net;
  DP_RETURN_IF_ERROR(engine::Net::Create(spec, NetOptionsFor(config, args.batch), &net));
  // Every tensor of the model must come from the file (a test of fillers would be meaningless);
  // tensors the model does not have are ignored, as `caffe test` does.
  caffe_io::WeightsPolicy policy;
  policy.ignore_extra = true;
  DP_RETURN_IF_ERROR(caffe_io::LoadWeightsFile(args.weights, net.get(), policy, nullptr));
  std::unique_ptr<TestSource> test;
  DP_RETURN_IF_ERROR(OpenTestSource(config, args.batch, net->num_classes(), &test));
  *result = TestResult{};
  result->model = fmt::format("{} ({}) with {}", spec.name, config.model.config, args.weights);
  result->data = config.data.test;
  return EvaluateNet(net.get(), test.get(), args.max_batches, &result->eval);
}

Status RunWorker(const WorkerArgs& args, TrainResult* result, bool* started) {
  const std::string config_path =
      args.config_path.empty() ? (std::filesystem::path(args.run_dir) / "config.toml").string() : args.config_path;
  RunConfig config;
  DP_RETURN_IF_ERROR(LoadRunConfig(config_path, args.sets, &config));
  if (args.steps_override > 0) {
    config.worker.steps = args.steps_override;
    config.worker.epochs = 0;
  }
  // Ids from cluster.workers up (to max_workers) are workers that join a running job by hand;
  // -1 lets the coordinator assign one.
  const int max_workers = config.cluster.max_workers > 0 ? config.cluster.max_workers : config.cluster.workers;
  if (args.id >= max_workers) {
    return InvalidArgument("--id {} is out of range: {} has cluster.workers = {} and cluster.max_workers = {}", args.id,
                           config_path, config.cluster.workers, config.cluster.max_workers);
  }
  WorkerArgs a = args;
  if (a.local && a.id < 0) a.id = 0;
  if (!config.models.empty()) {  // [[models]]: multi_model.h
    if (!config.worker.emulate_ms.empty()) {
      return InvalidArgument("{}: worker.emulate_ms is for one model's job ([[models]] is set)", config_path);
    }
    return RunMultiModelWorker(config, a, result, started);
  }
  // Only worker 0, named as such, evaluates: never one that joined; and in a distributed run
  // only when the run has no evaluator process (eval.evaluator = false).
  const bool evaluate = a.id == 0 && !config.data.test.empty() && (a.local || !RunHasEvaluator(config));

  DP_RETURN_IF_ERROR(data::CheckRunDataFitsModel(config));  // records vs the model's input, before the net
  std::unique_ptr<engine::Net> net, eval_net;
  DP_RETURN_IF_ERROR(BuildNets(config, evaluate, &net, &eval_net));
  ParamLayout layout;
  DP_RETURN_IF_ERROR(ParamLayout::Build(net->param_specs(), a.local ? 1 : config.cluster.servers,
                                        config.cluster.chunk_elems, &layout));

  const auto metrics_dir = std::filesystem::path(a.run_dir) / "metrics";
  std::error_code ec;
  for (const auto& dir : {metrics_dir, std::filesystem::path(a.run_dir) / "state"}) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("run dir {}: cannot create {}: {}", a.run_dir, dir.string(), ec.message());
  }
  // Addresses, keys and the run secret: a mistake here is bad input, found before training.
  ProcessNet pnet;
  if (!a.local) DP_RETURN_IF_ERROR(SetUpProcessNet(config, a.net, NetRole::kWorker, a.run_dir, &pnet));
  ClusterLink cluster;
  cluster.joining = !a.local && (a.id < 0 || a.id >= config.cluster.workers);
  if (!a.local && a.id < 0) {
    // Its id (and so its data slice, metrics and state files) comes from the coordinator.
    DP_RETURN_IF_ERROR(JoinCluster(config, -1, pnet, layout, &cluster));
    a.id = cluster.info.id;
    spdlog::info("worker: the coordinator assigned id {}", a.id);
  }

  std::unique_ptr<TrainSource> train;
  std::unique_ptr<TestSource> test;
  if (a.local && config.data.sharding == DataSharding::kSlice && config.cluster.workers > 1) {
    // One process is the whole job: it reads the whole training set, not worker 0's slice of it.
    RunConfig whole = config;
    whole.cluster.workers = 1;
    DP_RETURN_IF_ERROR(OpenTrainSource(whole, 0, a.shuffle, net->num_classes(), &train));
  } else {
    DP_RETURN_IF_ERROR(OpenTrainSource(config, a.local ? 0 : a.id, a.shuffle, net->num_classes(), &train));
  }
  if (!a.local && config.data.sharding == DataSharding::kSlice) {
    // Slices are dealt again at epoch boundaries over the workers the coordinator reports live,
    // so a job that loses or gains workers still covers the whole training set.
    const int id = a.id;
    auto open = [config, id, shuffle = a.shuffle, classes = net->num_classes()](
                    const DataSlice& slice, std::unique_ptr<TrainSource>* out) {
      return OpenSliceSource(config, id, slice, shuffle, classes, out);
    };
    auto deal = [&cluster](DataSlice* slice) {
      return cluster.rendezvous != nullptr && cluster.rendezvous->data_slice(&slice->index, &slice->count);
    };
    auto said = [id](const DataSlice& from, const DataSlice& to, int epoch) {
      spdlog::info("worker {}: epoch {}: the live workers changed; reading data slice {} of {} (was {} of {})", id,
                   epoch, to.index, to.count, from.index, from.count);
    };
    train = std::make_unique<ReslicingSource>(std::move(train),
                                              DataSlice{id % config.cluster.workers, config.cluster.workers},
                                              std::move(open), std::move(deal), std::move(said));
  }
  if (evaluate) DP_RETURN_IF_ERROR(OpenTestSource(config, kEvalBatch, net->num_classes(), &test));

  const std::string state_path = WorkerStatePath(a.run_dir, a.id);
  std::optional<WorkerProgress> resume;
  if (a.resume) {
    WorkerProgress p;
    const Status s = ReadWorkerProgress(state_path, &p);
    if (s.ok()) {
      resume = p;
    } else if (s.code() == StatusCode::kNotFound) {
      resume = WorkerProgress{};  // it had not taken a step yet
    } else {
      return s;
    }
  }
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(
      MetricsWriter::Open((metrics_dir / fmt::format("worker-{}.jsonl", a.id)).string(), "worker", a.id, &metrics));
  // The steps' loss, accuracy, images/s, staleness and bytes, and worker 0's evaluations when it
  // makes them, as TensorBoard curves.
  DP_RETURN_IF_ERROR(MirrorToTensorBoard(a.run_dir, "worker", a.id, {{"step", "step"}, {"eval", "step"}}, metrics.get()));
  ProgressReporter progress(stderr, a.quiet ? ProgressReporter::Mode::kQuiet : ProgressReporter::Mode::kAuto);

  TrainerOptions to;
  to.worker_id = a.id;
  to.step_delay = std::chrono::milliseconds(a.step_delay_ms);
  if (a.step_delay_ms == 0 && config.worker.straggler == a.id) {
    to.step_delay = std::chrono::milliseconds(config.worker.straggler_delay_ms);
    if (to.step_delay.count() > 0)
      spdlog::info("worker {}: the run's straggler: sleeps {} ms after every step (worker.straggler)", a.id,
                   to.step_delay.count());
  }
  to.worker = config.worker;
  to.eval = config.eval;
  to.solver = RunSolver(config, a.local);  // a poly max_iter of 0: the run's planned batches
  // Sync servers hold a pull until the clock is complete, so sync keeps the blocking pull.
  to.overlap_pull = a.overlap && config.consistency.mode != ConsistencyMode::kSync;
  // k steps outstanding at a step's start: the one its forward waits for and k - 1 it may lack.
  // Only async lets a step's weights lack its own pushes; ssp's bound is the servers'.
  to.weights_lag = config.consistency.mode == ConsistencyMode::kAsync ? config.worker.outstanding_steps - 1 : 0;
  to.compression = config.compression;
  to.consistency = config.consistency;
  to.workers = config.cluster.workers;
  to.evaluate = evaluate;
  if (evaluate) to.model_out = (std::filesystem::path(a.run_dir) / "model_final.dpt").string();
  to.resume = resume;
  // Progress after every step, for a later resume; a failed write is logged once and training
  // goes on (only resuming would suffer).
  to.on_progress = [state_path, warned = false](const WorkerProgress& p) mutable {
    const Status s = WriteWorkerProgress(state_path, p);
    if (!s.ok() && !warned) {
      spdlog::warn("cannot save progress for a resume: {}", s.ToString());
      warned = true;
    }
  };

  TrainResult local_result;
  TrainResult* out = result != nullptr ? result : &local_result;
  if (started != nullptr) *started = true;
  if (a.local) {
    if (config.cluster.workers != 1 && a.id != 0)
      return InvalidArgument("--local runs one process: use --id 0 (got {})", a.id);
    Trainer trainer(to, net.get(), eval_net.get(), &layout, nullptr, train.get(), test.get(), metrics.get(), &progress);
    return trainer.Run(out);
  }
  return RunDistributed(config, a, pnet, layout, to, net.get(), eval_net.get(), train.get(), test.get(),
                        metrics.get(), &progress, &cluster, out);
}

}  // namespace downpour::worker
