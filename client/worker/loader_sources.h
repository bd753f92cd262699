// loader_sources.h — TrainSource / TestSource over data/'s prefetching LMDB Loader.
//
// Training: the worker's slice (data.sharding = "slice": records j, j+W, ... of data.train)
// or its own LMDB ("own": <data.train>/<j>); a worker that joined a running job (j >= W) reads
// those of worker j mod W, shuffled in an order of its own; shuffled with a window, random crop / mirror /
// mean / scale from [data]; endless: batch s holds stream positions [s·N, (s+1)·N) across
// epoch boundaries, so every step has the net's batch size and SeekToStep(s) is exact.
// Test: data.test in key order, centre crop, in batches of `batch`; every evaluation
// re-opens the loader (Rewind), which keeps the stream deterministic.
//
// Ownership: each source owns its Loader. Thread-safety: one consumer thread.
#pragma once

#include <memory>

#include "client/worker/sources.h"
#include "common/run_config.h"

namespace downpour::worker {

// shuffle = false reads the shard in key order (reproducible runs). `num_classes` (the net's)
// makes a record whose label is outside 0..num_classes-1 an error naming its key.
// Slice sharding reads slice `slice` of `slices` of the shared LMDB; -1 / 0 = the worker's own
// slice, worker_id mod cluster.workers (a re-dealt slice: client/worker/reslicing_source.h).
// The shuffle seed always comes from worker_id.
Status OpenLoaderTrainSource(const RunConfig& config, int worker_id, bool shuffle, int num_classes,
                             std::unique_ptr<TrainSource>* out, int slice = -1, int slices = 0);
Status OpenLoaderTestSource(const RunConfig& config, int batch, int num_classes, std::unique_ptr<TestSource>* out);

}  // namespace downpour::worker
