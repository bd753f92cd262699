// ps_load_bench.cc — W synthetic workers push and pull an AlexNet-sized model (16 tensors,
// 60,965,224 floats) through S shard servers over loopback TCP, and the same payloads over a
// bare ZeroMQ ROUTER/DEALER pair in the same run (bench/ps/bare_zmq.h) as the limit.
//
// One round per worker = Push(all gradients) then Pull(all weights), both in flight at once
// across all servers, then Wait on both. Servers apply every push (async SGD with momentum) as
// in a real run: the update cost is part of what the system moves per second; the bare peer
// does no work at all, so the ratio is an honest lower bound on transport efficiency.
//
// With --curve the parameter service runs with CurveZMQ on (keys made in a temporary directory,
// every connection authenticated and encrypted, shards checking roles as in a keyed run).
// --security-grid measures the cost of that: at (S,W) in {(2,1),(4,4)} it alternates plaintext
// and CurveZMQ runs of the same service in one process (`--repeats` pairs, the order swapped
// every pair so neither side always runs on a warmer machine), with bare ZeroMQ runs per case,
// plaintext and CurveZMQ, as the transport ceilings.
//
// --wal runs the shards with their write-ahead log on (server/wal.h: every push staged for
// <--wal-dir>/server-<i>.wal before it is applied and acknowledged once the log thread has written
// it, fsynced every --wal-fsync-ms, written with --wal-io; no periodic checkpoints and no size
// bound, so the log only grows: about (warmup + rounds) × W × 244 MB per run, removed after it). --wal-grid measures
// its cost like --security-grid: at (S,W) in {(2,1),(4,4)}, `--repeats` pairs of runs with the log off and on,
// alternating which goes first.
//
// --transport tcp|ipc|shm picks how the parameter service's workers reach the shards: loopback
// TCP (default), ZeroMQ ipc:// sockets in a temporary directory, or ipc:// plus the same-host
// shared-memory path (PsClientOptions::shared_memory). --max-chunks-per-message sets
// PsClientOptions::max_chunks_per_message (1 = one message per chunk). Every parameter-service
// run also prints the latency percentiles of its answered parts (push acks and pull replies,
// PsClientOptions::on_part_reply) and the servers' time in the update rule and in their message
// loop (ShardStatsWire::sgd_ns / busy_ns) over the timed rounds.
//
// --pipeline-grid measures the dense path against an honest reference (bench/ps/pipelined_zmq.h:
// a pipelined, per-chunk bare ZeroMQ parameter service, without and with the shards' SGD
// update): at (S,W) in {(1,1),(2,1),(2,2),(4,4)} it runs, `--repeats` times interleaved (the
// order rotated every repeat), the old bare peer (bare_zmq.h), the reference with update=none,
// the reference with update=sgd, and downpour; then per (S,W) the median and range of each and
// the ratios downpour / reference-sgd and reference-none / old bare (ratios of round rates: > 1
// = faster). Timed rounds per worker there are --rounds / W (at least 3), so every case moves
// about the same bytes and lasts about as long. It starts with the machine's ceilings (nproc,
// memcpy of a 244 MB buffer, load). --pipeline does the same for the one case
// --servers/--workers, with --rounds per worker.
//
//   downpour-bench-ps --servers 2 --workers 1 --rounds 10 [--curve] [--wal] [--transport ipc]
//   downpour-bench-ps --grid            # (S,W) in {(1,1),(2,1),(2,2),(4,4)}
//   downpour-bench-ps --security-grid --repeats 3
//   downpour-bench-ps --wal-grid --repeats 3 [--wal-dir /fast/disk] [--wal-fsync-ms 200]
//
// --link-gbps X (with --pipeline-grid / --pipeline) runs downpour on an emulated link
// (cluster.link_gbps, common/rate_limiter.h): every shard server and every worker gets its own
// ZmqTransport paced to X Gbit/s of egress, as if each were a host of its own. The references
// have no emulated link, so only downpour runs then (shm is refused: it would bypass the link).
// --json PATH writes the grid's results for tools (the scaling model): per (S,W) the round time
// of every repeat, the wire bytes per worker round (worker and server side, from the transports'
// counters), and the shards' update time per chunk and per float (format: docs/emulated_links.md).
//
//   downpour-bench-ps --pipeline-grid --repeats 5 --rounds 12 [--transport tcp|ipc|shm]
//   downpour-bench-ps --pipeline-grid --repeats 3 --rounds 6 --link-gbps 10 --json ps-10g.json
//
// --server-threads N gives every shard N apply lanes (cluster.server_threads); --connections K
// opens K connections from each worker to each shard (cluster.connections_per_server) and
// --io-threads T gives downpour's transports T ZeroMQ I/O threads (cluster.io_threads);
// --inflight-mb M and --send-order call|layer set each connection's window and send order
// (cluster.inflight_mb, cluster.send_order). --apply-grid
// measures how one shard's apply throughput grows with them, without a network
// (bench/ps/apply_scaling.h): --apply-threads 1,2,4, --workers pushers, --rounds timed pushes each.
//
//   downpour-bench-ps --apply-grid --apply-threads 1,2,4 --workers 4 --rounds 4 --repeats 3
#include <fmt/core.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/ps/apply_scaling.h"
#include "bench/ps/bare_zmq.h"
#include "bench/ps/pipelined_zmq.h"
#include "client/ps/ps_client.h"
#include "common/cli.h"
#include "common/layout.h"
#include "common/security.h"
#include "common/status.h"
#include "common/emulated_link.h"
#include "common/zmq_transport.h"
#include "server/shard.h"

namespace downpour::bench {
namespace {

using namespace std::chrono_literals;

struct PsResult {
  double seconds = 0;
  double cpu_seconds = 0;  // CPU time of the whole process (servers and workers) over `seconds`
  double bytes_moved = 0;
  int64_t applied = 0;
  int64_t received = 0;
  int64_t rejected = 0;
  int64_t wal_records = 0;
  double wal_bytes = 0;  // all shards: bytes their logs took over the timed rounds
  // Timed rounds only. Seconds from a part's send to its ack / pull reply (one entry per part).
  std::vector<double> push_latency, pull_latency;
  double sgd_seconds = 0;   // all shards: in the update rule
  double busy_seconds = 0;  // all shards: handling messages on the loop thread
  double wal_seconds = 0;       // all shards: the loop's appends to the write-ahead log (in busy_seconds)
  double wal_sync_seconds = 0;  // all shards: CPU of the logs' fsync threads (beside the loops)
  uint64_t region_parts = 0;  // timed rounds: messages whose payload went through shared memory
  // Timed rounds, all workers / all shards: wire bytes (every frame) from the transports' counters.
  double worker_tx_bytes = 0, worker_rx_bytes = 0, server_tx_bytes = 0, server_rx_bytes = 0;
  uint64_t chunk_updates = 0;  // timed rounds, all shards
};

// How the parameter service's workers reach its shards, and how they cut a request.
enum class ServiceTransport { kTcp, kIpc, kShm };

struct ServiceSetting {
  ServiceTransport transport = ServiceTransport::kTcp;
  int max_chunks_per_message = PsClientOptions{}.max_chunks_per_message;
  // Emulated link per shard server and per worker (ZmqOptions::link_gbps); 0 = none, and then
  // the shards share one transport as before.
  double link_gbps = 0;
  int server_threads = 1;  // every shard's apply lanes (cluster.server_threads)
  int connections = 1;     // each worker's connections per server (cluster.connections_per_server)
  int io_threads = 2;      // ZeroMQ I/O threads of every transport (cluster.io_threads)
  int inflight_mb = 128;   // each connection's window (cluster.inflight_mb)
  SendOrder send_order = SendOrder::kCall;  // cluster.send_order
};

const char* TransportName(ServiceTransport t) {
  switch (t) {
    case ServiceTransport::kTcp: return "tcp";
    case ServiceTransport::kIpc: return "ipc";
    case ServiceTransport::kShm: return "shm";
  }
  return "?";
}

// The shards' solver, and the reference's: any finite step; the work per update is what matters.
SolverConfig BenchSolver() {
  SolverConfig solver;
  solver.base_lr = 1e-6f;
  solver.momentum = 0.9f;
  solver.weight_decay = 5e-4f;
  return solver;
}

// A fresh temporary directory for ipc:// socket files (or none), removed with its sockets.
class IpcDir {
 public:
  explicit IpcDir(bool wanted) {
    if (!wanted) return;
    char pattern[] = "/tmp/downpour-bench-ipc-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) ThrowIfError(IoError("mkdtemp {}: cannot make a socket directory", pattern));
    path_ = pattern;
  }
  ~IpcDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  // Server s's address: "ipc://<dir>/shard-<s>", or loopback TCP at base_port + s without a dir.
  std::string Address(int s, int base_port) const {
    return path_.empty() ? fmt::format("tcp://127.0.0.1:{}", base_port + s) : fmt::format("ipc://{}/shard-{}", path_, s);
  }

 private:
  std::string path_;
};

// Collects per-part reply latencies from the PsClients' I/O threads while `on` is set.
// Thread-safety: Record from any thread; Take* once every client is gone.
class LatencyLog {
 public:
  std::atomic<bool> on{false};  // set when the timed rounds start

  void Record(MsgType type, double seconds) {
    if (!on.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mu_);
    (type == MsgType::kPull ? pull_ : push_).push_back(seconds);
  }
  std::vector<double> TakePush() { return std::move(push_); }
  std::vector<double> TakePull() { return std::move(pull_); }

 private:
  std::mutex mu_;
  std::vector<double> push_, pull_;
};

// The write-ahead log of a run: off, or on in a fresh directory under `dir` (removed after).
struct WalSetting {
  bool on = false;
  std::string dir = "/tmp";
  int fsync_ms = 200;
  WalIo io = WalIo::kAuto;
};

class WalDir {
 public:
  explicit WalDir(const WalSetting& w) {
    if (!w.on) return;
    std::string pattern = w.dir + "/downpour-bench-wal-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ThrowIfError(IoError("mkdtemp {}: cannot make a log directory", pattern));
    path_ = pattern;
  }
  ~WalDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }  // "" = log off

 private:
  std::string path_;
};

// CPU time of this process, all threads. On a machine others load, the CPU seconds per GB
// moved say what security costs more steadily than wall-clock throughput does.
double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// CurveZMQ keys for one benchmark process, in a fresh temporary directory removed at the end.
// Empty (curve off) when not wanted.
class BenchKeys {
 public:
  explicit BenchKeys(bool wanted) {
    if (!wanted) return;
    char pattern[] = "/tmp/downpour-bench-keys-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) ThrowIfError(IoError("mkdtemp {}: cannot make a key directory", pattern));
    root_ = pattern;
    const std::string dir = root_ + "/keys";
    ThrowIfError(MakeClusterKeys(dir));
    ThrowIfError(LoadCurveKeys(dir, KeyRole::kServer, /*bind=*/true, &server_));
    ThrowIfError(LoadCurveKeys(dir, KeyRole::kWorker, /*bind=*/false, &worker_));
  }
  ~BenchKeys() {
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }
  bool on() const { return server_.enabled; }
  const CurveOptions& server() const { return server_; }
  const CurveOptions& worker() const { return worker_; }

 private:
  std::string root_;
  CurveOptions server_, worker_;  // enabled = false when curve is off
};

PsResult RunParameterService(const ParamLayout& layout, int workers, int warmup, int rounds, int base_port,
                             const BenchKeys& keys, const WalSetting& wal = {}, const ServiceSetting& svc = {}) {
  const int servers = layout.servers();
  const WalDir wal_dir(wal);
  const IpcDir ipc_dir(svc.transport != ServiceTransport::kTcp);
  ZmqOptions server_options;
  server_options.io_threads = svc.io_threads;
  server_options.curve = keys.server();
  // One transport for all shards, or with an emulated link one per shard (each its own host,
  // each behind its own link: common/emulated_link.h).
  std::vector<std::unique_ptr<ZmqTransport>> server_transports;
  std::vector<std::unique_ptr<EmulatedLinkTransport>> server_links;
  const int transports = svc.link_gbps > 0 ? servers : 1;
  for (int s = 0; s < transports; ++s) {
    server_transports.push_back(std::make_unique<ZmqTransport>(server_options));
    if (svc.link_gbps > 0) {
      server_links.push_back(
          std::make_unique<EmulatedLinkTransport>(server_transports.back().get(), EmulatedLinkOptions{svc.link_gbps}));
    }
  }
  auto server_transport = [&](int s) -> Transport* {
    if (svc.link_gbps > 0) return server_links[static_cast<size_t>(s)].get();
    return server_transports[static_cast<size_t>(s % transports)].get();
  };
  auto server_traffic = [&] {
    TrafficCounts sum;
    for (const auto& t : server_transports) {
      sum.sent_bytes += t->traffic().sent_bytes;
      sum.received_bytes += t->traffic().received_bytes;
    }
    return sum;
  };
  std::vector<std::unique_ptr<ShardServer>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < servers; ++s) {
    ShardOptions o;
    o.server_id = s;
    o.cluster.workers = workers;
    o.cluster.server_threads = svc.server_threads;
    o.solver = BenchSolver();
    o.access.keyed = keys.on();  // keyed: pushes and pulls only from "worker" keys, as in a real run
    if (!wal_dir.path().empty()) {
      o.wal_path = fmt::format("{}/server-{}.wal", wal_dir.path(), s);
      o.checkpoint.wal_fsync_ms = wal.fsync_ms;
      o.checkpoint.wal_io = wal.io;
    }
    std::unique_ptr<ShardServer> shard;
    ThrowIfError(ShardServer::Create(layout, o, &shard));
    std::string address = ipc_dir.Address(s, base_port);
    std::unique_ptr<ServerEndpoint> ep;
    ThrowIfError(server_transport(s)->Bind(address, &ep));
    shard->Start(std::move(ep));
    shards.push_back(std::move(shard));
    addresses.push_back(address);
  }

  const auto n = static_cast<size_t>(layout.total_elems());
  LatencyLog latencies;
  std::vector<ShardStatsWire> stats_at_start(static_cast<size_t>(servers));
  std::atomic<int> at_start{0};
  std::atomic<int> init_done{0};
  std::chrono::steady_clock::time_point t0;
  // When each worker's last round ended: the timed span stops at the last of them, before the
  // clients and transports are torn down (not part of a round).
  std::vector<std::chrono::steady_clock::time_point> done(static_cast<size_t>(workers));
  double cpu0 = 0;
  TrafficCounts server_at_start;
  std::mutex traffic_mu;
  TrafficCounts worker_traffic;  // guarded by traffic_mu: timed rounds, summed over workers
  std::vector<std::thread> threads;
  std::vector<Status> worker_status(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto run = [&]() -> Status {
        ZmqOptions client_options;
        client_options.io_threads = svc.io_threads;
        client_options.curve = keys.worker();
        ZmqTransport zmq(client_options);
        std::unique_ptr<EmulatedLinkTransport> link;
        if (svc.link_gbps > 0) link = std::make_unique<EmulatedLinkTransport>(&zmq, EmulatedLinkOptions{svc.link_gbps});
        Transport& transport = link ? static_cast<Transport&>(*link) : zmq;
        TrafficCounts mine_at_start;
        PsClientOptions co;
        co.server_addresses = addresses;
        co.worker_id = w;
        co.max_chunks_per_message = svc.max_chunks_per_message;
        co.connections_per_server = svc.connections;
        co.max_inflight_bytes = static_cast<uint64_t>(svc.inflight_mb) << 20;
        co.send_order = svc.send_order;
        co.shared_memory = svc.transport == ServiceTransport::kShm;
        co.on_part_reply = [&latencies](int, MsgType type, size_t, double seconds) { latencies.Record(type, seconds); };
        std::unique_ptr<PsClient> client;
        DP_RETURN_IF_ERROR(PsClient::Create(&transport, layout, co, &client));
        DP_RETURN_IF_ERROR(client->Connect(30s));
        std::vector<float> weights(n, 0.01f);
        std::vector<float> grads(n, 1e-3f);
        if (w == 0) {
          DP_RETURN_IF_ERROR(client->Wait(client->PushInit(weights), 120s));
          init_done = 1;
        }
        while (!init_done) std::this_thread::sleep_for(1ms);
        for (int r = 0; r < warmup + rounds; ++r) {
          if (r == warmup && at_start.fetch_add(1) == 0) {
            for (int s = 0; s < servers; ++s) stats_at_start[static_cast<size_t>(s)] = shards[static_cast<size_t>(s)]->Stats();
            latencies.on = true;
            server_at_start = server_traffic();
            t0 = std::chrono::steady_clock::now();
            cpu0 = ProcessCpuSeconds();
          }
          if (r == warmup) mine_at_start = transport.traffic();
          RequestId push = client->Push(grads, r);
          RequestId pull = client->Pull(weights, r + 1);
          DP_RETURN_IF_ERROR(client->Wait(push, 120s));
          DP_RETURN_IF_ERROR(client->Wait(pull, 120s));
        }
        done[static_cast<size_t>(w)] = std::chrono::steady_clock::now();
        const TrafficCounts mine = transport.traffic();
        std::lock_guard<std::mutex> lock(traffic_mu);
        worker_traffic.sent_bytes += mine.sent_bytes - mine_at_start.sent_bytes;
        worker_traffic.received_bytes += mine.received_bytes - mine_at_start.received_bytes;
        return Status::Ok();
      };
      worker_status[static_cast<size_t>(w)] = run();
    });
  }
  for (auto& t : threads) t.join();
  const auto t1 = *std::max_element(done.begin(), done.end());
  const double cpu1 = ProcessCpuSeconds();
  const TrafficCounts server_at_end = server_traffic();
  for (const Status& s : worker_status) ThrowIfError(s);

  PsResult result;
  for (size_t i = 0; i < shards.size(); ++i) {
    auto& shard = shards[i];
    ShardStatsWire st = shard->Stats();
    result.sgd_seconds += 1e-9 * static_cast<double>(st.sgd_ns - stats_at_start[i].sgd_ns);
    result.busy_seconds += 1e-9 * static_cast<double>(st.busy_ns - stats_at_start[i].busy_ns);
    result.wal_seconds += 1e-9 * static_cast<double>(st.wal_ns - stats_at_start[i].wal_ns);
    result.wal_sync_seconds += 1e-9 * static_cast<double>(st.wal_sync_cpu_ns - stats_at_start[i].wal_sync_cpu_ns);
    result.region_parts += st.region_parts - stats_at_start[i].region_parts;
    result.chunk_updates += st.chunk_updates - stats_at_start[i].chunk_updates;
    result.applied += st.pushes_applied;
    result.received += st.pushes_received;
    result.rejected += st.pushes_rejected;
    result.wal_records += st.wal_records;
    result.wal_bytes += static_cast<double>(st.wal_bytes - stats_at_start[i].wal_bytes);
    shard->Stop();
    ThrowIfError(shard->Join());
  }
  result.seconds = std::chrono::duration<double>(t1 - t0).count();
  result.cpu_seconds = cpu1 - cpu0;
  result.bytes_moved = 2.0 * static_cast<double>(n) * sizeof(float) * workers * rounds;
  result.worker_tx_bytes = static_cast<double>(worker_traffic.sent_bytes);
  result.worker_rx_bytes = static_cast<double>(worker_traffic.received_bytes);
  // The shards' transports keep counting after the last worker's round (acks to nobody, none):
  // the snapshot at the end of the timed span is what they moved in it.
  result.server_tx_bytes = static_cast<double>(server_at_end.sent_bytes - server_at_start.sent_bytes);
  result.server_rx_bytes = static_cast<double>(server_at_end.received_bytes - server_at_start.received_bytes);
  result.push_latency = latencies.TakePush();
  result.pull_latency = latencies.TakePull();
  return result;
}

ParamLayout AlexNetLayout(int servers, int64_t chunk_elems) {
  ParamLayout layout;
  ThrowIfError(ParamLayout::Build(AlexNetTensorSpecs(), servers, chunk_elems, &layout));
  return layout;
}

// Nearest-rank percentile (q in [0, 1]) of `v`; 0 for an empty list.
double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// "push p50/p99 12.3/45.6 ms (n=…), pull p50/p99 …/… ms (n=…)".
std::string LatencyText(const std::vector<double>& push, const std::vector<double>& pull) {
  return fmt::format("push p50/p99 {:.1f}/{:.1f} ms (n={}), pull p50/p99 {:.1f}/{:.1f} ms (n={})",
                     1e3 * Percentile(push, 0.5), 1e3 * Percentile(push, 0.99), push.size(),
                     1e3 * Percentile(pull, 0.5), 1e3 * Percentile(pull, 0.99), pull.size());
}

// Server time over the timed rounds: per worker-round (one model's worth of pushes and pulls)
// and as the mean share of wall time of one server's loop thread. The update runs on the apply
// lanes (server/apply_lanes.h), so "loop busy" is the loop's own work beside it; the words
// "beside the update" say so to readers of saved output (tools/downpour_scaling.py: output of
// older builds, without them, counted the update inside the loop's time).
std::string ServerTimeText(double sgd_seconds, double busy_seconds, int servers, int workers, int rounds,
                           double wall_seconds) {
  const double worker_rounds = static_cast<double>(workers) * rounds;
  const double thread_seconds = wall_seconds * servers;
  return fmt::format(
      "server sgd {:.3f} s/round ({:.0f}% of wall per server), loop busy {:.3f} s/round ({:.0f}%) beside the update",
      sgd_seconds / worker_rounds, 100 * sgd_seconds / thread_seconds, busy_seconds / worker_rounds,
      100 * busy_seconds / thread_seconds);
}

void RunCase(int servers, int workers, int warmup, int rounds, int64_t chunk_elems, int port, bool curve,
             const WalSetting& wal, const ServiceSetting& svc) {
  const ParamLayout layout = AlexNetLayout(servers, chunk_elems);
  std::vector<std::vector<int64_t>> frames(static_cast<size_t>(servers));
  for (const Chunk& c : layout.chunks()) frames[static_cast<size_t>(c.server)].push_back(c.count);

  BareResult bare = RunBareZmq(frames, workers, warmup, rounds, port);
  BenchKeys keys(curve);
  PsResult ps = RunParameterService(layout, workers, warmup, rounds, port + 100, keys, wal, svc);

  const double gb = 1e9;
  const double bare_gbs = bare.bytes_moved / bare.seconds / gb;
  const double ps_gbs = ps.bytes_moved / ps.seconds / gb;
  fmt::print(
      "S={} W={} chunks={}{} | downpour: {:.2f} rounds/s/worker {:.2f} GB/s | bare zmq: {:.2f} "
      "rounds/s/worker {:.2f} GB/s | ratio {:.0f}% | CPU s per GB moved: downpour {:.3f}, bare zmq {:.3f} ({:.2f}x) | "
      "pushes recv/applied/rejected {}/{}/{}{}\n",
      servers, workers, layout.num_chunks(), curve ? " curve" : "", rounds / ps.seconds, ps_gbs, rounds / bare.seconds,
      bare_gbs, 100.0 * ps_gbs / bare_gbs, ps.cpu_seconds / (ps.bytes_moved / gb),
      bare.cpu_seconds / (bare.bytes_moved / gb),
      (ps.cpu_seconds / ps.bytes_moved) / (bare.cpu_seconds / bare.bytes_moved), ps.received, ps.applied, ps.rejected,
      wal.on ? fmt::format(" | wal records {} (fsync {} ms)", ps.wal_records, wal.fsync_ms) : "");
  // Per worker-round, read by tools/downpour_scaling.py: the whole process's CPU (beyond the
  // servers' loops it is the transport's: both ends' ZeroMQ I/O threads and kernel, the clients'
  // threads; io_ns_per_byte) and, with the log on, the loops' appends to it and its fsync
  // threads' CPU (the per-float cost of logging a push).
  const double worker_rounds = static_cast<double>(workers) * rounds;
  fmt::print("S={} W={} downpour ({}, max {} chunks/message, {} via shared memory) parts: {} | {}, process cpu {:.3f} "
             "s/round{}\n", servers, workers,
             TransportName(svc.transport), svc.max_chunks_per_message, ps.region_parts, LatencyText(ps.push_latency, ps.pull_latency),
             ServerTimeText(ps.sgd_seconds, ps.busy_seconds, servers, workers, rounds, ps.seconds),
             ps.cpu_seconds / worker_rounds,
             wal.on ? fmt::format(", wal append {:.3f} s/round, wal fsync thread cpu {:.3f} s/round",
                                  ps.wal_seconds / worker_rounds, ps.wal_sync_seconds / worker_rounds)
                    : "");
  std::fflush(stdout);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One (S,W) case of the security grid: bare ZeroMQ runs, plaintext and CurveZMQ, as the
// ceilings, then `repeats` pairs of plaintext and CurveZMQ runs, alternating which goes first.
// Ratios as "38% / 57% / 43%", in run order.
std::string Percents(const std::vector<double>& v) {
  std::string list;
  for (double x : v) list += fmt::format("{}{:.0f}%", list.empty() ? "" : " / ", 100 * x);
  return list;
}

void RunSecurityCase(int servers, int workers, int warmup, int rounds, int repeats, int64_t chunk_elems, int port) {
  const ParamLayout layout = AlexNetLayout(servers, chunk_elems);
  std::vector<std::vector<int64_t>> frames(static_cast<size_t>(servers));
  for (const Chunk& c : layout.chunks()) frames[static_cast<size_t>(c.server)].push_back(c.count);
  const double gb = 1e9;
  const BenchKeys no_keys(false);
  const BenchKeys keys(true);
  const BareResult bare = RunBareZmq(frames, workers, warmup, rounds, port);
  const BareResult bare_curve = RunBareZmq(frames, workers, warmup, rounds, port + 5, keys.server(), keys.worker());
  fmt::print("S={} W={} bare zmq: plaintext {:.2f} GB/s, CurveZMQ {:.2f} GB/s (ceilings)\n", servers, workers,
             bare.bytes_moved / bare.seconds / gb, bare_curve.bytes_moved / bare_curve.seconds / gb);
  std::fflush(stdout);
  std::vector<double> ratios, cpu_ratios;
  for (int r = 0; r < repeats; ++r) {
    double gbs[2] = {0, 0};         // [0] plaintext, [1] curve
    double cpu_per_gb[2] = {0, 0};  // CPU seconds of the process per GB moved
    for (int k = 0; k < 2; ++k) {
      const bool curve = (k + r) % 2 == 1;  // pair 0: plaintext first; pair 1: curve first; ...
      port += 10;
      const PsResult ps = RunParameterService(layout, workers, warmup, rounds, port, curve ? keys : no_keys);
      const int i = curve ? 1 : 0;
      gbs[i] = ps.bytes_moved / ps.seconds / gb;
      cpu_per_gb[i] = ps.cpu_seconds / (ps.bytes_moved / gb);
      fmt::print(
          "S={} W={} pair {} {:9}: {:.2f} GB/s, {:.2f} rounds/s/worker, {:.2f} CPU s/GB, pushes "
          "recv/applied/rejected {}/{}/{}\n",
          servers, workers, r + 1, curve ? "curve" : "plaintext", gbs[i], rounds / ps.seconds, cpu_per_gb[i],
          ps.received, ps.applied, ps.rejected);
      std::fflush(stdout);
    }
    ratios.push_back(gbs[1] / gbs[0]);
    cpu_ratios.push_back(cpu_per_gb[1] / cpu_per_gb[0]);
  }
  fmt::print("S={} W={} curve/plaintext throughput: {} (median {:.0f}%); CPU per GB: {} (median {:.0f}%)\n", servers,
             workers, Percents(ratios), 100 * Median(ratios), Percents(cpu_ratios), 100 * Median(cpu_ratios));
  std::fflush(stdout);
}

// One (S,W) case of the WAL grid: `repeats` pairs of runs with the log off and on, alternating
// which goes first, in one process.
void RunWalCase(int servers, int workers, int warmup, int rounds, int repeats, int64_t chunk_elems, int port,
                const WalSetting& wal) {
  const ParamLayout layout = AlexNetLayout(servers, chunk_elems);
  const double gb = 1e9;
  const BenchKeys no_keys(false);
  std::vector<double> ratios, cpu_ratios;
  for (int r = 0; r < repeats; ++r) {
    double gbs[2] = {0, 0};         // [0] log off, [1] log on
    double cpu_per_gb[2] = {0, 0};  // CPU seconds of the process per GB moved
    for (int k = 0; k < 2; ++k) {
      const bool on = (k + r) % 2 == 1;  // pair 0: off first; pair 1: on first; ...
      port += 10;
      WalSetting setting = wal;
      setting.on = on;
      const PsResult ps = RunParameterService(layout, workers, warmup, rounds, port, no_keys, setting);
      const int i = on ? 1 : 0;
      gbs[i] = ps.bytes_moved / ps.seconds / gb;
      cpu_per_gb[i] = ps.cpu_seconds / (ps.bytes_moved / gb);
      fmt::print("S={} W={} pair {} {:7}: {:.2f} GB/s, {:.2f} rounds/s/worker, {:.2f} CPU s/GB, pushes applied {}, "
                 "log records {}, log {:.1f} MB/round, log thread cpu {:.3f} s/round\n",
                 servers, workers, r + 1, on ? "wal on" : "wal off", gbs[i], rounds / ps.seconds, cpu_per_gb[i],
                 ps.applied, ps.wal_records, ps.wal_bytes / 1e6 / rounds, ps.wal_sync_seconds / rounds);
      std::fflush(stdout);
    }
    ratios.push_back(gbs[1] / gbs[0]);
    cpu_ratios.push_back(cpu_per_gb[1] / cpu_per_gb[0]);
  }
  fmt::print("S={} W={} wal on/off throughput (fsync every {} ms, logs in {}): {} (median {:.0f}%); CPU per GB: {} "
             "(median {:.0f}%)\n",
             servers, workers, wal.fsync_ms, wal.dir, Percents(ratios), 100 * Median(ratios), Percents(cpu_ratios),
             100 * Median(cpu_ratios));
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// The dense path against the honest pipelined reference (--pipeline-grid, --pipeline).

// Cores this process may run on (what `nproc` prints).
int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

// The machine's ceilings, printed before a grid: cores, the memory bandwidth of one copy of a
// model-sized buffer (a pull's copy into the engine buffer can go no faster; bytes copied per
// second, best of 5 on touched buffers), and the load average (other builds share this machine).
void PrintCeilings() {
  const auto bytes = static_cast<size_t>(TotalElements(AlexNetTensorSpecs())) * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes, 2);  // touched: no page faults in the timed copies
  double best = 0;
  volatile char sink = 0;
  for (int i = 0; i < 5; ++i) {
    from[static_cast<size_t>(i)] = static_cast<char>(i);
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + to[static_cast<size_t>(i)];
    best = std::max(best, static_cast<double>(bytes) / sec);
  }
  double load[3] = {0, 0, 0};
  ::getloadavg(load, 3);
  fmt::print("machine: nproc {} | memcpy of {:.0f} MB: {:.1f} GB/s (best of 5) | load average {:.2f} {:.2f} {:.2f} | "
             "sgemm ceiling: build/bench/engine/downpour-bench-engine --gemm-only --threads 2\n",
             UsableCores(), static_cast<double>(bytes) / 1e6, best / 1e9, load[0], load[1], load[2]);
  std::fflush(stdout);
}

enum Variant { kOldBare = 0, kRefNone = 1, kRefSgd = 2, kDownpour = 3, kVariants = 4 };

struct PipelineSetting {
  ServiceSetting service;      // downpour's side
  bool reference_ipc = false;  // the reference over ipc:// instead of loopback TCP
};

std::string VariantName(int v, const PipelineSetting& p) {
  switch (v) {
    case kOldBare: return "old bare";
    case kRefNone: return fmt::format("ref none ({})", p.reference_ipc ? "ipc" : "tcp");
    case kRefSgd: return fmt::format("ref sgd ({})", p.reference_ipc ? "ipc" : "tcp");
    default: {
      const ServiceSetting& v = p.service;  // the settings that differ from the defaults, named
      std::string more;
      if (v.server_threads != 1) more += fmt::format(", lanes {}", v.server_threads);
      if (v.connections != 1) more += fmt::format(", conns {}", v.connections);
      if (v.io_threads != 2) more += fmt::format(", io {}", v.io_threads);
      if (v.inflight_mb != 128) more += fmt::format(", window {} MiB", v.inflight_mb);
      if (v.send_order != SendOrder::kCall) more += fmt::format(", by {}", SendOrderName(v.send_order));
      return fmt::format("downpour ({}{})", TransportName(v.transport), more);
    }
  }
}

// Every repeat of one (S,W): seconds per round per worker and GB/s of each variant, in repeat
// order (empty for a variant that did not run: with an emulated link only downpour runs); and
// downpour's own measurements per repeat.
struct PipelineCase {
  int servers = 0, workers = 0, chunks = 0, rounds = 0;
  std::vector<double> seconds[kVariants];
  std::vector<double> gbs[kVariants];
  std::vector<PsResult> downpour;  // per repeat (latency lists dropped)
};

// Whether variant `v` runs: the references have no emulated link, so with one only downpour.
bool VariantRuns(int v, const PipelineSetting& p) { return p.service.link_gbps <= 0 || v == kDownpour; }

// Ratios of round rates a / b (> 1 = a faster), per repeat.
std::vector<double> RateRatios(const std::vector<double>& a_seconds, const std::vector<double>& b_seconds) {
  std::vector<double> r;
  for (size_t i = 0; i < a_seconds.size(); ++i) r.push_back(b_seconds[i] / a_seconds[i]);
  return r;
}

// "0.85 / 0.91 / 0.88", in run order.
std::string RatioList(const std::vector<double>& v) {
  std::string list;
  for (double x : v) list += fmt::format("{}{:.2f}", list.empty() ? "" : " / ", x);
  return list;
}

// "0.183 [0.170–0.199]".
std::string MedianRange(const std::vector<double>& v, const char* format = "{:.3f}") {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{} [{}–{}]", fmt::format(fmt::runtime(format), Median(v)), fmt::format(fmt::runtime(format), *lo),
                     fmt::format(fmt::runtime(format), *hi));
}

// One run of variant `v`; prints its line and returns (seconds per round per worker, GB/s).
// Downpour's run also lands in `*ps` (its latency lists emptied).
std::pair<double, double> RunVariant(int v, const ParamLayout& layout, int workers, int warmup, int rounds, int port,
                                     const PipelineSetting& p, int repeat, PsResult* ps) {
  const int servers = layout.servers();
  double seconds = 0, bytes = 0;
  std::string detail;
  if (v == kOldBare) {
    std::vector<std::vector<int64_t>> frames(static_cast<size_t>(servers));
    for (const Chunk& c : layout.chunks()) frames[static_cast<size_t>(c.server)].push_back(c.count);
    const BareResult r = RunBareZmq(frames, workers, warmup, rounds, port);
    seconds = r.seconds;
    bytes = r.bytes_moved;
  } else if (v == kRefNone || v == kRefSgd) {
    const IpcDir dir(p.reference_ipc);
    PipelinedOptions o;
    o.update = v == kRefSgd ? RefUpdate::kSgd : RefUpdate::kNone;
    o.solver = BenchSolver();
    for (int s = 0; s < servers; ++s) o.addresses.push_back(dir.Address(s, port));
    o.warmup_rounds = warmup;
    o.rounds = rounds;
    const PipelinedResult r = RunPipelinedZmq(layout, workers, o);
    seconds = r.seconds;
    bytes = r.bytes_moved;
    detail = fmt::format(" | chunks: {} | {}", LatencyText(r.push_latency, r.pull_latency),
                         ServerTimeText(r.sgd_seconds, r.busy_seconds, servers, workers, rounds, r.seconds));
  } else {
    PsResult r = RunParameterService(layout, workers, warmup, rounds, port, BenchKeys(false), {}, p.service);
    seconds = r.seconds;
    bytes = r.bytes_moved;
    const double worker_rounds = static_cast<double>(workers) * rounds;
    detail = fmt::format(" | pushes applied {} rejected {} | via shared memory {} | parts (max {} chunks): {} | {} | "
                         "wire per worker round: tx {:.1f} MB rx {:.1f} MB",
                         r.applied, r.rejected, r.region_parts, p.service.max_chunks_per_message, LatencyText(r.push_latency, r.pull_latency),
                         ServerTimeText(r.sgd_seconds, r.busy_seconds, servers, workers, rounds, r.seconds),
                         r.worker_tx_bytes / worker_rounds / 1e6, r.worker_rx_bytes / worker_rounds / 1e6);
    r.push_latency.clear();
    r.pull_latency.clear();
    *ps = std::move(r);
  }
  const double per_round = seconds / rounds;
  const double gbs = bytes / seconds / 1e9;
  fmt::print("S={} W={} repeat {} {:15}: {:.3f} s/round/worker {:5.2f} GB/s (timed {:.1f} s){}\n", servers, workers,
             repeat + 1, VariantName(v, p), per_round, gbs, seconds, detail);
  std::fflush(stdout);
  return {per_round, gbs};
}

// One (S,W): `repeats` rounds of the four variants, the order rotated each repeat so no variant
// always runs first (on a warmer or a quieter machine); then median and range of each.
PipelineCase RunPipelineCase(int servers, int workers, int warmup, int rounds, int repeats, int64_t chunk_elems,
                             int* port, const PipelineSetting& p) {
  const ParamLayout layout = AlexNetLayout(servers, chunk_elems);
  PipelineCase out;
  out.servers = servers;
  out.workers = workers;
  double load[3] = {0, 0, 0};
  ::getloadavg(load, 3);
  out.chunks = layout.num_chunks();
  out.rounds = rounds;
  fmt::print("S={} W={}: {} chunks, {} timed rounds per worker, load average {:.2f}{}\n", servers, workers,
             layout.num_chunks(), rounds, load[0],
             p.service.link_gbps > 0 ? fmt::format(", emulated link {:g} Gbit/s per process", p.service.link_gbps) : "");
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < kVariants; ++k) {
      const int v = (k + r) % kVariants;
      if (!VariantRuns(v, p)) continue;
      *port += servers + 2;
      PsResult ps;
      const auto [per_round, gbs] = RunVariant(v, layout, workers, warmup, rounds, *port, p, r, &ps);
      out.seconds[v].push_back(per_round);
      out.gbs[v].push_back(gbs);
      if (v == kDownpour) out.downpour.push_back(std::move(ps));
    }
  }
  fmt::print("S={} W={} over {} repeats — s/round/worker median [min–max], GB/s median:\n", servers, workers, repeats);
  for (int v = 0; v < kVariants; ++v) {
    if (!VariantRuns(v, p)) continue;
    fmt::print("  {:15} {}  {:.2f} GB/s\n", VariantName(v, p), MedianRange(out.seconds[v]), Median(out.gbs[v]));
  }
  if (p.service.link_gbps > 0) {
    std::fflush(stdout);
    return out;  // no reference to compare with
  }
  const auto dp_sgd = RateRatios(out.seconds[kDownpour], out.seconds[kRefSgd]);
  const auto none_bare = RateRatios(out.seconds[kRefNone], out.seconds[kOldBare]);
  fmt::print("  downpour / ref sgd  (round rate): {}  per repeat: {}\n", MedianRange(dp_sgd, "{:.2f}"),
             RatioList(dp_sgd));
  fmt::print("  ref none / old bare (round rate): {}  per repeat: {}\n", MedianRange(none_bare, "{:.2f}"),
             RatioList(none_bare));
  std::fflush(stdout);
  return out;
}

// Medians over repeats of downpour's per-round measurements (per worker round: one worker's push
// of every gradient and pull of every weight).
struct DownpourMedians {
  double worker_tx = 0, worker_rx = 0, server_tx = 0, server_rx = 0;  // bytes per worker round
  double sgd_s_per_chunk = 0, sgd_ns_per_float = 0, busy_s_per_round = 0;
};

DownpourMedians Medians(const PipelineCase& c, int64_t model_floats) {
  std::vector<double> v[7];
  const double worker_rounds = static_cast<double>(c.workers) * c.rounds;
  for (const PsResult& r : c.downpour) {
    v[0].push_back(r.worker_tx_bytes / worker_rounds);
    v[1].push_back(r.worker_rx_bytes / worker_rounds);
    v[2].push_back(r.server_tx_bytes / worker_rounds);
    v[3].push_back(r.server_rx_bytes / worker_rounds);
    v[4].push_back(r.chunk_updates > 0 ? r.sgd_seconds / static_cast<double>(r.chunk_updates) : 0);
    v[5].push_back(1e9 * r.sgd_seconds / (worker_rounds * static_cast<double>(model_floats)));
    v[6].push_back(r.busy_seconds / worker_rounds);
  }
  if (c.downpour.empty()) return {};
  return {Median(v[0]), Median(v[1]), Median(v[2]), Median(v[3]), Median(v[4]), Median(v[5]), Median(v[6])};
}

// With an emulated link: downpour alone, as a Markdown table.
void PrintLinkTable(const std::vector<PipelineCase>& cases, const PipelineSetting& p) {
  const int64_t floats = TotalElements(AlexNetTensorSpecs());
  fmt::print("\n| S | W | link Gbit/s | s/round/worker | GB/s | worker tx MB/round | worker rx MB/round | sgd ms/chunk |\n"
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
  for (const PipelineCase& c : cases) {
    const DownpourMedians m = Medians(c, floats);
    fmt::print("| {} | {} | {:g} | {} | {:.2f} | {:.1f} | {:.1f} | {:.2f} |\n", c.servers, c.workers,
               p.service.link_gbps, MedianRange(c.seconds[kDownpour]), Median(c.gbs[kDownpour]), m.worker_tx / 1e6,
               m.worker_rx / 1e6, 1e3 * m.sgd_s_per_chunk);
  }
  std::fflush(stdout);
}

// "[0.1, 0.2]" with full precision, for JSON.
std::string JsonList(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{:.6g}", i ? ", " : "", v[i]);
  return out + "]";
}

// The grid as JSON (format: docs/emulated_links.md, "downpour-bench-ps --json"). Throws on a write error.
void WritePipelineJson(const std::string& path, const std::vector<PipelineCase>& cases, const PipelineSetting& p,
                       int64_t chunk_elems, int repeats) {
  const int64_t floats = TotalElements(AlexNetTensorSpecs());
  double load[3] = {0, 0, 0};
  ::getloadavg(load, 3);
  std::string j = "{\n";
  j += fmt::format("  \"format\": \"downpour-bench-ps/1\",\n  \"model\": {{\"name\": \"alexnet\", \"floats\": {}, "
                   "\"bytes\": {}}},\n",
                   floats, floats * 4);
  j += fmt::format("  \"link_gbps\": {},\n", p.service.link_gbps > 0 ? fmt::format("{:g}", p.service.link_gbps) : "null");
  j += fmt::format("  \"transport\": \"{}\",\n  \"chunk_elems\": {},\n  \"max_chunks_per_message\": {},\n",
                   TransportName(p.service.transport), chunk_elems, p.service.max_chunks_per_message);
  j += fmt::format("  \"repeats\": {},\n  \"machine\": {{\"nproc\": {}, \"load1_at_end\": {:.2f}}},\n  \"cases\": [\n",
                   repeats, UsableCores(), load[0]);
  for (size_t i = 0; i < cases.size(); ++i) {
    const PipelineCase& c = cases[i];
    const DownpourMedians m = Medians(c, floats);
    j += fmt::format("    {{\"servers\": {}, \"workers\": {}, \"chunks\": {}, \"timed_rounds_per_worker\": {},\n",
                     c.servers, c.workers, c.chunks, c.rounds);
    j += fmt::format("     \"downpour\": {{\"round_s\": {}, \"round_s_median\": {:.6g}, \"gbs\": {},\n",
                     JsonList(c.seconds[kDownpour]), Median(c.seconds[kDownpour]), JsonList(c.gbs[kDownpour]));
    j += fmt::format("       \"worker_tx_bytes_per_round\": {:.0f}, \"worker_rx_bytes_per_round\": {:.0f},\n"
                     "       \"server_tx_bytes_per_round\": {:.0f}, \"server_rx_bytes_per_round\": {:.0f},\n",
                     m.worker_tx, m.worker_rx, m.server_tx, m.server_rx);
    j += fmt::format("       \"sgd_s_per_chunk\": {:.6g}, \"sgd_ns_per_float\": {:.6g}, \"server_busy_s_per_round\": {:.6g}}}",
                     m.sgd_s_per_chunk, m.sgd_ns_per_float, m.busy_s_per_round);
    const std::pair<int, const char*> refs[] = {{kOldBare, "old_bare"}, {kRefNone, "ref_none"}, {kRefSgd, "ref_sgd"}};
    for (const auto& [v, name] : refs) {
      if (c.seconds[v].empty()) continue;
      j += fmt::format(",\n     \"{}\": {{\"round_s\": {}, \"round_s_median\": {:.6g}, \"gbs\": {}}}", name,
                       JsonList(c.seconds[v]), Median(c.seconds[v]), JsonList(c.gbs[v]));
    }
    j += i + 1 < cases.size() ? "},\n" : "}\n";
  }
  j += "  ]\n}\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) ThrowIfError(IoError("--json {}: cannot open for writing: {}", path, std::strerror(errno)));
  const bool ok = std::fwrite(j.data(), 1, j.size(), f) == j.size();
  if (std::fclose(f) != 0 || !ok) ThrowIfError(IoError("--json {}: write failed: {}", path, std::strerror(errno)));
  fmt::print("wrote {}\n", path);
}

// The grid's summary as a Markdown table (pasted into bench/RESULTS.md section 10).
void PrintPipelineTable(const std::vector<PipelineCase>& cases, const PipelineSetting& p) {
  if (p.service.link_gbps > 0) return PrintLinkTable(cases, p);
  fmt::print("\n| S | W | old bare s/round | ref none s/round | ref sgd s/round | {} s/round | downpour / ref sgd | "
             "ref none / old bare |\n| ---: | ---: | --- | --- | --- | --- | --- | --- |\n",
             VariantName(kDownpour, p));
  for (const PipelineCase& c : cases) {
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} |\n", c.servers, c.workers, MedianRange(c.seconds[kOldBare]),
               MedianRange(c.seconds[kRefNone]), MedianRange(c.seconds[kRefSgd]), MedianRange(c.seconds[kDownpour]),
               MedianRange(RateRatios(c.seconds[kDownpour], c.seconds[kRefSgd]), "{:.2f}"),
               MedianRange(RateRatios(c.seconds[kRefNone], c.seconds[kOldBare]), "{:.2f}"));
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace downpour::bench

int main(int argc, char** argv) {
  CLI::App app{"downpour parameter-service load benchmark (AlexNet-sized, loopback)"};
  downpour::cli::AddStandardFlags(&app, "downpour-bench-ps");
  // Ports from 23000 up: below Linux's ephemeral range (32768–60999), where another process's
  // outgoing connection can hold a port just as a run wants to bind it (seen at 47158).
  int servers = 2, workers = 1, rounds = 10, warmup = 2, port = 23000;
  int64_t chunk_elems = downpour::kDefaultChunkElems;
  bool grid = false, curve = false, security_grid = false, wal_grid = false;
  int repeats = 3;
  downpour::bench::WalSetting wal;
  downpour::bench::PipelineSetting pipeline;
  bool pipeline_grid = false, pipeline_one = false;
  std::string transport = "tcp", reference_transport = "tcp";
  std::string json_path;
  bool apply_grid = false;
  downpour::bench::ApplyScalingOptions apply;
  app.add_option("--servers", servers, "shard servers S")->check(CLI::Range(1, 64));
  app.add_option("--workers", workers, "synthetic workers W")->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "timed push+pull rounds per worker")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed rounds first")->check(CLI::Range(0, 1000));
  app.add_option("--chunk-elems", chunk_elems, "floats per chunk/frame")->check(CLI::Range(int64_t{1}, int64_t{1} << 28));
  app.add_option("--port", port, "first loopback port used")->check(CLI::Range(1024, 60000));
  app.add_flag("--grid", grid, "run (S,W) in {(1,1),(2,1),(2,2),(4,4)}");
  app.add_flag("--curve", curve, "run the parameter service with CurveZMQ (keys made in a temporary directory)");
  app.add_flag("--security-grid", security_grid,
               "at (S,W) in {(2,1),(4,4)}: plaintext vs CurveZMQ in alternating pairs, and bare ZeroMQ");
  app.add_option("--repeats", repeats,
                 "plaintext/CurveZMQ (or wal off/on) pairs per case of --security-grid / --wal-grid; interleaved "
                 "repeats of the four runs per case of --pipeline-grid / --pipeline")
      ->check(CLI::Range(1, 100));
  app.add_option("--transport", transport,
                 "how downpour's workers reach the shards: tcp (loopback), ipc (ipc:// sockets in a temporary "
                 "directory), shm (ipc:// plus PsClientOptions::shared_memory)")
      ->check(CLI::IsMember({"tcp", "ipc", "shm"}));
  app.add_option("--max-chunks-per-message", pipeline.service.max_chunks_per_message,
                 "PsClientOptions::max_chunks_per_message of downpour's workers (1 = one message per chunk, 0 = one "
                 "message per server)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--pipeline-grid", pipeline_grid,
               "at (S,W) in {(1,1),(2,1),(2,2),(4,4)}: old bare peer, pipelined reference (update none / sgd) and "
               "downpour, --repeats times interleaved, with median, range and ratios (--rounds / W timed rounds "
               "per worker, at least 3)");
  app.add_flag("--pipeline", pipeline_one, "the --pipeline-grid comparison for the one case --servers/--workers");
  app.add_option("--reference-transport", reference_transport,
                 "the pipelined reference over tcp (loopback, ps-lite's default) or ipc (ps-lite's DMLC_LOCAL)")
      ->check(CLI::IsMember({"tcp", "ipc"}));
  app.add_option("--link-gbps", pipeline.service.link_gbps,
                 "with --pipeline-grid / --pipeline: an emulated link of this many Gbit/s per shard server and per "
                 "worker (cluster.link_gbps); only downpour runs then")
      ->check(CLI::Validator(
          [](std::string& v) {
            double x = 0;
            try {
              x = std::stod(v);
            } catch (const std::exception&) {
            }
            return x > 0 && std::isfinite(x) ? std::string() : "must be a link speed > 0 in Gbit/s, got " + v;
          },
          "GBIT/S > 0"));
  app.add_option("--json", json_path, "with --pipeline-grid / --pipeline: write the results here as JSON (docs/emulated_links.md)");
  app.add_option("--server-threads", pipeline.service.server_threads,
                 "apply lanes of every shard (cluster.server_threads)")
      ->check(CLI::Range(1, downpour::kMaxServerThreads));
  app.add_option("--connections", pipeline.service.connections,
                 "each worker's connections per shard (cluster.connections_per_server)")
      ->check(CLI::Range(1, downpour::kMaxConnectionsPerServer));
  app.add_option("--inflight-mb", pipeline.service.inflight_mb,
                 "each worker connection's window in MiB (cluster.inflight_mb)")
      ->check(CLI::Range(1, downpour::kMaxInflightMb));
  app.add_option("--send-order", pipeline.service.send_order, "call | layer (cluster.send_order)")
      ->transform(CLI::CheckedTransformer(downpour::cli::NamedValues<downpour::SendOrder>(downpour::kSendOrderNames)));
  app.add_option("--io-threads", pipeline.service.io_threads, "ZeroMQ I/O threads of downpour's transports (cluster.io_threads)")
      ->check(CLI::Range(1, downpour::kMaxIoThreads));
  app.add_flag("--apply-grid", apply_grid,
               "one shard's apply throughput at each of --apply-threads, --workers pushers over the in-process "
               "transport, --rounds timed pushes each, --repeats interleaved");
  app.add_flag("--apply-sync", apply.sync, "with --apply-grid: consistency.mode = sync (each push, then the held pull)");
  app.add_option("--apply-threads", apply.threads, "with --apply-grid: the server_threads values, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, downpour::kMaxServerThreads));
  app.add_flag("--wal", wal.on, "run the shards with their write-ahead log on (checkpoint.wal)");
  app.add_flag("--wal-grid", wal_grid, "at (S,W) in {(2,1),(4,4)}: write-ahead log off vs on in alternating pairs");
  app.add_option("--wal-dir", wal.dir, "where the logs go (a temporary directory inside it, removed after each run)");
  app.add_option("--wal-fsync-ms", wal.fsync_ms, "checkpoint.wal_fsync_ms of the shards (0 = fsync before every ack)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--wal-io", wal.io,
                 "how the logs write: auto (O_DIRECT where the filesystem takes it), buffered, direct")
      ->transform(CLI::CheckedTransformer(downpour::cli::NamedValues<downpour::WalIo>(downpour::kWalIoNames)));
  if (const auto code = downpour::cli::Parse(app, argc, argv)) return *code;
  pipeline.service.transport = transport == "ipc"   ? downpour::bench::ServiceTransport::kIpc
                               : transport == "shm" ? downpour::bench::ServiceTransport::kShm
                                                    : downpour::bench::ServiceTransport::kTcp;
  pipeline.reference_ipc = reference_transport == "ipc";
  if ((pipeline.service.link_gbps > 0 || !json_path.empty()) && !pipeline_grid && !pipeline_one) {
    fmt::print(stderr, "downpour-bench-ps: {} needs --pipeline-grid or --pipeline\n",
               pipeline.service.link_gbps > 0 ? "--link-gbps" : "--json");
    return downpour::cli::kExitUsage;
  }
  if (pipeline.service.link_gbps > 0 && transport == "shm") {
    fmt::print(stderr, "downpour-bench-ps: --link-gbps with --transport shm: shared memory would bypass the emulated "
                       "link (use tcp or ipc)\n");
    return downpour::cli::kExitUsage;
  }
  try {
    fmt::print("model: AlexNet tensors, {} floats ({:.1f} MB) each way per round\n",
               downpour::TotalElements(downpour::AlexNetTensorSpecs()),
               downpour::TotalElements(downpour::AlexNetTensorSpecs()) * 4 / 1e6);
    if (apply_grid) {
      downpour::bench::PrintCeilings();
      apply.workers = workers;
      apply.pushes = rounds;
      apply.warmup = std::max(1, warmup);
      apply.repeats = repeats;
      apply.chunk_elems = chunk_elems;
      const int rc = downpour::bench::RunApplyScaling(apply);
      downpour::bench::PrintCeilings();
      return rc;
    }
    if (pipeline_grid || pipeline_one) {
      downpour::bench::PrintCeilings();
      std::vector<std::pair<int, int>> cases = {{1, 1}, {2, 1}, {2, 2}, {4, 4}};
      if (pipeline_one) cases = {{servers, workers}};
      std::vector<downpour::bench::PipelineCase> results;
      int p = port;
      for (auto [s, w] : cases) {
        // Every case moves about the same bytes (W workers share the machine): rounds / W per
        // worker, at least 3.
        const int case_rounds = pipeline_one ? rounds : std::max(3, (rounds + w - 1) / w);
        results.push_back(
            downpour::bench::RunPipelineCase(s, w, warmup, case_rounds, repeats, chunk_elems, &p, pipeline));
      }
      downpour::bench::PrintPipelineTable(results, pipeline);
      if (!json_path.empty()) downpour::bench::WritePipelineJson(json_path, results, pipeline, chunk_elems, repeats);
      downpour::bench::PrintCeilings();  // the load at the end, too
    } else if (wal_grid) {
      int p = port;
      for (auto [s, w] : {std::pair{2, 1}, {4, 4}}) {
        downpour::bench::RunWalCase(s, w, warmup, rounds, repeats, chunk_elems, p, wal);
        p += 200 + 20 * repeats;
      }
    } else if (security_grid) {
      int p = port;
      for (auto [s, w] : {std::pair{2, 1}, {4, 4}}) {
        downpour::bench::RunSecurityCase(s, w, warmup, rounds, repeats, chunk_elems, p);
        p += 200 + 20 * repeats;
      }
    } else if (grid) {
      int p = port;
      for (auto [s, w] : {std::pair{1, 1}, {2, 1}, {2, 2}, {4, 4}}) {
        downpour::bench::RunCase(s, w, warmup, rounds, chunk_elems, p, curve, wal, pipeline.service);
        p += 200;
      }
    } else {
      downpour::bench::RunCase(servers, workers, warmup, rounds, chunk_elems, port, curve, wal, pipeline.service);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "downpour-bench-ps: {}\n", e.what());
    return 1;
  }
  return 0;
}
