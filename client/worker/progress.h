// progress.h — the live one-line progress of a worker: epoch, step, images/s, loss, ETA.
//
// FormatProgress() is a pure function (tested). ProgressReporter throttles it: on a
// terminal it rewrites one line in place ("\r") at most every `interval_s`; on a pipe or
// file (CI logs) it prints a plain line at most every `log_interval_s`; quiet mode prints
// nothing (the JSONL metrics still carry everything).
//
// Thread-safety: none; one reporter per worker, used on the training thread. Does not own
// the FILE* it writes to.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace downpour::worker {

struct ProgressState {
  int worker_id = 0;
  int epoch = 0;            // epoch of the current batch (0-based)
  int64_t step = 0;         // steps done
  int64_t total_steps = 0;  // steps planned (for ETA); <= 0 = unknown
  double images_per_s = 0;  // recent throughput
  double loss = 0;          // recent (smoothed) training loss
  double elapsed_s = 0;     // since training started
};

// "w0 epoch 1 step 120/900 (13%) 812 img/s loss 0.4321 eta 1m05s"
std::string FormatProgress(const ProgressState& p);
// "1h02m03s", "4m05s", "7s"; negative or non-finite → "?".
std::string FormatDuration(double seconds);

class ProgressReporter {
 public:
  enum class Mode { kAuto, kQuiet };
  // interval_s: in-place refresh period on a terminal; log_interval_s: plain-line period
  // otherwise. Defaults: 0.5 s and 10 s.
  ProgressReporter(std::FILE* out, Mode mode, double interval_s = 0.5, double log_interval_s = 10.0);
  // Shows `p` if its period has passed (or `force`).
  void Update(const ProgressState& p, bool force = false);
  // Prints a full line (e.g. an evaluation result) without garbling the in-place line.
  void Note(const std::string& line);
  // Ends the in-place line with a newline (call once at the end).
  void Finish();

 private:
  std::FILE* out_;
  bool quiet_;
  bool tty_;
  double interval_s_;
  std::chrono::steady_clock::time_point last_;
  bool shown_ = false;
  bool line_open_ = false;
};

}  // namespace downpour::worker
