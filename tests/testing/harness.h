// harness.h — what the multi-process tests share (gloo's test/base_test.h is the model): a
// scratch directory per test, child processes that are always reaped, free loopback ports, the
// project's programs in the build tree, and reading their logs and JSONL metrics.
//
// Every wait is bounded; a Child still running when it is destroyed is SIGKILLed and reaped, so
// a failing test leaves no process behind.
//
// Thread-safety: one test thread. Ownership: a Child owns its process.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics.h"

namespace downpour::test {

namespace fs = std::filesystem;

// The build tree (ctest sets DOWNPOUR_BUILD_DIR for every test) and the source tree.
std::string BuildDir();
std::string SourcePath(const std::string& relative);  // <source>/<relative>
// A program of the build tree by name, e.g. "downpour-worker" → <build>/client/worker/downpour-worker.
std::string Binary(const std::string& name);

// A fresh, empty directory for the running test: <tmp>/<prefix>_<test name>_<pid>. Removed when
// the test ends without failing; a failed test's is kept, and its path printed, for reading.
fs::path ScratchDir(const std::string& prefix);

// A TCP port on 127.0.0.1 that is free now, and the first of `count` consecutive free ports
// (drawn at random, so tests running in parallel do not pick the same ones).
int FreePort();
int FreePortRange(int count);

std::string ReadFile(const fs::path& path);  // "" if missing
void WriteFile(const fs::path& path, const std::string& text);

// Waits (bounded) until `path` holds a non-empty first word and returns it; "" on timeout.
std::string WaitForWord(const fs::path& path, std::chrono::milliseconds timeout);

// One child process: argv[0] is a path; stdout and stderr are appended to `log`. Or a fork of
// this test running `body` and exiting with its return value (a worker written in the test).
class Child {
 public:
  Child(const std::vector<std::string>& argv, const fs::path& log);
  explicit Child(const std::function<int()>& body);
  ~Child();  // SIGKILL + reap if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  void Signal(int sig) const;
  // Exit code (128 + signal if a signal killed it), or -1 if it is still running after `limit`.
  int WaitExit(std::chrono::milliseconds limit);

 private:
  pid_t pid_ = -1;
};

// Runs argv to completion; returns its exit code (-1 on timeout, the process then killed) and
// its stdout + stderr.
int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::seconds limit = std::chrono::seconds(120));
// Same through /bin/sh -c.
int RunShell(const std::string& command, std::string* output,
             std::chrono::seconds limit = std::chrono::seconds(120));

// The processes whose parent is `parent` (from /proc), e.g. the children a launcher started.
std::vector<pid_t> ChildrenOf(pid_t parent);
// True while `pid` exists and is not a zombie.
bool Alive(pid_t pid);
// A whole job dying at once, as a host losing power would: SIGKILL to the launcher's children
// (expects `children` of them: `what` names them in the failure) and then to the launcher, which
// must exit by that signal; checks that every one of them is gone.
void KillJob(Child& launcher, size_t children, const std::string& what);
// The command line of a running process, NUL separators as spaces ("" when it is gone).
std::string CmdLine(pid_t pid);
// The child of `parent` whose command line holds every one of `parts`; -1 if none.
pid_t ChildWith(pid_t parent, const std::vector<std::string>& parts);

// The records of one event in <run_dir>/metrics/<file> (e.g. "worker-0.jsonl", "step").
std::vector<MetricRecord> Metrics(const fs::path& run_dir, const std::string& file, const std::string& event);
// Waits up to `limit` until worker `w` of the run has logged at least `steps` "step" records.
bool WaitWorkerSteps(const fs::path& run_dir, int w, int64_t steps, std::chrono::seconds limit);

// Debian's dataset-fashion-mnist files (idx, gzipped), which scripts/test installs.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// An uncompressed IDX file's bytes: magic, dims (big-endian), then `bytes`.
std::string IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& bytes);
// Whether those files are there (a test of a real job skips, saying so, when they are not).
bool HaveFashionMnist();
// Fails the calling test (a fatal failure: wrap in ASSERT_NO_FATAL_FAILURE) unless the programs a
// launched job runs are built: downpour-worker, -server, -coordinator and -launch.
void RequireJobBinaries();

// A job of real processes started by hand — coordinator, S servers, W workers, each worker
// with flags of its own (the launcher gives every worker the same command line). Logs go to
// <run_dir>/logs/<role>.log.
struct JobSpec {
  std::string config;                             // run config path
  fs::path run_dir;
  std::string tensors;                            // tensor list for coordinator and servers
  int servers = 1;
  std::vector<std::vector<std::string>> workers;  // one entry of extra flags per worker
};
class Job {
 public:
  explicit Job(const JobSpec& spec);
  Child& worker(int j) { return *workers_[static_cast<size_t>(j)]; }
  Child& server(int i) { return *servers_[static_cast<size_t>(i)]; }
  Child& coordinator() { return *coordinator_; }
  std::string Log(const std::string& role) const;  // e.g. Log("worker-1")
  // SIGTERM to servers and coordinator; returns true if every one exited 0 in time.
  bool Stop(std::chrono::seconds limit = std::chrono::seconds(20));

 private:
  JobSpec spec_;
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> servers_, workers_;
};

}  // namespace downpour::test
