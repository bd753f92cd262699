#include "bench/ps/apply_scaling.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/ps/ps_client.h"
#include "common/inproc_transport.h"
#include "common/layout.h"
#include "server/shard.h"

namespace downpour::bench {
namespace {

using namespace std::chrono_literals;

// One run: floats applied per second over the timed pushes, or a negative value after printing
// the failure.
double ApplyRate(const ParamLayout& layout, int threads, const ApplyScalingOptions& o) {
  InprocTransport transport;
  ShardOptions so;
  so.cluster.workers = o.workers;
  so.cluster.server_threads = threads;
  so.solver.base_lr = 1e-6f;  // any finite step; the work per update is what is measured
  so.solver.momentum = 0.9f;
  so.solver.weight_decay = 5e-4f;
  if (o.sync) so.consistency.mode = ConsistencyMode::kSync;
  std::unique_ptr<ShardServer> shard;
  Status s = ShardServer::Create(layout, so, &shard);
  std::unique_ptr<ServerEndpoint> ep;
  if (s.ok()) s = transport.Bind("apply-scaling", &ep);
  if (!s.ok()) {
    fmt::print(stderr, "apply scaling: {}\n", s.ToString());
    return -1;
  }
  const std::string address = ep->address();
  shard->Start(std::move(ep));
  const auto n = static_cast<size_t>(layout.total_elems());
  std::atomic<int> ready{0}, failed{0};
  std::atomic<bool> go{false}, initialized{false};
  std::vector<std::chrono::steady_clock::time_point> starts(static_cast<size_t>(o.workers)),
      ends(static_cast<size_t>(o.workers));
  std::vector<std::thread> workers;
  for (int w = 0; w < o.workers; ++w) {
    workers.emplace_back([&, w] {
      PsClientOptions co;
      co.server_addresses = {address};
      co.worker_id = w;
      std::unique_ptr<PsClient> client;
      Status st = PsClient::Create(&transport, layout, co, &client);
      if (st.ok()) st = client->Connect(30s);
      const std::vector<float> grads(n, 1e-3f);
      std::vector<float> pulled(o.sync ? n : 0);
      // Async: pushes alone. Sync: a push, then the pull the shard holds until the clock is applied.
      auto step = [&](int k) -> Status {
        DP_RETURN_IF_ERROR(client->Wait(client->Push(grads, k), 120s));
        if (o.sync) DP_RETURN_IF_ERROR(client->Wait(client->Pull(pulled, k + 1), 120s));
        return Status::Ok();
      };
      if (st.ok() && w == 0) st = client->Wait(client->PushInit(std::vector<float>(n, 0.01f)), 120s);
      if (w == 0) initialized = true;  // the others push gradients once the weights are there
      while (!initialized.load()) std::this_thread::sleep_for(100us);
      for (int k = 0; st.ok() && k < o.warmup; ++k) st = step(k);
      ++ready;
      while (!go.load()) std::this_thread::sleep_for(100us);
      starts[static_cast<size_t>(w)] = std::chrono::steady_clock::now();
      for (int k = 0; st.ok() && k < o.pushes; ++k) st = step(o.warmup + k);
      ends[static_cast<size_t>(w)] = std::chrono::steady_clock::now();
      if (!st.ok()) {
        fmt::print(stderr, "apply scaling: worker {}: {}\n", w, st.ToString());
        ++failed;
      }
    });
  }
  while (ready.load() < o.workers) std::this_thread::sleep_for(1ms);
  const int64_t updates0 = shard->updates();
  const ShardStatsWire stats0 = shard->Stats();
  const uint64_t lane_wait0 = shard->lane_wait_ns();
  go = true;
  for (auto& t : workers) t.join();
  const ShardStatsWire stats1 = shard->Stats();
  const uint64_t lane_wait1 = shard->lane_wait_ns();
  shard->Stop();
  const Status joined = shard->Join();
  if (failed.load() > 0 || !joined.ok()) return -1;
  const auto t0 = *std::min_element(starts.begin(), starts.end());
  const auto t1 = *std::max_element(ends.begin(), ends.end());
  const double seconds = std::chrono::duration<double>(t1 - t0).count();
  const int64_t chunk_updates = shard->updates() - updates0;
  // Async: every timed push updates every chunk once. Sync: every timed push is summed, and each
  // clock's W pushes make one update.
  const double pushes = static_cast<double>(chunk_updates) / static_cast<double>(layout.num_chunks()) *
                        (o.sync ? static_cast<double>(o.workers) : 1.0);
  const double floats = pushes * static_cast<double>(n);
  if (o.verbose) {
    fmt::print("    wall {:.3f} s: loop busy {:.3f} s (of which {:.3f} s waiting for a full lane), update rule {:.3f} s "
               "over the lanes (wall time, preemption included)\n",
               seconds, 1e-9 * static_cast<double>(stats1.busy_ns - stats0.busy_ns),
               1e-9 * static_cast<double>(lane_wait1 - lane_wait0), 1e-9 * static_cast<double>(stats1.sgd_ns - stats0.sgd_ns));
  }
  return floats / seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int RunApplyScaling(const ApplyScalingOptions& o) {
  ParamLayout layout;
  const Status built = ParamLayout::Build(AlexNetTensorSpecs(), 1, o.chunk_elems > 0 ? o.chunk_elems : kDefaultChunkElems,
                                          &layout);
  if (!built.ok()) {
    fmt::print(stderr, "apply scaling: {}\n", built.ToString());
    return 1;
  }
  fmt::print("apply scaling: one shard of {} floats in {} chunks, {} workers pushing (in-process transport), "
             "{} timed pushes each, momentum SGD, {}; threads {}\n",
             layout.total_elems(), layout.num_chunks(), o.workers, o.pushes,
             o.sync ? "sync (each push then the held pull)" : "async", fmt::join(o.threads, ", "));
  std::vector<std::vector<double>> rates(o.threads.size());
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t i = 0; i < o.threads.size(); ++i) {
      const size_t at = (i + static_cast<size_t>(r)) % o.threads.size();  // rotated every repeat
      const double rate = ApplyRate(layout, o.threads[at], o);
      if (rate < 0) return 1;
      rates[at].push_back(rate);
      fmt::print("  repeat {} threads {}: {:.2f} Gfloat/s\n", r + 1, o.threads[at], rate / 1e9);
      std::fflush(stdout);
    }
  }
  const double base = Median(rates[0]);
  fmt::print("\n| server_threads | Gfloat/s applied, median [range] | speedup over {} | share of linear |\n",
             o.threads[0]);
  fmt::print("| ---: | --- | ---: | ---: |\n");
  for (size_t i = 0; i < o.threads.size(); ++i) {
    const double m = Median(rates[i]);
    const auto [lo, hi] = std::minmax_element(rates[i].begin(), rates[i].end());
    const double speedup = m / base;
    fmt::print("| {} | {:.2f} [{:.2f}–{:.2f}] | {:.2f}× | {:.2f} |\n", o.threads[i], m / 1e9, *lo / 1e9, *hi / 1e9,
               speedup, speedup * o.threads[0] / o.threads[i]);
  }
  return 0;
}

}  // namespace downpour::bench
