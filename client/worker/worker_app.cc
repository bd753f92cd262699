// worker_app.cc — see worker_app.h.
#include "client/worker/worker_app.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/worker/progress.h"
#include "client/worker/sources.h"
#include "common/layout.h"
#include "common/metrics.h"

#include "client/ps/ps_client.h"
#include "client/worker/loader_sources.h"
#include "client/worker/ps_channel.h"
#include "common/rendezvous.h"
#include "common/zmq_transport.h"

namespace downpour::worker {
namespace {

constexpr int kEvalBatch = 100;  // test batches (divides the 10k Fashion-MNIST test set)

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status OpenTrainSource(const RunConfig& c, int id, bool shuffle, std::unique_ptr<TrainSource>* out) {
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
    o.shard_index = id;
    o.shard_count = c.cluster.workers;
    o.shuffle = shuffle;
    o.seed = static_cast<uint64_t>(c.run.seed);
    return OpenIdxTrainSource(o, out);
  }
  return OpenLoaderTrainSource(c, id, shuffle, out);
}

Status OpenTestSource(const RunConfig& c, std::unique_ptr<TestSource>* out) {
  std::string labels;
  if (IsIdxImagePath(c.data.test, &labels)) {
    IdxSourceOptions o;
    o.images_path = c.data.test;
    o.labels_path = labels;
    o.batch_size = kEvalBatch;
    o.scale = c.data.scale;
    return OpenIdxTestSource(o, out);
  }
  return OpenLoaderTestSource(c, kEvalBatch, out);
}

Status BuildNets(const RunConfig& c, bool need_eval, std::unique_ptr<engine::Net>* net,
                 std::unique_ptr<engine::Net>* eval_net) {
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(c.model.config, &spec));
  engine::NetOptions o;
  o.device = c.worker.device;
  o.gpu_id = c.worker.gpu_index;
  o.tf32 = c.worker.tf32;
  o.conv_algo = c.worker.conv_algo;
  o.threads = c.worker.threads;
  o.batch = c.worker.batch_size;
  DP_RETURN_IF_ERROR(engine::Net::Create(spec, o, net));
  (*net)->InitParams(static_cast<uint64_t>(c.run.seed));
  if (need_eval) {
    o.batch = kEvalBatch;
    DP_RETURN_IF_ERROR(engine::Net::Create(spec, o, eval_net));
  }
  return Status::Ok();
}

// Server i listens on <bind>:<base_port + i> (the launcher's convention); a wildcard bind is
// reached through loopback on this machine.
std::vector<std::string> ServerAddresses(const ClusterConfig& c) {
  const std::string host = (c.bind == "0.0.0.0" || c.bind == "*") ? "127.0.0.1" : c.bind;
  std::vector<std::string> out;
  for (int i = 0; i < c.servers; ++i) out.push_back(fmt::format("tcp://{}:{}", host, c.base_port + i));
  return out;
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

Status RunDistributed(const RunConfig& config, const WorkerArgs& args, const ParamLayout& layout,
                      const TrainerOptions& to, engine::Net* net, engine::Net* eval_net, TrainSource* train,
                      TestSource* test, MetricsWriter* metrics, ProgressReporter* progress, TrainResult* out) {
  ZmqTransport transport;
  // Rendezvous: the coordinator answers once every server has registered, with their
  // addresses; heartbeats then carry this worker's clock (sync/ssp membership, dead-worker
  // detection).
  RendezvousOptions ro;
  ro.coordinator = config.cluster.coordinator;
  ro.role = Role::kWorker;
  ro.requested_id = args.id;
  ro.layout_hash = layout.hash();
  ro.heartbeat_interval = std::chrono::milliseconds(config.cluster.heartbeat_ms);
  std::unique_ptr<RendezvousClient> link;
  RendezvousInfo info;
  DP_RETURN_IF_ERROR(RendezvousClient::Register(&transport, ro, std::chrono::seconds(120), &link, &info));
  link->StartHeartbeats({});
  PsClientOptions po;
  po.server_addresses = info.server_addresses.empty() ? ServerAddresses(config.cluster) : info.server_addresses;
  po.worker_id = args.id;
  std::unique_ptr<PsClient> client;
  DP_RETURN_IF_ERROR(PsClient::Create(&transport, layout, po, &client));
  DP_RETURN_IF_ERROR(client->Connect(std::chrono::milliseconds(60000)));
  // Every worker offers the same seeded initial weights; servers keep the first and pulls
  // wait until every chunk has weights.
  DP_RETURN_IF_ERROR(client->Wait(client->PushInit(net->params()), std::chrono::milliseconds(60000)));
  // Sync/ssp pulls wait for the slowest live worker; a dead one is dropped after the
  // heartbeat timeout, so wait comfortably longer than that.
  const auto wait = std::chrono::milliseconds(std::max(120000, 4 * config.cluster.heartbeat_timeout_ms));
  RendezvousClient* rendezvous = link.get();
  PsChannel channel(client.get(), wait, [rendezvous](int64_t clock) {
    rendezvous->set_clock(clock);
    return Status::Ok();
  });
  TrainerOptions topts = to;
  const bool final_eval = to.evaluate && test != nullptr;
  topts.on_training_done = [&, final_eval]() -> Status {
    DP_RETURN_IF_ERROR(rendezvous->AnnounceFinished(std::chrono::milliseconds(10000)));
    if (!final_eval) return Status::Ok();
    // The final evaluation and the saved model are of the finished run: wait until every other
    // worker has finished (or died), however far behind it is.
    const auto t0 = std::chrono::steady_clock::now();
    bool said = false;
    while (!rendezvous->shutdown_requested()) {
      std::vector<int32_t> gone = rendezvous->gone_workers();
      std::vector<int32_t> waiting;
      for (int32_t w = 0; w < config.cluster.workers; ++w) {
        if (w != args.id && std::find(gone.begin(), gone.end(), w) == gone.end()) waiting.push_back(w);
      }
      if (waiting.empty()) break;
      if (!said) {
        spdlog::info("worker {}: waiting for worker(s) {} to finish before the final evaluation", args.id,
                     fmt::join(waiting, ", "));
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (metrics != nullptr) (void)metrics->Write("final_wait", {{"seconds", waited}});
    return Status::Ok();
  };
  Trainer trainer(topts, net, eval_net, &layout, &channel, train, test, metrics, progress);
  DP_RETURN_IF_ERROR(trainer.Run(out));
  LogServerStats(client.get(), config.cluster.servers, metrics);
  return channel.Leave();
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

Status WriteTensorList(const std::string& config_path, const std::vector<std::string>& sets,
                       const std::string& out_path) {
  RunConfig config;
  DP_RETURN_IF_ERROR(LoadRunConfig(config_path, sets, &config));
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(config.model.config, &spec));
  engine::NetShapes shapes;
  DP_RETURN_IF_ERROR(engine::InferShapes(spec, 1, &shapes));
  std::string text = fmt::format("# tensors of {} ({})\n", spec.name, config.model.config);
  for (const TensorSpec& t : shapes.params) {
    std::string dims;
    for (size_t i = 0; i < t.shape.size(); ++i) dims += fmt::format("{}{}", i ? "x" : "", t.shape[i]);
    text += fmt::format("{} {} {} {}\n", t.name, dims, t.lr_mult, t.decay_mult);
  }
  std::FILE* f = std::fopen(out_path.c_str(), "w");
  if (f == nullptr) return IoError("tensor list {}: cannot open for writing", out_path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return IoError("tensor list {}: write failed", out_path);
  return Status::Ok();
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
  if (args.id >= config.cluster.workers)
    return InvalidArgument("--id {} is out of range: {} has cluster.workers = {}", args.id, config_path,
                           config.cluster.workers);
  const bool evaluate = args.id == 0 && !config.data.test.empty();

  std::unique_ptr<engine::Net> net, eval_net;
  DP_RETURN_IF_ERROR(BuildNets(config, evaluate, &net, &eval_net));
  ParamLayout layout;
  DP_RETURN_IF_ERROR(ParamLayout::Build(net->param_specs(), args.local ? 1 : config.cluster.servers,
                                        config.cluster.chunk_elems, &layout));

  std::unique_ptr<TrainSource> train;
  std::unique_ptr<TestSource> test;
  DP_RETURN_IF_ERROR(OpenTrainSource(config, args.local ? 0 : args.id, args.shuffle, &train));
  if (evaluate) DP_RETURN_IF_ERROR(OpenTestSource(config, &test));

  const auto metrics_dir = std::filesystem::path(args.run_dir) / "metrics";
  std::error_code ec;
  std::filesystem::create_directories(metrics_dir, ec);
  if (ec) return IoError("run dir {}: cannot create {}: {}", args.run_dir, metrics_dir.string(), ec.message());
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(
      MetricsWriter::Open((metrics_dir / fmt::format("worker-{}.jsonl", args.id)).string(), "worker", args.id, &metrics));
  ProgressReporter progress(stderr, args.quiet ? ProgressReporter::Mode::kQuiet : ProgressReporter::Mode::kAuto);

  TrainerOptions to;
  to.worker_id = args.id;
  to.step_delay = std::chrono::milliseconds(args.step_delay_ms);
  to.worker = config.worker;
  to.eval = config.eval;
  to.solver = config.solver;
  to.evaluate = evaluate;
  if (evaluate) to.model_out = (std::filesystem::path(args.run_dir) / "model_final.dpt").string();

  TrainResult local_result;
  TrainResult* out = result != nullptr ? result : &local_result;
  if (started != nullptr) *started = true;
  if (args.local) {
    if (config.cluster.workers != 1 && args.id != 0)
      return InvalidArgument("--local runs one process: use --id 0 (got {})", args.id);
    Trainer trainer(to, net.get(), eval_net.get(), &layout, nullptr, train.get(), test.get(), metrics.get(), &progress);
    return trainer.Run(out);
  }
  return RunDistributed(config, args, layout, to, net.get(), eval_net.get(), train.get(), test.get(), metrics.get(),
                        &progress, out);
}

}  // namespace downpour::worker
