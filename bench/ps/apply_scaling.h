// apply_scaling.h — how a shard's apply throughput grows with its apply lanes
// (cluster.server_threads, server/apply_lanes.h), without a network in the way.
//
// One shard of the whole AlexNet model (S = 1) on the in-process transport; W workers (PsClient)
// push gradients as fast as the shard acknowledges them, each waiting for its push's ack before
// the next (so W pushes are in flight), no pulls. The shard validates every push whole (the
// finite check over server_threads threads too) and applies it with momentum SGD, as in a real
// run. Measured: floats applied per second of wall time over the timed pushes, at each thread
// count, `repeats` times interleaved (the order rotated every repeat); reported as the median
// and range, the speedup over one thread and its share of linear. The shard's machine is this
// one, workers included: a thread count above the free cores measures the oversubscription.
//
// Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <vector>

namespace downpour::bench {

struct ApplyScalingOptions {
  std::vector<int> threads = {1, 2, 4};  // cluster.server_threads values
  int workers = 4;
  int warmup = 1;    // untimed pushes per worker
  int pushes = 4;    // timed pushes per worker
  int repeats = 3;
  int64_t chunk_elems = 0;  // 0 = the layout's default
  bool verbose = true;      // per run: the loop's busy time and the lanes' time in the update rule
  // Sync (consistency.mode = sync): each worker pushes clock k, then pulls at k + 1, which the
  // shard holds until every worker's clock k is summed and applied. Floats per second then
  // count every worker's pushed gradient (W per update).
  bool sync = false;
};

// Prints the table; returns 0, or 1 after printing why a run failed.
int RunApplyScaling(const ApplyScalingOptions& options);

}  // namespace downpour::bench
