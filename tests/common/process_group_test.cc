// Tests for common/process_group.h with /bin/sh children: line prefixing and logs, success
// when the primaries finish, first failure stops all, SIGTERM → SIGKILL escalation, nothing
// left behind in a child's process group, signals to the launcher, timeouts, exec errors; and
// supervision: restarts with the restart command (same prefix and log), the restart limit,
// children the job goes on without, the success rule, and no restart while stopping.
#include "common/process_group.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class ProcessGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("downpour_pg_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ProcessGroupOptions Options(std::chrono::milliseconds grace = 2000ms) {
    ProcessGroupOptions o;
    o.grace_period = grace;
    o.timeout = 60s;  // a safety net: no test may hang CI
    o.output = [this](std::string_view line) { lines_.emplace_back(line); };
    return o;
  }
  static ChildSpec Sh(std::string name, std::string script, bool primary = false,
                      std::string log = "") {
    ChildSpec spec;
    spec.name = std::move(name);
    spec.argv = {"/bin/sh", "-c", std::move(script)};
    spec.log_path = std::move(log);
    spec.primary = primary;
    return spec;
  }
  // A server as the launcher supervises one: restarted with --recover up to `restarts` times.
  static ChildSpec Server(std::string name, std::string script, int restarts) {
    ChildSpec spec = Sh(std::move(name), std::move(script));
    spec.max_restarts = restarts;
    spec.restart_note = "with --recover";
    spec.limit = fmt::format("cluster.server_restarts = {}", restarts);
    return spec;
  }
  // Options that also collect the supervision events.
  ProcessGroupOptions Supervised(std::chrono::milliseconds grace = 2000ms) {
    ProcessGroupOptions o = Options(grace);
    o.on_event = [this](const ChildEvent& e) { events_.push_back(e); };
    return o;
  }
  std::vector<ChildEvent> Events(ChildEvent::Kind kind) const {
    std::vector<ChildEvent> out;
    for (const ChildEvent& e : events_) {
      if (e.kind == kind) out.push_back(e);
    }
    return out;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::vector<std::string> lines_;
  std::vector<ChildEvent> events_;
};

// True once `pid` no longer runs (gone, or a zombie waiting for init to reap it).
bool ProcessGone(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string pid_s, comm, state;
    if (stat >> pid_s >> comm >> state && state == "Z") return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

pid_t ReadPid(const std::string& path) {
  for (int i = 0; i < 100; ++i) {
    std::ifstream in(path);
    pid_t pid = 0;
    if (in >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

TEST_F(ProcessGroupTest, PrefixesLinesAndWritesLogs) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("worker 0", "echo hello; echo oops >&2; printf 'no newline'", true,
                             Path("w0.log"))).ok());
  ASSERT_TRUE(group.Start(Sh("worker 1", "echo a; echo b", true)).ok());
  EXPECT_EQ(group.Run(), 0);
  EXPECT_THAT(lines_, Contains("[worker 0] hello"));
  EXPECT_THAT(lines_, Contains("[worker 0] oops"));
  EXPECT_THAT(lines_, Contains("[worker 0] no newline"));
  EXPECT_THAT(lines_, Contains("[worker 1] a"));
  EXPECT_THAT(lines_, Contains("[worker 1] b"));
  EXPECT_EQ(Slurp(Path("w0.log")), "hello\noops\nno newline\n");
  EXPECT_EQ(group.reason(), "all primaries exited 0");
}

TEST_F(ProcessGroupTest, PrimariesDoneStopsTheRestGracefully) {
  ProcessGroup group(Options(5000ms));
  // A server that exits cleanly on SIGTERM, as ours do.
  ASSERT_TRUE(group.Start(Sh("server 0", "trap 'echo bye; exit 0' TERM; while :; do sleep 0.05; done"))
                  .ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.2", true)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(group.Run(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "did not wait for the grace period";
  EXPECT_TRUE(group.results()[0].stopped_by_us);
  EXPECT_EQ(group.results()[0].Code(), 0);
  EXPECT_FALSE(group.results()[1].stopped_by_us);
  EXPECT_THAT(lines_, Contains("[server 0] bye"));
}

TEST_F(ProcessGroupTest, NoPrimariesMeansEveryChildMustFinish) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("a", "sleep 0.1")).ok());
  ASSERT_TRUE(group.Start(Sh("b", "sleep 0.3; echo done")).ok());
  EXPECT_EQ(group.Run(), 0);
  EXPECT_THAT(lines_, Contains("[b] done"));
  EXPECT_FALSE(group.results()[1].stopped_by_us);
}

TEST_F(ProcessGroupTest, FirstFailureStopsAllAndIsTheExitCode) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("server 0", "sleep 30")).ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 30", true)).ok());
  ASSERT_TRUE(group.Start(Sh("worker 1", "sleep 0.2; echo failing; exit 3", true)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(group.Run(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(group.reason(), "worker 1 exited with code 3");
  EXPECT_THAT(lines_, Contains(::testing::MatchesRegex(
                          R"(\[launch\] worker 1 exited with code 3 after 0\.[0-9] s; stopping all)")));
  EXPECT_TRUE(group.results()[0].stopped_by_us);
  EXPECT_EQ(group.results()[0].term_signal, SIGTERM);
  EXPECT_TRUE(group.results()[1].stopped_by_us);
  for (const auto& r : group.results()) EXPECT_TRUE(ProcessGone(r.pid)) << r.name;
}

TEST_F(ProcessGroupTest, ChildKilledBySignalIsAFailure) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("worker 0", "kill -SEGV $$", true)).ok());
  EXPECT_EQ(group.Run(), 128 + SIGSEGV);
  EXPECT_THAT(group.reason(), HasSubstr("worker 0 was killed by signal 11"));
}

// A child that ignores SIGTERM, with a grandchild in its process group: after the grace
// period both are SIGKILLed; nothing is orphaned.
TEST_F(ProcessGroupTest, EscalatesToSigkillAndLeavesNoOrphans) {
  ProcessGroup group(Options(300ms));
  ASSERT_TRUE(group.Start(Sh("server 0", fmt::format("trap '' TERM; sleep 60 & echo $! > {}; wait",
                                                     Path("grandchild.pid"))))
                  .ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.3; exit 1", true)).ok());
  const pid_t grandchild = ReadPid(Path("grandchild.pid"));
  ASSERT_GT(grandchild, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(group.Run(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(group.results()[0].term_signal, SIGKILL);
  EXPECT_THAT(lines_, Contains("[launch] grace period over; sending SIGKILL"));
  EXPECT_TRUE(ProcessGone(grandchild)) << "grandchild " << grandchild << " survived";
}

// A child that exits 0 but leaves a background process: the leftover is killed with it.
TEST_F(ProcessGroupTest, LeftoversOfAFinishedChildAreKilled) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("worker 0", fmt::format("sleep 60 & echo $! > {}; exit 0",
                                                     Path("leftover.pid")), true))
                  .ok());
  EXPECT_EQ(group.Run(), 0);
  const pid_t leftover = ReadPid(Path("leftover.pid"));
  ASSERT_GT(leftover, 0);
  EXPECT_TRUE(ProcessGone(leftover));
}

TEST_F(ProcessGroupTest, SignalToTheLauncherStopsAll) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("server 0", "sleep 30")).ok());
  // The "user" presses Ctrl-C: a child sends SIGINT to this (the launcher) process.
  ASSERT_TRUE(group.Start(Sh("worker 0", fmt::format("sleep 0.2; kill -INT {}; sleep 30", ::getpid()),
                             true))
                  .ok());
  EXPECT_EQ(group.Run(), 128 + SIGINT);
  EXPECT_EQ(group.reason(), "received signal 2");
  for (const auto& r : group.results()) {
    EXPECT_TRUE(r.stopped_by_us) << r.name;
    EXPECT_TRUE(ProcessGone(r.pid)) << r.name;
  }
}

TEST_F(ProcessGroupTest, TimeoutStopsAll) {
  ProcessGroupOptions o = Options();
  o.timeout = 300ms;
  ProcessGroup group(o);
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 30", true)).ok());
  EXPECT_EQ(group.Run(), 124);
  EXPECT_EQ(group.reason(), "timeout after 300 ms");
}

TEST_F(ProcessGroupTest, ExecFailureNamesTheProgram) {
  ProcessGroup group(Options());
  ChildSpec missing;
  missing.name = "server 0";
  missing.argv = {"/nonexistent/downpour-server", "--id", "0"};
  Status s = group.Start(missing);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("child \"server 0\": cannot run /nonexistent/downpour-server"));
  ChildSpec unlogged;
  unlogged.name = "x";
  unlogged.argv = {"/bin/true"};
  unlogged.log_path = Path("no/dir/x.log");
  s = group.Start(unlogged);
  EXPECT_THAT(s.message(), HasSubstr("no/dir/x.log"));
  EXPECT_TRUE(group.results().empty());
  EXPECT_EQ(group.Run(), 0);  // nothing to run
}

TEST_F(ProcessGroupTest, DestructorKillsRunningChildren) {
  pid_t pid = -1;
  {
    ProcessGroup group(Options());
    ASSERT_TRUE(group.Start(Sh("server 0", "sleep 30")).ok());
    pid = group.results()[0].pid;
  }
  EXPECT_TRUE(ProcessGone(pid));
}

TEST_F(ProcessGroupTest, LongLinesAreSplitNotLost) {
  ProcessGroup group(Options());
  ASSERT_TRUE(group.Start(Sh("w", "head -c 150000 /dev/zero | tr '\\0' x; echo; echo end", true)).ok());
  EXPECT_EQ(group.Run(), 0);
  size_t xs = 0;
  for (const auto& l : lines_) {
    if (l.rfind("[w] x", 0) == 0) xs += l.size() - 4;
  }
  EXPECT_EQ(xs, 150000u);
  EXPECT_THAT(lines_, Contains("[w] end"));
}

// ---- supervision ----

// Matches a whole output line: the regex, with "X.X s" for any duration.
::testing::Matcher<const std::string&> Line(const std::string& regex) { return ::testing::MatchesRegex(regex); }

// A server that is SIGKILLed is restarted with its restart command after the backoff, under
// the same prefix and log file; the job then ends as usual.
TEST_F(ProcessGroupTest, RestartedChildGetsItsRestartArgvAndKeepsItsPrefixAndLog) {
  WriteText(Path("serve.sh"), fmt::format(
      "echo \"args: $*\" >> {}\necho \"hello $*\"\n"
      "if [ \"$1\" != --recover ]; then kill -KILL $$; fi\n"
      "exec sleep 30\n", Path("args.txt")));
  ProcessGroup group(Supervised());
  ChildSpec server = Sh("server 0", "", false, Path("server-0.log"));
  server.argv = {"/bin/sh", Path("serve.sh"), "--id", "0"};
  server.restart_argv = {"/bin/sh", Path("serve.sh"), "--recover", "--id", "0"};
  server.max_restarts = 3;
  server.restart_note = "with --recover";
  server.limit = "cluster.server_restarts = 3";
  ASSERT_TRUE(group.Start(server).ok());
  // The worker finishes once the server ran twice (bounded: 5 s).
  ASSERT_TRUE(group.Start(Sh("worker 0", fmt::format("i=0; while [ $i -lt 100 ] && [ \"$(wc -l < {0} 2>/dev/null)\" != 2 ]; "
                                                     "do sleep 0.05; i=$((i+1)); done; cat {0}", Path("args.txt")),
                             true)).ok());
  EXPECT_EQ(group.Run(), 0);
  EXPECT_EQ(Slurp(Path("args.txt")), "args: --id 0\nargs: --recover --id 0\n");
  EXPECT_THAT(lines_, Contains("[server 0] hello --id 0"));
  EXPECT_THAT(lines_, Contains("[server 0] hello --recover --id 0"));
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 0 was killed by signal 9 \(Killed\) after [0-9]+\.[0-9] s; )"
                                    R"(restarting it with --recover \(restart 1 of 3\))")));
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 0 restarted \(restart 1 of 3, pid [0-9]+\))")));
  EXPECT_EQ(Slurp(Path("server-0.log")), "hello --id 0\nhello --recover --id 0\n") << "the log is appended to";
  EXPECT_EQ(group.reason(), "all primaries exited 0");
  EXPECT_EQ(group.results()[0].restarts, 1);
  EXPECT_TRUE(group.results()[0].stopped_by_us);
  ASSERT_EQ(Events(ChildEvent::Kind::kDied).size(), 1u);
  const ChildEvent died = Events(ChildEvent::Kind::kDied)[0];
  EXPECT_EQ(died.child, "server 0");
  EXPECT_EQ(died.term_signal, SIGKILL);
  EXPECT_EQ(died.Code(), 128 + SIGKILL);
  EXPECT_EQ(died.action, ChildEvent::Action::kRestart);
  ASSERT_EQ(Events(ChildEvent::Kind::kRestarted).size(), 1u);
  const ChildEvent restarted = Events(ChildEvent::Kind::kRestarted)[0];
  EXPECT_EQ(restarted.argv, server.restart_argv);
  EXPECT_EQ(restarted.restart, 1);
  EXPECT_EQ(restarted.max_restarts, 3);
  EXPECT_EQ(restarted.pid, group.results()[0].pid);
  EXPECT_GE(restarted.down_s, 0.19) << "restarted before the backoff";
  EXPECT_GE(restarted.seconds, died.seconds);
}

// One death more than max_restarts fails the job with that child's exit code.
TEST_F(ProcessGroupTest, RestartLimitExceededFailsTheJobWithThatChildsCode) {
  ProcessGroup group(Supervised());
  ChildSpec server = Server("server 1", "exit 5", 2);
  ASSERT_TRUE(group.Start(server).ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 30", true)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(group.Run(), 5);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 1 exited with code 5 after [0-9.]+ s; restarting it with )"
                                    R"(--recover \(restart 1 of 2\))")));
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 1 exited with code 5 after [0-9.]+ s; restarting it with )"
                                    R"(--recover \(restart 2 of 2\))")));
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 1 exited with code 5 after [0-9.]+ s; it died a 3rd time )"
                                    R"(\(limit cluster.server_restarts = 2\); stopping all)")));
  EXPECT_EQ(group.reason(), "server 1 exited with code 5; it died a 3rd time (limit cluster.server_restarts = 2)");
  EXPECT_EQ(group.results()[0].restarts, 2);
  EXPECT_TRUE(group.results()[1].stopped_by_us);
  ASSERT_EQ(Events(ChildEvent::Kind::kDied).size(), 3u);
  EXPECT_EQ(Events(ChildEvent::Kind::kDied)[2].action, ChildEvent::Action::kStop);
  EXPECT_EQ(Events(ChildEvent::Kind::kRestarted).size(), 2u);
  // With no restart allowed, the line names the setting.
  lines_.clear();
  ProcessGroup strict(Supervised());
  server.max_restarts = 0;
  server.limit = "cluster.server_restarts = 0";
  ASSERT_TRUE(strict.Start(server).ok());
  EXPECT_EQ(strict.Run(), 5);
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 1 exited with code 5 after [0-9.]+ s; stopping all )"
                                    R"(\(cluster.server_restarts = 0\))")));
}

// A child that exits with the setup-error code (a port in use, a bad config) is not restarted:
// the restart would fail the same way. Other codes still are.
TEST_F(ProcessGroupTest, SetupErrorIsNotRestarted) {
  ProcessGroupOptions options = Supervised();
  options.setup_error_code = 2;
  ProcessGroup group(options);
  ChildSpec server = Server("server 0", "echo bind failed; exit 2", 3);
  ASSERT_TRUE(group.Start(server).ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 30", true)).ok());
  EXPECT_EQ(group.Run(), 2);
  EXPECT_EQ(group.results()[0].restarts, 0);
  EXPECT_EQ(std::count(lines_.begin(), lines_.end(), "[server 0] bind failed"), 1);
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] server 0 exited with code 2 after [0-9.]+ s; a setup error, which )"
                                    R"(a restart would repeat; stopping all)")));
  EXPECT_TRUE(Events(ChildEvent::Kind::kRestarted).empty());
  // Code 5 with the same options is restarted as before.
  lines_.clear();
  ProcessGroup other(options);
  server.argv = {"/bin/sh", "-c", "exit 5"};
  server.max_restarts = 1;
  ASSERT_TRUE(other.Start(server).ok());
  EXPECT_EQ(other.Run(), 5);
  EXPECT_EQ(other.results()[0].restarts, 1);
}

// The line that ends the job names why: the last error line the child that ended it printed
// (spdlog's "[error]" or a program's "program: CODE: message"), not only its exit code.
TEST_F(ProcessGroupTest, TheJobsEndNamesTheLastErrorOfTheChildThatEndedIt) {
  ProcessGroup group(Supervised());
  ASSERT_TRUE(group.Start(Sh("server 0",
                             "echo '[t] [info] serving'; echo '[t] [error] server 0: /d has 1 MiB free'; exit 2", true))
                  .ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 30", true)).ok());
  EXPECT_EQ(group.Run(), 2);
  EXPECT_EQ(group.reason(), "server 0 exited with code 2: server 0: /d has 1 MiB free");

  ProcessGroup workers(Supervised());
  for (int w = 0; w < 2; ++w) {
    ChildSpec worker = Sh(fmt::format("worker {}", w),
                          fmt::format("echo 'downpour-worker {}: IO_ERROR: the disk is full'; exit 1", w), true);
    worker.on_death = OnDeath::kContinue;
    ASSERT_TRUE(workers.Start(worker).ok());
  }
  ChildSpec evaluator = Sh("evaluator", "sleep 30", true);
  evaluator.follower = true;
  ASSERT_TRUE(workers.Start(evaluator).ok());
  EXPECT_EQ(workers.Run(), 1);
  EXPECT_THAT(workers.reason(), HasSubstr("given up and none finished: the job cannot finish (downpour-worker "));
  EXPECT_THAT(workers.reason(), HasSubstr(": IO_ERROR: the disk is full)"));
}

// Every worker given up with none finished: the evaluator (a follower) would wait for a run that
// cannot finish, so the job ends at once with the last one's code. One that finished is enough
// for the follower to go on.
TEST_F(ProcessGroupTest, AFollowerDoesNotKeepAJobThatCannotFinish) {
  ProcessGroup group(Supervised());
  for (int w = 0; w < 2; ++w) {
    ChildSpec worker = Sh(fmt::format("worker {}", w), "exit 2", true);
    worker.on_death = OnDeath::kContinue;
    ASSERT_TRUE(group.Start(worker).ok());
  }
  ChildSpec evaluator = Sh("evaluator", "sleep 30", true);
  evaluator.follower = true;
  ASSERT_TRUE(group.Start(evaluator).ok());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(group.Run(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(group.reason(), "worker 0, worker 1 given up and none finished: the job cannot finish");
  EXPECT_TRUE(group.results()[2].stopped_by_us);

  ProcessGroup one_done(Supervised());
  ChildSpec failing = Sh("worker 0", "exit 2", true);
  failing.on_death = OnDeath::kContinue;
  ASSERT_TRUE(one_done.Start(failing).ok());
  ASSERT_TRUE(one_done.Start(Sh("worker 1", "exit 0", true)).ok());
  evaluator.argv = {"/bin/sh", "-c", "sleep 0.5"};
  ASSERT_TRUE(one_done.Start(evaluator).ok());
  EXPECT_EQ(one_done.Run(), 0);
  EXPECT_FALSE(one_done.results()[2].stopped_by_us);
}

// A child under kContinue that dies is given up; the other primaries go on, and the job
// succeeds when they exit 0.
TEST_F(ProcessGroupTest, ContinueChildsDeathDoesNotStopTheOthers) {
  ProcessGroup group(Supervised());
  ASSERT_TRUE(group.Start(Sh("server 0", "trap 'exit 0' TERM; while :; do sleep 0.05; done")).ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.6; echo finished", true)).ok());
  ChildSpec worker = Sh("worker 1", "echo boom; exit 3", true);
  worker.on_death = OnDeath::kContinue;
  worker.limit = "cluster.restart_workers = 0";
  ASSERT_TRUE(group.Start(worker).ok());
  EXPECT_EQ(group.Run(), 0);
  EXPECT_THAT(lines_, Contains("[worker 0] finished"));
  EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] worker 1 exited with code 3 after [0-9.]+ s; the job goes on )"
                                    R"(without it \(cluster.restart_workers = 0\))")));
  // Its last words come before the line about its death.
  const auto boom = std::find(lines_.begin(), lines_.end(), "[worker 1] boom");
  ASSERT_NE(boom, lines_.end());
  ASSERT_NE(boom + 1, lines_.end());
  EXPECT_THAT(*(boom + 1), HasSubstr("[launch] worker 1 exited with code 3"));
  EXPECT_EQ(group.reason(), "all primaries done: 1 exited 0, 1 given up (worker 1)");
  EXPECT_TRUE(group.results()[2].given_up);
  EXPECT_FALSE(group.results()[1].stopped_by_us);
  EXPECT_TRUE(group.results()[0].stopped_by_us);
  ASSERT_EQ(Events(ChildEvent::Kind::kGivenUp).size(), 1u);
  EXPECT_EQ(Events(ChildEvent::Kind::kGivenUp)[0].exit_code, 3);
  EXPECT_EQ(Events(ChildEvent::Kind::kDied)[0].action, ChildEvent::Action::kContinue);
}

// A worker restarted once and then given up; when every primary was given up the job fails
// with the last one's code, unless min_succeeded is 0 (a cluster task's one worker).
TEST_F(ProcessGroupTest, EveryPrimaryGivenUpFailsUnlessNoneMustSucceed) {
  for (int min_succeeded : {1, 0}) {
    lines_.clear();
    ProcessGroupOptions o = Supervised();
    o.min_succeeded = min_succeeded;
    ProcessGroup group(o);
    ChildSpec a = Sh("worker 0", "exit 4", true);
    a.on_death = OnDeath::kContinue;
    a.max_restarts = 1;
    a.restart_note = "with --resume";
    a.limit = "--restart-workers 1";
    ChildSpec b = Sh("worker 1", "sleep 0.1; exit 6", true);
    b.on_death = OnDeath::kContinue;
    ASSERT_TRUE(group.Start(a).ok());
    ASSERT_TRUE(group.Start(b).ok());
    const int code = group.Run();
    if (min_succeeded == 1) {
      EXPECT_EQ(code, 4) << "worker 0 was the last one given up (after its restart)";
      EXPECT_EQ(group.reason(), "0 of the primaries exited 0 (at least 1 must); given up: worker 0, worker 1");
    } else {
      EXPECT_EQ(code, 0);
    }
    EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] worker 0 exited with code 4 after [0-9.]+ s; restarting it with )"
                                      R"(--resume \(restart 1 of 1\))")));
    EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] worker 0 exited with code 4 after [0-9.]+ s; it died a 2nd time )"
                                      R"(\(limit --restart-workers 1\); the job goes on without it)")));
    EXPECT_THAT(lines_, Contains(Line(R"(\[launch\] worker 1 exited with code 6 after [0-9.]+ s; the job goes on )"
                                      R"(without it)")));
    EXPECT_TRUE(group.results()[0].given_up && group.results()[1].given_up);
  }
}

// Stopping never restarts: a child waiting for its restart when another fails stays down, a
// child that exits non-zero on SIGTERM at the end is no death, and one that exits 0 is done.
TEST_F(ProcessGroupTest, NothingIsRestartedWhileStopping) {
  {
    ProcessGroup group(Supervised());
    ChildSpec server = Sh("server 0", "sleep 0.2; exit 1");  // restart due at ~0.4 s
    server.max_restarts = 3;
    ASSERT_TRUE(group.Start(server).ok());
    ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.25; exit 9", true)).ok());
    EXPECT_EQ(group.Run(), 9);
    EXPECT_EQ(group.results()[0].restarts, 0);
    EXPECT_EQ(group.results()[0].exit_code, 1);
    EXPECT_TRUE(Events(ChildEvent::Kind::kRestarted).empty());
    EXPECT_THAT(lines_, ::testing::Not(Contains(HasSubstr("restarted"))));
  }
  events_.clear();
  lines_.clear();
  {
    ProcessGroup group(Supervised());
    ChildSpec server = Sh("server 0", "trap 'exit 1' TERM; while :; do sleep 0.05; done");
    server.max_restarts = 3;
    ChildSpec finished = Sh("server 1", "exit 0");
    finished.max_restarts = 3;
    ASSERT_TRUE(group.Start(server).ok());
    ASSERT_TRUE(group.Start(finished).ok());
    ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.3", true)).ok());
    EXPECT_EQ(group.Run(), 0);
    EXPECT_EQ(group.results()[0].exit_code, 1);
    EXPECT_TRUE(group.results()[0].stopped_by_us);
    EXPECT_EQ(group.results()[0].restarts, 0);
    EXPECT_EQ(group.results()[1].restarts, 0);
    EXPECT_TRUE(events_.empty()) << events_[0].line;
  }
}

// A restart that cannot start (the program is gone) counts as a death with no restart left.
TEST_F(ProcessGroupTest, RestartThatCannotStartFollowsOnDeath) {
  ProcessGroup group(Supervised());
  ChildSpec worker = Sh("worker 1", "exit 3", true);
  worker.max_restarts = 2;
  worker.restart_argv = {"/nonexistent/downpour-worker", "--resume"};
  worker.on_death = OnDeath::kContinue;
  ASSERT_TRUE(group.Start(worker).ok());
  ASSERT_TRUE(group.Start(Sh("worker 0", "sleep 0.5", true)).ok());
  EXPECT_EQ(group.Run(), 0);
  EXPECT_THAT(lines_, Contains(HasSubstr("[launch] worker 1 cannot be restarted (child \"worker 1\": cannot run "
                                         "/nonexistent/downpour-worker")));
  EXPECT_TRUE(group.results()[0].given_up);
  EXPECT_EQ(group.results()[0].exit_code, 3);
  ChildSpec bad = Sh("x", "exit 0");
  bad.max_restarts = -1;
  EXPECT_THAT(group.Start(bad).message(), HasSubstr("max_restarts = -1"));
}


}  // namespace
}  // namespace downpour
