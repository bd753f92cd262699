// run_dir.h — what downpour-launch checks about a run before it starts any process: that a new
// run gets a directory of its own, that every input the run config names is there, and how a
// stopped run is resumed, and where a server's checkpoint and write-ahead log live.
//
// Every check names the file, the config key and what to do, and runs before any process
// starts, so a mistake costs seconds, not a job that dies after its servers came up.
//
// Thread-safety: free functions over the file system; no shared state.
#pragma once

#include <string>
#include <vector>

#include "common/run_config.h"
#include "common/status.h"

namespace downpour {

// A new run may use `run_dir` only if it does not exist yet or is an empty directory: a run
// directory is never reused silently (its JSONL would be appended to and its checkpoints
// overwritten). A directory that holds a run (config.toml) is kFailedPrecondition pointing to
// --resume.
Status CheckRunDirIsNew(const std::string& run_dir);

// A task of a cluster job (server/cluster_env.h) writes only its own files in a run directory
// that other tasks share or have already started: it is refused only when its own files —
// logs/<stem>.log, metrics/<stem>.jsonl, launch-<stem>.jsonl (stem "server-2") — are there
// already (kFailedPrecondition naming the file), or when `run_dir` is a file.
Status CheckTaskFilesAreNew(const std::string& run_dir, const std::string& stem);

// Where a run's settings came from, to name in an error: the config file, or "--set" for a key
// that one of `sets` ("section.key=value") overrides.
struct ConfigSource {
  ConfigSource(std::string config_file, std::vector<std::string> set_flags = {})
      : file(std::move(config_file)), sets(std::move(set_flags)) {}
  ConfigSource(const char* config_file) : file(config_file) {}
  std::string Of(std::string_view key) const;
  std::string file;
  std::vector<std::string> sets;
};

// Every input `config` names exists and is of the right kind: data.train and data.test (an
// LMDB directory with data.mdb, or a Fashion-MNIST/MNIST IDX images file; with data.sharding =
// "own", <data.train>/shard_<j>_of_<W> or <data.train>/<j> for each worker j), data.mean_file, model.config and
// model.weights. Errors name the key and where it was set (`source`). Paths are relative to the
// current directory, as the processes the launcher starts see them.
Status CheckRunInputs(const RunConfig& config, const ConfigSource& source);

// The inputs one task of a cluster job reads: a worker (id `worker_id`) what CheckRunInputs
// checks, except that with data.sharding = "own" it needs only its own partition on its host
// (every partition when it is a multi-model run's independent baseline, whose jobs read them
// all); a coordinator or server only the model configs (for the tensor lists), so data need not
// be on their hosts.
Status CheckTaskInputs(const RunConfig& config, const ConfigSource& source, bool worker, int worker_id = 0);

// How to resume the run in `run_dir` (whose config.toml is `config`). The servers restart with
// --recover, which restores the checkpoint (if any) and replays the write-ahead log after it.
struct ResumePlan {
  std::vector<std::string> checkpoints;  // per server: its checkpoint, "" when it has none yet
  std::vector<std::string> wals;         // per server: its write-ahead log, "" when it has none
  // No process of the run ever started (launch.jsonl has no "start" record, and no server or
  // worker saved anything): a --dry-run's directory. Resuming it starts it from the beginning.
  bool never_started = false;
};
// A run that never started gets never_started. Otherwise refuses a run that finished (its
// launch.jsonl ends with exit code 0), a run that saved nothing (checkpoint.every_updates = 0 and
// checkpoint.wal = false) and a run where a server has neither a checkpoint nor a write-ahead log
// (<checkpoint>.wal beside it) yet; otherwise fills `plan`. Errors are kFailedPrecondition
// naming the run, the missing files and the reason, and what to do instead.
Status PlanResume(const std::string& run_dir, const RunConfig& config, ResumePlan* plan);

// True when nothing of the run's processes was saved in `run_dir`: no server's checkpoint or
// write-ahead log, no worker's progress (state/).
bool RunSavedNothing(const std::string& run_dir, const RunConfig& config);

// <run_dir>/<checkpoint.dir>/server-<i>.dpt (checkpoint.dir may be absolute); model k > 0 of a
// multi-model run: server-<i>.model-<k>.dpt.
std::string ServerCheckpointPath(const std::string& run_dir, const CheckpointConfig& checkpoint, int server,
                                 int model = 0);
// <run_dir>/<checkpoint.dir>/server-<i>.wal (model k > 0: server-<i>.model-<k>.wal): the shard's
// write-ahead log (server/wal.h), beside its checkpoint; downpour-server --recover replays it.
std::string ServerWalPath(const std::string& run_dir, const CheckpointConfig& checkpoint, int server, int model = 0);

}  // namespace downpour
