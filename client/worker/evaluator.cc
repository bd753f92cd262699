// evaluator.cc — see evaluator.h.
#include "client/worker/evaluator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>

#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "client/ps/ps_client.h"
#include "client/worker/run_setup.h"
#include "client/worker/worker_app.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/rendezvous.h"
#include "common/tensorboard.h"
#include "common/zmq_transport.h"
#include "data/idx.h"
#include "data/input_check.h"
#include "data/lmdb_io.h"

namespace downpour::worker {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Records in the training set (all workers' data together), for the epoch axis; 0 = unknown
// (logged once: the records then carry epoch null).
int64_t TrainSetSize(const RunConfig& c) {
  std::string labels;
  if (IsIdxImagePath(c.data.train, &labels)) {
    std::vector<uint8_t> l;
    return data::ReadIdxLabels(labels, &l).ok() ? static_cast<int64_t>(l.size()) : 0;
  }
  std::vector<std::string> paths;
  if (c.data.sharding == DataSharding::kOwn) {
    for (int w = 0; w < c.cluster.workers; ++w) paths.push_back(OwnShardPath(c.data, w, c.cluster.workers));
  } else {
    paths.push_back(c.data.train);
  }
  int64_t n = 0;
  for (const std::string& p : paths) {
    std::unique_ptr<data::LmdbEnv> env;
    if (!data::LmdbEnv::OpenReadOnly(p, &env).ok()) return 0;
    n += env->entries();
  }
  return n;
}

// The chunk with the fewest elements: the cheapest progress probe.
int32_t SmallestChunk(const ParamLayout& layout) {
  int32_t best = 0;
  for (int32_t c = 1; c < layout.num_chunks(); ++c) {
    if (layout.chunk(c).count < layout.chunk(best).count) best = c;
  }
  return best;
}

// Every worker of 0..W-1 gone (finished or dead) and none live (joiners included), as of the
// coordinator's latest reply. Says once when only workers that joined the job are left.
bool WorkersEnded(const RendezvousClient& link, int workers, bool* said_joiners) {
  const std::vector<int32_t> gone = link.gone_workers();
  for (int32_t w = 0; w < workers; ++w) {
    if (!std::binary_search(gone.begin(), gone.end(), w)) return false;
  }
  const int live = link.live_workers();  // -1 before the first reply
  if (live > 0 && !*said_joiners) {
    spdlog::info("evaluator: waiting for {} worker(s) that joined the job to finish before the final evaluation",
                 live);
    *said_joiners = true;
  }
  return live == 0;
}

// What triggered an evaluation, and where it was due.
struct Due {
  const char* kind = "";
  int64_t iter = -1;      // updates: the due point (worker batches applied)
  double seconds = -1.0;  // seconds: the due time (since the evaluator started)
  int skipped = 0;        // due points passed over while the previous evaluation ran
};

class Evaluator {
 public:
  Evaluator(const RunConfig& c, const EvaluatorArgs& a, engine::Net* net, TestSource* test, PsClient* client,
            MetricsWriter* metrics, int64_t train_size, std::chrono::milliseconds wait)
      : c_(c), a_(a), net_(net), test_(test), client_(client), metrics_(metrics), train_size_(train_size),
        wait_(wait), probe_chunk_(SmallestChunk(client->layout())),
        probe_buf_(static_cast<size_t>(client->layout().total_elems()), 0.0f) {}

  // Worker batches the servers have applied, as of a pull of the probe chunk.
  Status Probe(int64_t* iter) {
    const int32_t ids[1] = {probe_chunk_};
    DP_RETURN_IF_ERROR(client_->Wait(client_->PullChunks(probe_buf_, ids), wait_));
    *iter = std::max<int64_t>(0, client_->last_iters()[static_cast<size_t>(probe_chunk_)]);
    return Status::Ok();
  }

  // Pulls every chunk into the net and evaluates it; writes the record.
  Status Evaluate(const Due& due, double since_start, EvaluatorResult* result) {
    const auto t0 = SteadyClock::now();
    DP_RETURN_IF_ERROR(client_->Wait(client_->Pull(net_->params()), wait_));
    // The snapshot's place in training: the newest chunk's iteration (every chunk is at least at
    // what the probe saw, so the lag below is >= 0); iter_min says how far apart its chunks are
    // (pushes the servers were applying while it was read).
    int64_t iter_min = INT64_MAX, iter = 0, versions = 0;
    for (int64_t i : client_->last_iters()) {
      iter_min = std::min(iter_min, i);
      iter = std::max(iter, i);
    }
    for (int64_t v : client_->last_versions()) versions += v;
    iter_min = std::max<int64_t>(0, iter_min);
    EvalRecord r;
    DP_RETURN_IF_ERROR(EvaluateNet(net_, test_, c_.eval.test_batches, &r));
    const double eval_s = SecondsSince(t0);
    const int64_t images = iter * c_.worker.batch_size;
    const bool final_eval = std::string_view(due.kind) == "final";
    MetricValue epoch = train_size_ > 0 ? MetricValue(static_cast<double>(images) / static_cast<double>(train_size_))
                                        : MetricValue();
    (void)metrics_->Write("eval", {{"final", final_eval},
                                   {"due", due.kind},
                                   {"iter", iter},
                                   {"iter_min", iter_min},
                                   {"train_images", images},
                                   {"epoch", epoch},
                                   {"due_iter", due.iter >= 0 ? MetricValue(due.iter) : MetricValue()},
                                   {"lag_updates", due.iter >= 0 ? MetricValue(iter - due.iter) : MetricValue()},
                                   {"due_s", due.seconds >= 0 ? MetricValue(due.seconds) : MetricValue()},
                                   {"lag_s", due.seconds >= 0 ? MetricValue(since_start - due.seconds) : MetricValue()},
                                   {"skipped", due.skipped},
                                   {"eval_s", eval_s},
                                   {"test_loss", r.loss},
                                   {"top1", r.top1},
                                   {"top5", r.top5},
                                   {"test_images", r.images},
                                   {"byte_input", r.byte_input},
                                   {"server_versions", versions}});
    if (!a_.quiet) {
      spdlog::info("evaluator: {}eval at {} worker batches ({} images{}): test loss {:.4f} top-1 {:.2f}% top-5 {:.2f}% "
                   "({:.1f} s)",
                   final_eval ? "final " : "", iter, images,
                   train_size_ > 0 ? fmt::format(", epoch {:.2f}", static_cast<double>(images) / train_size_) : "",
                   r.loss, 100 * r.top1, 100 * r.top5, eval_s);
    }
    ++result->evaluations;
    result->skipped += due.skipped;
    if (final_eval) {
      result->has_final = true;
      result->final_eval = r;
    }
    return Status::Ok();
  }

 private:
  const RunConfig& c_;
  const EvaluatorArgs& a_;
  engine::Net* net_;
  TestSource* test_;
  PsClient* client_;
  MetricsWriter* metrics_;
  const int64_t train_size_;
  const std::chrono::milliseconds wait_;
  const int32_t probe_chunk_;
  std::vector<float> probe_buf_;
};

}  // namespace

Status RunEvaluator(const EvaluatorArgs& args, EvaluatorResult* result, bool* started) {
  if (args.probe_ms < 1) return InvalidArgument("evaluator: probe interval {} ms must be >= 1", args.probe_ms);
  const std::string config_path =
      args.config_path.empty() ? (std::filesystem::path(args.run_dir) / "config.toml").string() : args.config_path;
  RunConfig config;
  DP_RETURN_IF_ERROR(LoadRunConfig(config_path, args.sets, &config));
  if (!RunHasEvaluator(config)) {
    return InvalidArgument("{}: this run has no evaluator process ({})", config_path,
                           config.data.test.empty() ? "data.test is empty" : "eval.evaluator = false");
  }
  DP_RETURN_IF_ERROR(data::CheckRunDataFitsModel(config));
  engine::NetSpec spec;
  DP_RETURN_IF_ERROR(engine::ParseNetSpecFile(config.model.config, &spec));
  std::unique_ptr<engine::Net> net;
  DP_RETURN_IF_ERROR(engine::Net::Create(spec, NetOptionsFor(config, kEvalBatch), &net));
  ParamLayout layout;
  DP_RETURN_IF_ERROR(
      ParamLayout::Build(net->param_specs(), config.cluster.servers, config.cluster.chunk_elems, &layout));
  std::unique_ptr<TestSource> test;
  DP_RETURN_IF_ERROR(OpenTestSource(config, kEvalBatch, net->num_classes(), &test));
  const int64_t train_size = TrainSetSize(config);
  if (train_size == 0) spdlog::warn("evaluator: cannot count the training set {}: no epoch axis", config.data.train);

  const auto metrics_dir = std::filesystem::path(args.run_dir) / "metrics";
  std::error_code ec;
  std::filesystem::create_directories(metrics_dir, ec);
  if (ec) return IoError("run dir {}: cannot create {}: {}", args.run_dir, metrics_dir.string(), ec.message());
  // A file with records already: this evaluator was restarted (a death, or a resumed run), and
  // the weights it would evaluate "at start" are not the run's starting weights.
  const auto metrics_path = metrics_dir / "evaluator.jsonl";
  const bool restarted = std::filesystem::file_size(metrics_path, ec) > 0 && !ec;
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(MetricsWriter::Open(metrics_path.string(), "evaluator", 0, &metrics));
  // Test loss, top-1 and top-5 against the workers' batches the servers had applied.
  DP_RETURN_IF_ERROR(MirrorToTensorBoard(args.run_dir, "evaluator", 0, {{"eval", "iter"}}, metrics.get()));

  // The evaluator connects as a worker does (the worker key, or the run's secret).
  ProcessNet pnet;
  DP_RETURN_IF_ERROR(SetUpProcessNet(config, args.net, NetRole::kWorker, args.run_dir, &pnet));
  spdlog::info("evaluator: {}", pnet.Describe(""));
  if (started != nullptr) *started = true;
  auto transport = std::make_unique<ProcessTransport>(pnet);
  RendezvousOptions ro;
  ro.coordinator = pnet.coordinator;
  ro.token = pnet.token;
  ro.role = Role::kEvaluator;
  ro.requested_id = 0;
  ro.layout_hash = layout.hash();
  ro.heartbeat_interval = std::chrono::milliseconds(config.cluster.heartbeat_ms);
  std::unique_ptr<RendezvousClient> link;
  RendezvousInfo info;
  DP_RETURN_IF_ERROR(RendezvousClient::Register(transport.get(), ro, std::chrono::seconds(120), &link, &info));

  PsClientOptions po;
  po.server_addresses = info.server_addresses.empty() ? ServerAddresses(config.cluster, args.run_dir)
                                                      : info.server_addresses;
  po.worker_id = 0;
  po.role = Role::kEvaluator;
  po.token = pnet.token;
  po.reply_timeout = PullWait(config.cluster);
  po.server_wait = std::chrono::milliseconds(config.cluster.server_wait_ms);
  const auto wait = RequestWait(config.cluster);
  std::unique_ptr<PsClient> client;
  DP_RETURN_IF_ERROR(PsClient::Create(transport.get(), layout, po, &client));
  // A restarted server at another address is followed there, as a worker does.
  const ServerMoveFollower follow(link.get(), client.get(), "evaluator");
  link->StartHeartbeats({});
  DP_RETURN_IF_ERROR(client->Connect(wait));

  const int64_t every_updates = EvaluatorEveryUpdates(config);
  const double every_seconds = config.eval.every_seconds;
  (void)metrics->Write("start", {{"servers", config.cluster.servers},
                                 {"workers", config.cluster.workers},
                                 {"every_updates", every_updates},
                                 {"every_seconds", every_seconds},
                                 {"batch_size", config.worker.batch_size},
                                 {"train_images_total", train_size},
                                 {"test_batches", config.eval.test_batches},
                                 {"restarted", restarted}});
  spdlog::info("evaluator: evaluating {}{}{}{}the final weights once every worker has finished",
               every_updates > 0 ? fmt::format("every {} worker batches", every_updates) : "",
               every_updates > 0 && every_seconds > 0 ? " and " : "",
               every_seconds > 0 ? fmt::format("every {:g} s", every_seconds) : "",
               every_updates > 0 || every_seconds > 0 ? " and " : "");

  EvaluatorResult local;
  EvaluatorResult* out = result != nullptr ? result : &local;
  *out = EvaluatorResult{};
  Evaluator ev(config, args, net.get(), test.get(), client.get(), metrics.get(), train_size, wait);
  const auto start = SteadyClock::now();
  // The first pull waits until every chunk has weights (the workers' init pushes).
  if (config.eval.at_start && !restarted) DP_RETURN_IF_ERROR(ev.Evaluate(Due{"start"}, 0.0, out));
  int64_t next_iter = every_updates;  // the next update point not yet evaluated
  double next_s = every_seconds;      // the next time point (s since start) not yet evaluated
  // The run's planned worker batches (all workers): update points from there on are the final
  // evaluation's (0 = unknown: none skipped).
  const int64_t planned = config.worker.epochs > 0
                              ? (train_size > 0 ? config.worker.epochs * train_size / config.worker.batch_size : 0)
                              : config.worker.steps * config.cluster.workers;
  bool ended = false, said_joiners = false;
  while (!link->shutdown_requested()) {
    if (WorkersEnded(*link, config.cluster.workers, &said_joiners)) {
      ended = true;
      break;
    }
    // The due point is the newest one passed (of the update grid, by the probe; of the time
    // grid, by the clock); the ones between it and the last evaluated are skipped and counted.
    Due due;
    if (every_updates > 0) {
      int64_t iter = 0;
      DP_RETURN_IF_ERROR(ev.Probe(&iter));
      const int64_t point = iter / every_updates * every_updates;
      if (iter >= next_iter && (planned == 0 || point < planned)) {
        due.kind = "updates";
        due.iter = point;
        due.skipped = static_cast<int>((point - next_iter) / every_updates);
        next_iter = point + every_updates;
      }
    }
    const double now_s = SecondsSince(start);
    if (due.iter < 0 && every_seconds > 0 && now_s >= next_s) {
      const double point = std::floor(now_s / every_seconds) * every_seconds;
      due.kind = "seconds";
      due.seconds = point;
      due.skipped = static_cast<int>(std::lround((point - next_s) / every_seconds));
      next_s = point + every_seconds;
    }
    if (due.iter < 0 && due.seconds < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args.probe_ms));
      continue;
    }
    DP_RETURN_IF_ERROR(ev.Evaluate(due, now_s, out));
  }
  if (!ended) {
    spdlog::warn("evaluator: the run is shutting down before every worker finished: no final evaluation");
    (void)metrics->Write("done", {{"final", false}, {"evaluations", out->evaluations}, {"skipped", out->skipped}});
    return Status::Ok();
  }
  // Every worker has finished (or died): the final weights, evaluated and saved.
  DP_RETURN_IF_ERROR(ev.Evaluate(Due{"final"}, SecondsSince(start), out));
  const std::string model = (std::filesystem::path(args.run_dir) / "model_final.dpt").string();
  DP_RETURN_IF_ERROR(SaveModel(*net, model));
  (void)metrics->Write("done", {{"final", true},
                                {"evaluations", out->evaluations},
                                {"skipped", out->skipped},
                                {"final_top1", out->final_eval.top1},
                                {"final_top5", out->final_eval.top5},
                                {"final_test_loss", out->final_eval.loss},
                                {"model", model}});
  spdlog::info("evaluator: final top-1 {:.2f}%; model saved to {}", 100 * out->final_eval.top1, model);
  const Status done = link->AnnounceDone(std::chrono::milliseconds(10000));
  if (!done.ok()) spdlog::warn("evaluator: could not tell the coordinator it is done: {}", done.ToString());
  return Status::Ok();
}

}  // namespace downpour::worker
