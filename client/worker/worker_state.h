// worker_state.h — a worker's progress through its run, saved after every step so a stopped or
// crashed run can be resumed (downpour-launch --resume, downpour-worker --resume).
//
// File: <run-dir>/state/worker-<id>.toml, small TOML written atomically (temporary file +
// rename, no fsync: it must survive the process being killed, not the machine losing power):
//   step = 1200        steps done (the next step is `step`)
//   clock = 1200       pushes completed
//   images = 76800     images trained on
//   epoch = 2          epoch of the last batch
//   wall_s = 41.5      training wall time so far (evaluations included), across resumes
//   eval_s = 3.2       of which evaluating
//   finished = false   every planned step done (the final evaluation may still be pending)
// The data position is not stored: the stream is a pure function of (seed, shard, step)
// (TrainSource::SeekToStep), and dropout masks of (seed, step) (engine::Net::set_step).
// Not saved: gradients accumulated towards a push (worker.push_every > 1) — the first push
// after a resume averages only the steps taken since the resume.
//
// Thread-safety: free functions; one writer per file (the worker's training thread).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace downpour::worker {

struct WorkerProgress {
  int64_t step = 0;
  int64_t clock = 0;
  int64_t images = 0;
  int epoch = 0;
  double wall_s = 0;
  double eval_s = 0;
  bool finished = false;
  bool operator==(const WorkerProgress&) const = default;
};

// <run_dir>/state/worker-<id>.toml
std::string WorkerStatePath(const std::string& run_dir, int worker_id);

// Atomic write (the directory must exist); errors name the path.
Status WriteWorkerProgress(const std::string& path, const WorkerProgress& progress);
// Reads and validates; a missing file is kNotFound, a malformed one kCorrupt naming the field.
Status ReadWorkerProgress(const std::string& path, WorkerProgress* out);

}  // namespace downpour::worker
