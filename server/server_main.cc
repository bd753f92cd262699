// server_main.cc — downpour-server: one parameter shard as a process (thin main over
// ShardServer, ZmqTransport and RendezvousClient).
//
//   downpour-server --config run.toml --id i --run-dir D [--restore ckpt | --recover]
//                   (--tensors list.txt | --model alexnet-shapes) [--port P] [--standalone]
//                   [--bind ADDR] [--advertise HOST] [--coordinator HOST:PORT]
//
// Binds tcp://<--bind or cluster.bind>:<cluster.base_port + i> (or --port; 0 = the OS picks),
// or with cluster.transport = "ipc" the Unix socket ipc://<cluster.ipc_dir, default D>/server-<i>.sock
// (common/run_config.h ServerIpcPath; --port is then refused), and
// registers the advertised address (--advertise, cluster.advertise, or derived from the bind:
// common/process_net.h) with the coordinator, which hands it to the workers, and writes it to
// D/server-<i>.addr. With security.keys the endpoint is a CurveZMQ server that accepts only the
// cluster's client keys; without, it binds loopback only (unless security.insecure) and admin
// and register messages must carry the run's secret (D/secret). Who may send what:
// server/access.h. Checkpoints go to D/<checkpoint.dir>/server-<i>.dpt every
// checkpoint.every_updates applied updates and once more when the server stops (when
// checkpointing is on). With checkpoint.wal (the default) every push, clock and membership
// change is first staged in D/<checkpoint.dir>/server-<i>.wal (server/wal.h; acknowledged once
// written, fsynced at least every checkpoint.wal_fsync_ms), and the log restarts after each
// checkpoint, one of which it forces at checkpoint.wal_max_mb.
//
// --recover: restore D/<checkpoint.dir>/server-<i>.dpt if it exists, then replay server-<i>.wal
// if it exists (either may be missing), checkpoint what was replayed and start the log in a new
// file, then serve: the shard is what it was when its previous process died, every acknowledged
// push included. This is how the launcher restarts a dead
// server and how `downpour-launch --resume` restarts a stopped run. --restore FILE loads that
// checkpoint only and starts the log afresh. Without checkpoint.wal, --recover restores the
// checkpoint alone (the updates since it are lost). Registers with cluster.coordinator (unless
// --standalone), heartbeats, drops workers the coordinator declares dead, and exits 0 on a
// shutdown message, the coordinator's shutdown, or SIGINT/SIGTERM; and exits 0 at once, writing
// nothing more, when the coordinator says another process has taken its id (fencing: this one was
// stopped or cut off, and a replacement serves from its checkpoint and log).
//
// Several models ([[models]] in the run config; server/model_host.h): the process serves its
// shard of every model on the one endpoint, routing by the header's model id. Model k's tensor
// list is D/tensors-model-<k>.txt (written by downpour-launch; --tensors and --model are then
// refused), its solver models[k].solver, its checkpoint and log server-<i>.model-<k>.dpt / .wal
// (model 0 keeps server-<i>.dpt / .wal), and it takes move pushes (common/rotation.h). --restore
// is refused (--recover restores every model). Pull lines then carry "model"; server_end sums
// the models' counters and one "model_end" line per model gives each model's own.
//
// Metrics: D/metrics/server-<i>.jsonl — "server_start" (mode, bound, workers, chunks), one
// "pull" line per served pull (worker, clock, min_clock = slowest live worker's clock as this
// shard knows it, ahead = clock - min_clock, wait_ms held back by the consistency policy,
// version_sum), and "server_end" with the shard's counters (duplicates, wal_records, replayed,
// pushes_by_worker as "[n0, n1, ...]": gradient pushes taken per worker id, across restarts)
// and refused_connections (CurveZMQ
// handshakes the transport refused: a client without the cluster's key), tx_bytes / rx_bytes
// (what this process sent and received on the wire, every frame; common/transport.h). The pull lines are the log the
// ssp bound is checked against (ahead <= s always).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <limits>

#include "common/cli.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "common/log_limit.h"
#include "common/metrics.h"
#include "common/process_net.h"
#include "common/rendezvous.h"
#include "common/rotation.h"
#include "common/run_config.h"
#include "common/trace.h"
#include "common/zmq_transport.h"
#include "server/process_util.h"
#include "server/run_dir.h"
#include "server/model_host.h"
#include "server/shard.h"

namespace downpour {
namespace {

struct Flags {
  std::string config, run_dir, restore, tensors, model;
  NetFlags net;  // --bind, --advertise, --coordinator
  int id = 0;
  int port = -1;
  bool standalone = false;
  bool recover = false;
};

// "[a, b, c]" — a per-worker list as one metrics value.
std::string ListString(const std::vector<uint64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(v[i]);
  }
  return out + "]";
}

// "not_registered:4 version:1" — the reasons refused messages were refused for, nonzero ones
// only ("" when none was).
std::string RejectedString(const ShardStatsWire& st) {
  std::string out;
  for (size_t i = 0; i < st.rejected_by_reason.size(); ++i) {
    if (st.rejected_by_reason[i] == 0) continue;
    if (!out.empty()) out += ' ';
    out += fmt::format("{}:{}", RejectReasonName(static_cast<RejectReason>(i)), st.rejected_by_reason[i]);
  }
  return out;
}

std::string ResolveInRunDir(const std::string& run_dir, const std::string& p) {
  return std::filesystem::path(p).is_absolute() ? p : (std::filesystem::path(run_dir) / p).string();
}

// How many messages the shard refused for `reason` (0 when the stats predate the reason).
int64_t RejectedFor(const ShardStatsWire& st, RejectReason reason) {
  const auto i = static_cast<size_t>(reason);
  return i < st.rejected_by_reason.size() ? static_cast<int64_t>(st.rejected_by_reason[i]) : 0;
}

// The run directory as an absolute path: an ipc address is handed to workers that may run
// elsewhere in the file tree.
std::string AbsoluteRunDir(const Flags& f) { return std::filesystem::absolute(f.run_dir).lexically_normal().string(); }

// tcp://<bind>:<port> or, with cluster.transport = "ipc", ipc://<ipc_dir>/server-<id>.sock.
std::string BindAddress(const Flags& f, const RunConfig& cfg, const ProcessNet& net) {
  if (cfg.cluster.transport == ClusterTransport::kIpc) return ServerAddress(cfg.cluster, AbsoluteRunDir(f), f.id);
  return net.BindUrl(f.port >= 0 ? f.port : cfg.cluster.base_port + f.id);
}

// `*serving` turns true once setup (config, tensor list, layout, restore, bind, rendezvous) is
// done: an error before that exits 2 for bad input, after it 1 (cli.h).
// Counters of several shards added up (one process's share of every model).
ShardStatsWire SumStats(const ModelHost& host) {
  ShardStatsWire sum = host.shard(0)->Stats();
  for (int k = 1; k < host.models(); ++k) {
    const ShardStatsWire st = host.shard(k)->Stats();
    sum.pushes_received += st.pushes_received;
    sum.pushes_applied += st.pushes_applied;
    sum.pushes_rejected += st.pushes_rejected;
    sum.pulls_served += st.pulls_served;
    sum.chunk_updates += st.chunk_updates;
    sum.staleness_sum += st.staleness_sum;
    sum.staleness_max = std::max(sum.staleness_max, st.staleness_max);
    sum.duplicates += st.duplicates;
    sum.dropped_late += st.dropped_late;
    sum.dc_compensated += st.dc_compensated;
    sum.dc_uncompensated += st.dc_uncompensated;
    sum.evaluator_pulls += st.evaluator_pulls;
    sum.wal_records += st.wal_records;
    sum.wal_bytes += st.wal_bytes;
    sum.wal_coded_records += st.wal_coded_records;
    sum.wal_ns += st.wal_ns;
    sum.replayed += st.replayed;
    sum.sgd_ns += st.sgd_ns;
    sum.busy_ns += st.busy_ns;
    sum.factor_ns += st.factor_ns;
    for (size_t i = 0; i < sum.rejected_by_reason.size() && i < st.rejected_by_reason.size(); ++i) {
      sum.rejected_by_reason[i] += st.rejected_by_reason[i];
    }
    for (size_t i = 0; i < sum.pushes_by_worker.size() && i < st.pushes_by_worker.size(); ++i) {
      sum.pushes_by_worker[i] += st.pushes_by_worker[i];
    }
  }
  return sum;
}

Status Run(const Flags& f, bool* serving) {
  RunConfig cfg;
  DP_RETURN_IF_ERROR(LoadRunConfig(f.config, &cfg));
  const bool multi = !cfg.models.empty();
  if (multi && !f.restore.empty()) {
    return InvalidArgument("--restore {}: a multi-model server restores every model with --recover", f.restore);
  }
  std::vector<ParamLayout> layouts;
  DP_RETURN_IF_ERROR(LoadRunLayouts(cfg, f.config, f.tensors, f.model, f.run_dir, &layouts));
  const int models = static_cast<int>(layouts.size());

  // Addresses, keys and the run secret, checked before anything binds.
  ProcessNet net;
  DP_RETURN_IF_ERROR(SetUpProcessNet(cfg, f.net, NetRole::kServer, f.standalone ? "" : f.run_dir, &net));
  if (cfg.cluster.transport == ClusterTransport::kIpc) {
    if (f.port >= 0) {
      return InvalidArgument("--port {}: cluster.transport = \"ipc\" binds a Unix socket ({}), not a port", f.port,
                             ServerAddress(cfg.cluster, AbsoluteRunDir(f), f.id));
    }
    DP_RETURN_IF_ERROR(CheckIpcPathLengths(cfg.cluster, AbsoluteRunDir(f)));
  }

  ShardOptions o;  // every model's access and networking; the run's options per model below
  o.access.keyed = net.keyed;
  o.access.run_secret = net.token;
  o.access.run_dir = f.run_dir;
  o.shared_memory = SharedMemoryOn(cfg);  // off on an emulated link (cluster.link_gbps)
  if (const std::string link = EmulatedLinkNote(cfg); !link.empty()) spdlog::info("server {}: {}", f.id, link);
  std::filesystem::create_directories(
      std::filesystem::path(ServerCheckpointPath(f.run_dir, cfg.checkpoint, f.id)).parent_path());
  const std::filesystem::path metrics_dir = std::filesystem::path(f.run_dir) / "metrics";
  std::filesystem::create_directories(metrics_dir);
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(MetricsWriter::Open((metrics_dir / fmt::format("server-{}.jsonl", f.id)).string(), "server", f.id,
                                         &metrics));
  const auto pull_line = [m = metrics.get(), multi](int model, const PullServedEvent& e) {
    const bool none_live = e.min_live_clock == std::numeric_limits<int64_t>::max();
    (void)m->Write("pull", {{"model", multi ? MetricValue(model) : MetricValue()},
                            {"worker", e.worker},
                            {"clock", e.clock},
                            {"min_clock", none_live ? MetricValue() : MetricValue(e.min_live_clock)},
                            {"ahead", none_live ? MetricValue() : MetricValue(e.clock - e.min_live_clock)},
                            {"wait_ms", 1e3 * e.waited_s},
                            {"chunks", e.chunks},
                            {"version_sum", e.version_sum}});
  };
  (void)metrics->Write("server_start", {{"mode", ConsistencyModeString(cfg.consistency)},
                                        {"staleness_bound", cfg.consistency.staleness_bound},
                                        {"workers", cfg.cluster.workers},
                                        {"servers", cfg.cluster.servers},
                                        {"models", models},
                                        {"chunks", static_cast<int64_t>(layouts[0].ServerChunks(f.id).size())},
                                        {"floats", layouts[0].ServerElems(f.id)}});
  // Declared before the shard: the shard owns the endpoint, which must close before the
  // transport's ZeroMQ context terminates.
  // A stranger can provoke these at will: logged at a bounded rate, all counted.
  auto refusals = std::make_shared<RateLimitedLog>(fmt::format("server {}", f.id), "refused connections");
  net.zmq.on_refused = [refusals, id = f.id](const std::string& what) {
    refusals->Log(fmt::format("server {}: refused connection: {}", id, what));
  };
  // The timeline (cluster.trace_events; off by default), before the transport that records into it.
  TraceLog trace(fmt::format("server {}", f.id), static_cast<size_t>(cfg.cluster.trace_events));
  net.zmq.trace = &trace;
  o.trace = &trace;
  o.trace_track = trace.Thread("loop");
  ProcessTransport transport(net);  // ZeroMQ, behind the emulated link when cluster.link_gbps is set
  std::vector<std::unique_ptr<ShardServer>> shards;
  for (int k = 0; k < models; ++k) {
    ShardOptions ok = RunShardOptions(cfg, f.id, k);  // a poly max_iter of 0: the planned batches
    ok.access = o.access;
    ok.shared_memory = o.shared_memory;
    ok.trace = o.trace;
    ok.trace_track = o.trace_track;
    ok.checkpoint_path = ServerCheckpointPath(f.run_dir, cfg.checkpoint, f.id, k);
    if (cfg.checkpoint.wal) ok.wal_path = ServerWalPath(f.run_dir, cfg.checkpoint, f.id, k);
    ok.on_pull_served = [pull_line, k](const PullServedEvent& e) { pull_line(k, e); };
    // A sync pipeline with K < W: a round of model k waits for the holders of the stage it is in.
    const RotationConfig& ro = cfg.rotation;
    if (multi && cfg.consistency.mode == ConsistencyMode::kSync && ro.scheme == RotationScheme::kPipeline &&
        models < cfg.cluster.workers && ro.groups == RotationGroups::kDataParallel) {
      ok.round_members = [k, steps = ro.stage_steps, models, workers = cfg.cluster.workers,
                          passes = ro.passes](int32_t worker, int64_t version) {
        return HoldsModel(worker, k, version, steps, models, workers, passes);
      };
    }
    std::unique_ptr<ShardServer> shard;
    DP_RETURN_IF_ERROR(ShardServer::Create(layouts[static_cast<size_t>(k)], ok, &shard));
    const std::string what = multi ? fmt::format("server {} model {} ({})", f.id, k, cfg.models[static_cast<size_t>(k)].name)
                                   : fmt::format("server {}", f.id);
    if (f.recover) {
      RecoverReport rep;
      DP_RETURN_IF_ERROR(shard->Recover(&rep));
      spdlog::info("{}: recovered: checkpoint {} ({} updates, log seq {}) + {} pushes replayed from the log "
                   "({} records{}){}",
                   what, rep.checkpoint_loaded ? ok.checkpoint_path : std::string("(none)"), rep.checkpoint_updates,
                   rep.checkpoint_seq, rep.replayed_pushes, rep.replayed,
                   rep.torn_tail ? ", a torn last record dropped" : "",
                   cfg.checkpoint.wal ? "" : " (checkpoint.wal = false: no log)");
    } else if (!f.restore.empty()) {
      DP_RETURN_IF_ERROR(shard->LoadCheckpoint(f.restore));
    }
    DP_RETURN_IF_ERROR(shard->OpenLog());
    shards.push_back(std::move(shard));
  }
  std::unique_ptr<ModelHost> host;
  DP_RETURN_IF_ERROR(ModelHost::Create(std::move(shards), &host));

  std::unique_ptr<ServerEndpoint> endpoint;
  DP_RETURN_IF_ERROR(transport.Bind(BindAddress(f, cfg, net), &endpoint));
  const std::string address = net.AdvertisedUrl(endpoint->address());
  DP_RETURN_IF_ERROR(WriteFileAtomic(ResolveInRunDir(f.run_dir, fmt::format("server-{}.addr", f.id)), address + "\n"));
  for (int k = 0; k < models; ++k) {
    const ParamLayout& layout = layouts[static_cast<size_t>(k)];
    spdlog::info("server {}/{}{}: {} chunks, {} floats, layout hash {:#018x}", f.id, layout.servers(),
                 multi ? fmt::format(" model {} ({})", k, cfg.models[static_cast<size_t>(k)].name) : std::string(),
                 layout.ServerChunks(f.id).size(), layout.ServerElems(f.id), layout.hash());
  }
  spdlog::info("server {}: {}", f.id, net.Describe(endpoint->address()));

  std::unique_ptr<RendezvousClient> link;
  if (!f.standalone) {
    RendezvousOptions ro;
    ro.coordinator = net.coordinator;
    ro.token = net.token;
    ro.role = Role::kServer;
    ro.requested_id = f.id;
    ro.layout_hash = CombinedLayoutHash(layouts);
    ro.address = address;
    ro.heartbeat_interval = std::chrono::milliseconds(cfg.cluster.heartbeat_ms);
    ro.stop_requested = [] { return StopSignalArrived(std::chrono::milliseconds(0)); };  // SIGTERM is blocked
    RendezvousInfo info;
    DP_RETURN_IF_ERROR(RendezvousClient::Register(&transport, ro, std::chrono::seconds(60), &link, &info));
    link->StartHeartbeats([h = host.get()](int32_t worker, bool finished) {
      for (int k = 0; k < h->models(); ++k) h->shard(k)->MarkWorkerGone(worker, finished);
    });
    // Fencing: another process took this server's id while this one was stopped or cut off.
    link->SetOnRemoved([h = host.get()] { h->Fence(); });
  }

  *serving = true;
  host->Start(std::move(endpoint));
  while (true) {
    if (StopSignalArrived(std::chrono::milliseconds(100))) {
      spdlog::info("server {}: signal, stopping", f.id);
      break;
    }
    if (host->shutdown_requested()) break;
    if (host->fenced()) break;
    if (host->log_failed()) break;  // Join says why; the launcher restarts this server with --recover
    if (link && link->shutdown_requested()) {
      spdlog::info("server {}: coordinator says the run is over", f.id);
      break;
    }
  }
  if (link) link->SetOnRemoved({});
  host->Stop();
  Status s = host->Join();
  if (host->fenced()) {
    // Its checkpoint and log are the other process's now: nothing is written, and the job goes
    // on with that process (exit 0, as for a worker put out of the run: nothing to restart).
    spdlog::warn("server {}: out of the run (another process serves its id); exiting without a checkpoint", f.id);
    return s;
  }
  WriteTraceFile(trace, f.run_dir, fmt::format("server-{}", f.id));
  // A stopped run (Ctrl-C, the end of the job) can be resumed without losing an update: every
  // model's shard checkpoints once more on its way out when checkpointing is on.
  for (int k = 0; k < models; ++k) {
    ShardServer* shard = host->shard(k);
    // A shard whose log failed is restarted from its checkpoint and log as they are. A run that
    // keeps its history checkpoints on stop even without periodic checkpoints: downpour-history
    // compares the last checkpoint with the replay of the log.
    const bool checkpoints = cfg.checkpoint.every_updates > 0 || cfg.checkpoint.history;
    if (!checkpoints || shard->updates() <= 0 || shard->log_failed()) continue;
    const std::string& path = shard->options().checkpoint_path;
    const Status c = shard->SaveCheckpoint(path);
    if (c.ok()) {
      spdlog::info("server {}: checkpoint {} written on stop ({} updates)", f.id, path, shard->updates());
    } else if (shard->fenced()) {  // its log was taken over (ShardLog::CheckOwned): out of the run
      spdlog::warn("server {}: out of the run (another process took its log over); exiting without a checkpoint", f.id);
    } else {
      spdlog::error("server {}: checkpoint {} on stop failed: {}", f.id, path, c.ToString());
      if (s.ok()) s = c;
    }
  }
  if (multi) {
    for (int k = 0; k < models; ++k) {
      const ShardStatsWire mk = host->shard(k)->Stats();
      (void)metrics->Write("model_end", {{"model", k},
                                         {"name", cfg.models[static_cast<size_t>(k)].name},
                                         {"pushes_applied", mk.pushes_applied},
                                         {"pushes_rejected", mk.pushes_rejected},
                                         {"pulls_served", mk.pulls_served},
                                         {"chunk_updates", mk.chunk_updates},
                                         {"duplicates", mk.duplicates},
                                         {"dropped_late", mk.dropped_late},
                                         {"pushes_by_worker", ListString(mk.pushes_by_worker)},
                                         {"rejected_by_reason", RejectedString(mk)}});
    }
  }
  const ShardStatsWire st = SumStats(*host);
  spdlog::info("server {}: pushes received {} applied {} rejected {} duplicates {}, pulls {}, chunk updates {}, "
               "log records {} ({} coded, {:.1f} MB) replayed {}, gradient pushes by worker {}; message loop busy {:.2f} s "
               "(update rule {:.2f} s, sufficient factors {:.2f} s, log {:.2f} s)",
               f.id, st.pushes_received, st.pushes_applied, st.pushes_rejected, st.duplicates, st.pulls_served,
               st.chunk_updates, st.wal_records, st.wal_coded_records, 1e-6 * static_cast<double>(st.wal_bytes),
               st.replayed, ListString(st.pushes_by_worker), 1e-9 * st.busy_ns, 1e-9 * st.sgd_ns,
               1e-9 * st.factor_ns, 1e-9 * st.wal_ns);
  refusals->Flush();
  (void)metrics->Write("server_end", {{"pushes_received", st.pushes_received},
                                      {"rejected_by_reason", RejectedString(st)},
                                      {"refused_connections", static_cast<int64_t>(transport.refused_connections())},
                                      {"pushes_applied", st.pushes_applied},
                                      {"pushes_rejected", st.pushes_rejected},
                                      {"refused_unauthorized", RejectedFor(st, RejectReason::kUnauthorized)},
                                      {"refused_outside_run_dir", RejectedFor(st, RejectReason::kOutsideRunDir)},
                                      {"pulls_served", st.pulls_served},
                                      {"chunk_updates", st.chunk_updates},
                                      {"staleness_sum", st.staleness_sum},
                                      {"staleness_max", st.staleness_max},
                                      {"duplicates", st.duplicates},
                                      {"dropped_late", st.dropped_late},
                                      {"dc_compensated", st.dc_compensated},
                                      {"dc_uncompensated", st.dc_uncompensated},
                                      {"evaluator_pulls", st.evaluator_pulls},
                                      {"wal_records", st.wal_records},
                                      // Of them, pushes logged as the wire carried them (factors, lossy codecs).
                                      {"wal_coded_records", st.wal_coded_records},
                                      {"wal_bytes", st.wal_bytes},
                                      {"replayed", st.replayed},
                                      {"pushes_by_worker", ListString(st.pushes_by_worker)},
                                      {"unknown_model", static_cast<int64_t>(host->unknown_model())},
                                      // Wire bytes of this process (all frames, both ways).
                                      {"tx_bytes", transport.traffic().sent_bytes},
                                      {"rx_bytes", transport.traffic().received_bytes},
                                      // Where the message loop's time went (busy / wall = its load).
                                      {"busy_s", 1e-9 * static_cast<double>(st.busy_ns)},
                                      {"sgd_s", 1e-9 * static_cast<double>(st.sgd_ns)},
                                      {"factor_s", 1e-9 * static_cast<double>(st.factor_ns)},
                                      {"wal_s", 1e-9 * static_cast<double>(st.wal_ns)},
                                      {"ok", s.ok()}});
  return s;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  downpour::BlockStopSignals();
  downpour::Flags f;
  CLI::App app{"downpour-server: one parameter-server shard"};
  cli::AddStandardFlags(&app, "downpour-server");
  app.add_option("-c,--config", f.config, "run config (TOML)")->required();
  app.add_option("-i,--id", f.id, "server id, 0..cluster.servers-1")->required()->check(cli::AtLeast(0));
  app.add_option("--run-dir", f.run_dir, "run directory (address file, checkpoints)")->required();
  auto* restore = app.add_option("--restore", f.restore, "shard checkpoint to restore before serving (starts the log afresh)");
  app.add_flag("--recover", f.recover,
               "restore <checkpoint.dir>/server-<id>.dpt if present, replay server-<id>.wal if present, then serve")
      ->excludes(restore);
  app.add_option("--tensors", f.tensors, "tensor list file: '<name> <d0>x<d1>.. [lr_mult [decay_mult]]' per line");
  app.add_option("--model", f.model, "built-in tensor list: alexnet-shapes");
  app.add_option("--port", f.port, "port to bind (default cluster.base_port + id; 0 = any free port)")
      ->check(cli::Between(0, 65535));
  app.add_option("--coordinator", f.net.coordinator, "coordinator host:port (default cluster.coordinator)");
  app.add_option("--bind", f.net.bind, "address to bind: an interface address, 0.0.0.0 or :: (default cluster.bind)");
  app.add_option("--advertise", f.net.advertise,
                 "host workers reach this server at (default cluster.advertise, else derived from the bind)");
  app.add_flag("--standalone", f.standalone, "serve without a coordinator");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  return cli::ServeMain("downpour-server", [&](bool* serving) { return downpour::Run(f, serving); });
}
