// worker_app.h — one worker process, assembled from the run configuration: the net (engine),
// its data (LMDB loader, or IDX files), the parameter service (PsClient over ZeroMQ), the
// Trainer, the metrics file and the progress line. `downpour-worker` is a thin main over it.
//
// Run directory: this process writes
//   <run-dir>/metrics/worker-<id>.jsonl   start / step / eval / server_stats / ps_acks / done
//                                         records (appended to: a resumed worker continues the
//                                         file); ps_acks, one per server: the gradient push
//                                         messages that server acknowledged to this worker (each
//                                         once, resends included), messages resent, restarts seen
//   <run-dir>/state/worker-<id>.toml      its progress after every step (worker_state.h)
//   <run-dir>/model_final.dpt             final weights (the evaluating worker; tensor file)
// and reads <run-dir>/config.toml unless --config says otherwise. With --resume it continues
// from its saved progress (and, in sync mode, from the servers' clock).
//
// Data: data.train / data.test name LMDBs; a path ending in "idx3-ubyte" or
// "idx3-ubyte.gz" is read as an IDX image file instead (its labels file is the same name with
// "images-idx3" → "labels-idx1"), which lets runs use Debian's Fashion-MNIST files directly.
//
// Server restarts: requests wait for a server that does not answer up to cluster.server_wait_ms
// (saying "server i unreachable for N s"), then resend what was not acknowledged
// (client/ps/ps_client.h); a server may hold a sync/ssp pull for PullWait on top of that.
//
// Joining a running job (elastic): a worker started by hand with --coordinator and an id from
// cluster.workers up to cluster.max_workers-1, or -1 (the coordinator assigns one), joins the
// servers' job. It reads the data slice of worker id mod workers (in slice mode; "own" mode:
// that worker's LMDB) in an order of its own; it never evaluates (only worker 0 does); in sync
// mode it starts at the servers' current clock, as a resumed worker does, and runs the steps
// left to the run's end.
//
// Thread-safety: RunWorker is reentrant (no globals); it owns everything it builds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/worker/trainer.h"
#include "common/process_net.h"
#include "common/run_config.h"
#include "common/status.h"

namespace downpour::worker {

struct WorkerArgs {
  // Worker id, 0 .. cluster.workers-1; up to max_workers-1 for one joining a running job;
  // -1 = the coordinator assigns one (a joiner; with `local`: 0).
  int id = 0;
  std::string config_path;      // run config; default <run_dir>/config.toml
  std::vector<std::string> sets;  // --set section.key=value overrides of the run config
  std::string run_dir = ".";    // where metrics and the model go
  bool quiet = false;           // no progress line (CI logs)
  bool local = false;           // single-process reference run: no servers, local SGD
  int64_t steps_override = 0;   // > 0: replaces worker.steps (tests, smoke runs)
  bool shuffle = true;          // false: read the shard in record order (reproducible tests)
  int step_delay_ms = 0;        // > 0: sleep this long after every step (emulates a straggler)
  bool resume = false;          // continue from <run_dir>/state/worker-<id>.toml (worker_state.h)
  // Async/ssp runs with pull_every = push_every = 1 pull the next step's weights layer by layer
  // during backward (trainer.h, "Overlapped pulls"); false (--no-overlap): one blocking pull
  // at the start of each step, as sync runs always do.
  bool overlap = true;
  // --bind (source address of its connections), --coordinator; "" = from the run config
  // (common/process_net.h).
  NetFlags net;
};

// The model's learnable tensors (model.config of the run config at `config_path`, with the
// `sets` overrides) as a tensor list (common/layout.h ParseTensorList format), for servers'
// --tensors. A multi-model config ([[models]]) gets every model's list instead, written beside
// `out_path` as tensors-model-<k>.txt (common/layout.h ModelTensorListPath).
Status WriteTensorList(const std::string& config_path, const std::vector<std::string>& sets,
                       const std::string& out_path);

// Runs the worker to completion. `result` receives the loop's result (may be null).
// `*started` (may be null) turns true once the config, the net, the data and the metrics are
// set up: an error before that is bad input (exit 2), after it a runtime failure (exit 1).
Status RunWorker(const WorkerArgs& args, TrainResult* result, bool* started = nullptr);

// `downpour-test`: a saved model evaluated on a test set, like `caffe test`.
struct TestArgs {
  std::string config_path;        // run config: model.config, data.test and its preprocessing
  std::vector<std::string> sets;  // --set overrides of it
  std::string weights;            // tensor file or .caffemodel (every model tensor must be there)
  std::string data;               // test LMDB / IDX file instead of data.test ("" = data.test)
  int batch = 100;                // images per forward pass
  int max_batches = 0;            // 0 = the whole test set
};
struct TestResult {
  EvalRecord eval;          // images, loss, top1, top5
  std::string model, data;  // what was evaluated, for the report
};
Status TestSavedModel(const TestArgs& args, TestResult* result);

// "…/train-images-idx3-ubyte.gz" → true (and the matching labels path).
bool IsIdxImagePath(const std::string& path, std::string* labels_path);

}  // namespace downpour::worker
