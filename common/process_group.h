// process_group.h — a group of child processes run as one job (the launcher's engine).
//
// Each child runs in its own process group (so a signal to it reaches everything it spawned)
// with PR_SET_PDEATHSIG, so it gets SIGTERM if the launcher dies without cleaning up. Its
// stdout and stderr share one pipe; the group forwards every line, prefixed "[<name>] ", to
// an output sink (default: this process's stdout) and, raw, to the child's log file.
//
// Run() ends the job:
//   * success: every "primary" child (the workers) exited 0 → the others (coordinator,
//     servers) get SIGTERM, then SIGKILL after the grace period; returns 0. With no
//     primaries, the job is done when every child has exited 0.
//   * failure: the first child that exits non-zero (or dies of a signal) before it was asked
//     to stop → all others are stopped the same way; returns that child's exit code (128+sig
//     for a signal).
//   * SIGINT/SIGTERM to this process (handle_signals) → all stopped; returns 128+signo.
//   * timeout (if set) → all stopped; returns 124.
// When a child exits, whatever is left in its process group is killed, so nothing the job
// started outlives it.
//
// Thread-safety: not thread-safe; construct, Start and Run on one thread. With
// handle_signals the constructor blocks SIGINT/SIGTERM in the calling thread (the destructor
// restores the mask), so other threads of the process must block them too. The group owns
// its children: the destructor SIGKILLs and reaps any still running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <signal.h>

#include "common/status.h"

namespace downpour {

struct ChildSpec {
  std::string name;               // shown as "[name] " before each output line, e.g. "server 1"
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH
  std::string log_path;           // "" = no log file; else raw output lines are appended here
  bool primary = false;           // the job succeeds once every primary child exited 0
};

struct ProcessGroupOptions {
  std::chrono::milliseconds grace_period{5000};  // between SIGTERM and SIGKILL when stopping
  std::chrono::milliseconds timeout{0};          // 0 = no limit; else stop all and return 124
  bool handle_signals = true;  // SIGINT/SIGTERM to this process stop the job (see above)
  // Receives each prefixed line (no trailing newline). Default: stdout, flushed per line.
  std::function<void(std::string_view line)> output;
};

struct ChildResult {
  std::string name;
  pid_t pid = -1;
  bool exited = false;       // reaped
  int exit_code = -1;        // if it exited normally
  int term_signal = 0;       // if a signal killed it
  bool stopped_by_us = false;  // it was still running when the job was being stopped
  // 0 for a clean exit; else its exit code, or 128 + signal.
  int Code() const { return term_signal ? 128 + term_signal : exit_code; }
};

class ProcessGroup {
 public:
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Spawns a child. Errors (no such program, log file not writable) name the child and the
  // program, and leave no process behind.
  Status Start(const ChildSpec& spec);

  // Runs until the job ends (see the header comment) and every child is reaped; returns the
  // job's exit code.
  int Run();

  // One entry per started child, in start order; complete after Run().
  const std::vector<ChildResult>& results() const { return results_; }
  // Why the job ended, for a last log line: "all primaries exited 0", "worker 1 exited with
  // code 3", "received signal 2", "timeout after 5000 ms".
  const std::string& reason() const { return reason_; }

 private:
  struct Child;
  void Emit(const std::string& name, std::string_view line);
  void DrainOutput(Child& c, bool eof_expected);
  void ReapExited();
  void BeginStop(std::string reason, int code);
  void SignalLive(int sig);
  bool AllReaped() const;

  ProcessGroupOptions options_;
  std::vector<std::unique_ptr<Child>> children_;  // parallel to results_
  std::vector<ChildResult> results_;
  int signal_fd_ = -1;
  sigset_t old_mask_{};
  bool stopping_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
  std::string reason_;
  std::chrono::steady_clock::time_point kill_at_{};
};

}  // namespace downpour
