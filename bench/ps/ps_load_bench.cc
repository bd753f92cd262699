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
// --wal runs the shards with their write-ahead log on (server/wal.h: every push appended to
// <--wal-dir>/server-<i>.wal before it is applied and acknowledged, fsynced every
// --wal-fsync-ms; no periodic checkpoints, so the log only grows: about (warmup + rounds) × W ×
// 244 MB per run, removed after the run). --wal-grid measures its cost like --security-grid:
// at (S,W) in {(2,1),(4,4)}, `--repeats` pairs of runs with the log off and on, alternating
// which goes first.
//
//   downpour-bench-ps --servers 2 --workers 1 --rounds 10 [--curve] [--wal]
//   downpour-bench-ps --grid            # (S,W) in {(1,1),(2,1),(2,2),(4,4)}
//   downpour-bench-ps --security-grid --repeats 3
//   downpour-bench-ps --wal-grid --repeats 3 [--wal-dir /fast/disk] [--wal-fsync-ms 200]
#include <fmt/core.h>
#include <stdlib.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "bench/ps/bare_zmq.h"
#include "client/ps/ps_client.h"
#include "common/cli.h"
#include "common/layout.h"
#include "common/security.h"
#include "common/status.h"
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
};

// The write-ahead log of a run: off, or on in a fresh directory under `dir` (removed after).
struct WalSetting {
  bool on = false;
  std::string dir = "/tmp";
  int fsync_ms = 200;
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
                             const BenchKeys& keys, const WalSetting& wal = {}) {
  const int servers = layout.servers();
  const WalDir wal_dir(wal);
  ZmqOptions server_options;
  server_options.curve = keys.server();
  ZmqTransport server_transport(server_options);
  std::vector<std::unique_ptr<ShardServer>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < servers; ++s) {
    ShardOptions o;
    o.server_id = s;
    o.expected_workers = workers;
    o.solver.base_lr = 1e-6f;  // any finite step: the work per update is what matters
    o.solver.momentum = 0.9f;
    o.solver.weight_decay = 5e-4f;
    o.access.keyed = keys.on();  // keyed: pushes and pulls only from "worker" keys, as in a real run
    if (!wal_dir.path().empty()) {
      o.wal_path = fmt::format("{}/server-{}.wal", wal_dir.path(), s);
      o.wal_fsync_ms = std::chrono::milliseconds(wal.fsync_ms);
    }
    std::unique_ptr<ShardServer> shard;
    ThrowIfError(ShardServer::Create(layout, o, &shard));
    std::string address = fmt::format("tcp://127.0.0.1:{}", base_port + s);
    std::unique_ptr<ServerEndpoint> ep;
    ThrowIfError(server_transport.Bind(address, &ep));
    shard->Start(std::move(ep));
    shards.push_back(std::move(shard));
    addresses.push_back(address);
  }

  const auto n = static_cast<size_t>(layout.total_elems());
  std::atomic<int> at_start{0};
  std::atomic<int> init_done{0};
  std::chrono::steady_clock::time_point t0, t1;
  double cpu0 = 0;
  std::vector<std::thread> threads;
  std::vector<Status> worker_status(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto run = [&]() -> Status {
        ZmqOptions client_options;
        client_options.curve = keys.worker();
        ZmqTransport transport(client_options);
        PsClientOptions co;
        co.server_addresses = addresses;
        co.worker_id = w;
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
            t0 = std::chrono::steady_clock::now();
            cpu0 = ProcessCpuSeconds();
          }
          RequestId push = client->Push(grads, r);
          RequestId pull = client->Pull(weights, r + 1);
          DP_RETURN_IF_ERROR(client->Wait(push, 120s));
          DP_RETURN_IF_ERROR(client->Wait(pull, 120s));
        }
        return Status::Ok();
      };
      worker_status[static_cast<size_t>(w)] = run();
    });
  }
  for (auto& t : threads) t.join();
  t1 = std::chrono::steady_clock::now();
  const double cpu1 = ProcessCpuSeconds();
  for (const Status& s : worker_status) ThrowIfError(s);

  PsResult result;
  for (auto& shard : shards) {
    ShardStatsWire st = shard->Stats();
    result.applied += st.pushes_applied;
    result.received += st.pushes_received;
    result.rejected += st.pushes_rejected;
    result.wal_records += st.wal_records;
    shard->Stop();
    ThrowIfError(shard->Join());
  }
  result.seconds = std::chrono::duration<double>(t1 - t0).count();
  result.cpu_seconds = cpu1 - cpu0;
  result.bytes_moved = 2.0 * static_cast<double>(n) * sizeof(float) * workers * rounds;
  return result;
}

ParamLayout AlexNetLayout(int servers, int64_t chunk_elems) {
  ParamLayout layout;
  ThrowIfError(ParamLayout::Build(AlexNetTensorSpecs(), servers, chunk_elems, &layout));
  return layout;
}

void RunCase(int servers, int workers, int warmup, int rounds, int64_t chunk_elems, int port, bool curve,
             const WalSetting& wal) {
  const ParamLayout layout = AlexNetLayout(servers, chunk_elems);
  std::vector<std::vector<int64_t>> frames(static_cast<size_t>(servers));
  for (const Chunk& c : layout.chunks()) frames[static_cast<size_t>(c.server)].push_back(c.count);

  BareResult bare = RunBareZmq(frames, workers, warmup, rounds, port);
  BenchKeys keys(curve);
  PsResult ps = RunParameterService(layout, workers, warmup, rounds, port + 100, keys, wal);

  const double gb = 1e9;
  const double bare_gbs = bare.bytes_moved / bare.seconds / gb;
  const double ps_gbs = ps.bytes_moved / ps.seconds / gb;
  fmt::print(
      "S={} W={} chunks={}{} | downpour: {:.2f} rounds/s/worker {:.2f} GB/s | bare zmq: {:.2f} "
      "rounds/s/worker {:.2f} GB/s | ratio {:.0f}% | pushes recv/applied/rejected {}/{}/{}{}\n",
      servers, workers, layout.num_chunks(), curve ? " curve" : "", rounds / ps.seconds, ps_gbs, rounds / bare.seconds,
      bare_gbs, 100.0 * ps_gbs / bare_gbs, ps.received, ps.applied, ps.rejected,
      wal.on ? fmt::format(" | wal records {} (fsync {} ms)", ps.wal_records, wal.fsync_ms) : "");
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
                 "log records {}\n",
                 servers, workers, r + 1, on ? "wal on" : "wal off", gbs[i], rounds / ps.seconds, cpu_per_gb[i],
                 ps.applied, ps.wal_records);
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

}  // namespace
}  // namespace downpour::bench

int main(int argc, char** argv) {
  CLI::App app{"downpour parameter-service load benchmark (AlexNet-sized, loopback)"};
  downpour::cli::AddStandardFlags(&app, "downpour-bench-ps");
  int servers = 2, workers = 1, rounds = 10, warmup = 2, port = 47000;
  int64_t chunk_elems = downpour::kDefaultChunkElems;
  bool grid = false, curve = false, security_grid = false, wal_grid = false;
  int repeats = 3;
  downpour::bench::WalSetting wal;
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
  app.add_option("--repeats", repeats, "plaintext/CurveZMQ (or wal off/on) pairs per case of --security-grid / --wal-grid")
      ->check(CLI::Range(1, 100));
  app.add_flag("--wal", wal.on, "run the shards with their write-ahead log on (checkpoint.wal)");
  app.add_flag("--wal-grid", wal_grid, "at (S,W) in {(2,1),(4,4)}: write-ahead log off vs on in alternating pairs");
  app.add_option("--wal-dir", wal.dir, "where the logs go (a temporary directory inside it, removed after each run)");
  app.add_option("--wal-fsync-ms", wal.fsync_ms, "checkpoint.wal_fsync_ms of the shards (0 = fsync before every ack)")
      ->check(CLI::Range(0, 1000000));
  if (const auto code = downpour::cli::Parse(app, argc, argv)) return *code;
  try {
    fmt::print("model: AlexNet tensors, {} floats ({:.1f} MB) each way per round\n",
               downpour::TotalElements(downpour::AlexNetTensorSpecs()),
               downpour::TotalElements(downpour::AlexNetTensorSpecs()) * 4 / 1e6);
    if (wal_grid) {
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
        downpour::bench::RunCase(s, w, warmup, rounds, chunk_elems, p, curve, wal);
        p += 200;
      }
    } else {
      downpour::bench::RunCase(servers, workers, warmup, rounds, chunk_elems, port, curve, wal);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "downpour-bench-ps: {}\n", e.what());
    return 1;
  }
  return 0;
}
