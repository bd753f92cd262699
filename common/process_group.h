// process_group.h — a group of child processes run as one supervised job (the launcher's engine).
//
// Each child runs in its own process group (so a signal to it reaches everything it spawned)
// with PR_SET_PDEATHSIG, so it gets SIGTERM if the launcher dies without cleaning up. Its
// stdout and stderr share one pipe; the group forwards every line, prefixed "[<name>] ", to
// an output sink (default: this process's stdout) and, raw, to the child's log file.
//
// Supervision. A child "dies" when it exits non-zero or is killed by a signal while the job is
// not being stopped. Its ChildSpec decides what happens (a child that exits 0 is never
// restarted):
//   * restart: while it has restarts left (max_restarts), it is started again with
//     restart_argv after a short backoff (200 ms, 400 ms, 800 ms, then 1 s each), under the
//     same name, output prefix and log file (appended to);
//   * then, with no restart left, on_death: kFail stops the job (every other child is
//     stopped; the job's exit code is this child's), kContinue gives the child up and the job
//     goes on without it.
// Each death prints one line naming the child, how it died and what was done, e.g.
//   [launch] server 1 was killed by signal 9 (Killed) after 12.3 s; restarting it with --recover (restart 1 of 3)
//   [launch] worker 1 exited with code 3 after 4.0 s; the job goes on without it (cluster.restart_workers = 0)
//   [launch] server 1 exited with code 1 after 0.2 s; it died a 4th time (limit cluster.server_restarts = 3); stopping all
// and each restart one more, "[launch] server 1 restarted (restart 1 of 3, pid 4242)";
// options.on_event receives the same as ChildEvent values (downpour-launch writes them to
// launch.jsonl).
//
// Run() ends the job:
//   * done: no primary child (the workers; every child when none is marked primary) is running
//     or waiting for its restart — each exited 0 or was given up. The job succeeds (0) if at
//     least options.min_succeeded of them exited 0; else it fails with the exit code of the
//     last one given up. The other children (coordinator, servers) then get SIGTERM, and
//     SIGKILL after the grace period.
//   * cannot finish: every primary but the followers was given up and none exited 0 → all
//     stopped; returns the exit code of the last one given up.
//   * run over: an ends_run child exited 0 and the others are still running run_over_grace
//     later → they are stopped; returns 0 when min_succeeded primaries exited 0, else 1.
//   * a death with no restart left under kFail → all others are stopped the same way; returns
//     that child's exit code (128+sig for a signal).
//   * SIGINT/SIGTERM to this process (handle_signals) → all stopped; returns 128+signo.
//   * timeout (if set) → all stopped; returns 124.
// Stopping never restarts anything: a child waiting for its restart when the job ends stays
// down, and children that exit while being stopped are not deaths.
// When a child exits, whatever is left in its process group is killed, so nothing the job
// started outlives it.
//
// Thread-safety: not thread-safe; construct, Start and Run on one thread (on_event and output
// are called on it). With handle_signals the constructor blocks SIGINT/SIGTERM in the calling
// thread (the destructor restores the mask), so other threads of the process must block them
// too. The group owns its children: the destructor SIGKILLs and reaps any still running.
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

// What a death does once a child has no restart left (see the header comment).
enum class OnDeath {
  kFail,      // stop the job; its exit code is this child's
  kContinue,  // give the child up; the job goes on without it
};

struct ChildSpec {
  std::string name;               // shown as "[name] " before each output line, e.g. "server 1"
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH
  std::string log_path;           // "" = no log file; else raw output lines are appended here
  bool primary = false;           // the job is done once every primary exited 0 or was given up
  // A primary that finishes after the others (the evaluator's final evaluation): once every
  // other primary is given up with none exited 0 it would wait for a run that cannot finish, so
  // the job fails then.
  bool follower = false;
  // Its exit 0 means the run is over (the coordinator exits 0 only after it ended the run): the
  // others get options.run_over_grace to exit by themselves, then are stopped.
  bool ends_run = false;
  // Supervision. Defaults: no restart, the first death fails the job.
  int max_restarts = 0;                   // restarts allowed over the job (>= 0)
  std::vector<std::string> restart_argv;  // the command of every restart; empty = argv
  OnDeath on_death = OnDeath::kFail;      // a death with no restart left
  std::string restart_note;  // how a restart differs, in lines: "with --recover" → "restarting it with --recover"
  std::string limit;         // the setting behind max_restarts, in lines: "cluster.server_restarts = 3"
};

// One supervision event, as it happens (ProcessGroupOptions::on_event).
struct ChildEvent {
  enum class Kind {
    kDied,       // exited non-zero or killed by a signal while the job ran
    kRestarted,  // started again (restart_argv)
    kGivenUp,    // no restart left under kContinue: the job goes on without it
  };
  enum class Action { kRestart, kContinue, kStop };  // kDied: what the death leads to
  Kind kind = Kind::kDied;
  std::string child;
  pid_t pid = -1;              // kDied: the dead incarnation; kRestarted: the new one
  int exit_code = -1;          // kDied, kGivenUp: if it exited normally
  int term_signal = 0;         // kDied, kGivenUp: if a signal killed it
  double seconds = 0;          // when, in seconds since the group was made
  double uptime_s = 0;         // kDied: how long the dead incarnation ran
  double down_s = 0;           // kRestarted: seconds between its death and this start
  int restart = 0;             // kRestarted: its number (1..max_restarts); kDied: restarts before this death
  int max_restarts = 0;
  Action action = Action::kStop;   // kDied
  std::vector<std::string> argv;   // kRestarted: the command it was started with
  std::string line;                // the "[launch] ..." line printed for it, without the prefix
  // 0 for a clean exit; else its exit code, or 128 + signal.
  int Code() const { return term_signal ? 128 + term_signal : exit_code; }
};

struct ProcessGroupOptions {
  std::chrono::milliseconds grace_period{5000};  // between SIGTERM and SIGKILL when stopping
  std::chrono::milliseconds timeout{0};          // 0 = no limit; else stop all and return 124
  bool handle_signals = true;  // SIGINT/SIGTERM to this process stop the job (see above)
  // A child that exits with this code (> 0) failed its setup in a way a restart repeats (a bad
  // config, a port in use: common/cli.h kExitUsage): it is treated as out of restarts. 0 = none.
  int setup_error_code = 0;
  // After an ends_run child exited 0, how long the others may take to exit before they are
  // stopped (a process the run ended under, stopped or cut off at the time, would wait for a
  // coordinator and servers that are gone).
  std::chrono::milliseconds run_over_grace{10000};
  // How many primaries must have exited 0 for a done job to succeed (see above). 0 lets a job
  // whose primaries were all given up succeed: a cluster task whose one worker the job goes on
  // without.
  int min_succeeded = 1;
  // Receives each prefixed line (no trailing newline). Default: stdout, flushed per line.
  std::function<void(std::string_view line)> output;
  // Receives every supervision event (may be empty).
  std::function<void(const ChildEvent& event)> on_event;
};

struct ChildResult {
  std::string name;
  pid_t pid = -1;            // of its latest incarnation
  bool exited = false;       // its latest incarnation was reaped
  int exit_code = -1;        // if it exited normally
  int term_signal = 0;       // if a signal killed it
  bool stopped_by_us = false;  // it was still running when the job was being stopped
  int restarts = 0;          // how many times it was restarted
  bool given_up = false;     // it died with no restart left under kContinue
  // 0 for a clean exit; else its exit code, or 128 + signal.
  int Code() const { return term_signal ? 128 + term_signal : exit_code; }
};

class ProcessGroup {
 public:
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Spawns a child. Errors (no such program, log file not writable, a negative max_restarts)
  // name the child and the program, and leave no process behind.
  Status Start(const ChildSpec& spec);

  // Runs until the job ends (see the header comment) and every child is reaped; returns the
  // job's exit code.
  int Run();

  // One entry per started child (its latest incarnation), in start order; complete after Run().
  const std::vector<ChildResult>& results() const { return results_; }
  // Why the job ended, for a last log line: "all primaries exited 0", "worker 1 exited with
  // code 3", "received signal 2", "timeout after 5000 ms".
  const std::string& reason() const { return reason_; }

 private:
  struct Child;
  Status Spawn(const std::string& name, const std::vector<std::string>& argv, pid_t* pid, int* out_fd);
  void Emit(const std::string& name, std::string_view line);
  void EmitFrom(Child& c, std::string_view line);  // Emit, noting an error line as c's last
  ChildEvent NewEvent(ChildEvent::Kind kind, size_t i) const;
  void Report(ChildEvent event);
  void DrainOutput(Child& c, bool eof_expected);
  void ReapExited();
  void HandleDeath(size_t i);
  void GiveUp(size_t i, ChildEvent died, const std::string& limit_part);
  void RestartDue();
  bool CheckDone();
  bool CannotFinish();  // the "cannot finish" end (see above): stops the job and returns true
  void CheckRunOver();  // the "run over" end (see above)
  void BeginStop(std::string reason, int code);
  void SignalLive(int sig);
  bool AllReaped() const;
  double Since(std::chrono::steady_clock::time_point t) const;

  ProcessGroupOptions options_;
  std::vector<std::unique_ptr<Child>> children_;  // parallel to results_
  std::vector<ChildResult> results_;
  std::chrono::steady_clock::time_point created_;
  int signal_fd_ = -1;
  sigset_t old_mask_{};
  bool stopping_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
  int last_given_up_code_ = 0;  // the code of the child given up last (in time)
  std::string last_given_up_error_;  // ... and its last error line's message, if it printed one
  std::chrono::steady_clock::time_point run_over_at_{};  // when an ends_run child exited 0 (else epoch)
  std::string reason_;
  std::chrono::steady_clock::time_point kill_at_{};
};

}  // namespace downpour
