// Tests for common/process_group.h with /bin/sh children: line prefixing and logs, success
// when the primaries finish, first failure stops all, SIGTERM → SIGKILL escalation, nothing
// left behind in a child's process group, signals to the launcher, timeouts, exec errors.
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
    return ChildSpec{std::move(name), {"/bin/sh", "-c", std::move(script)}, std::move(log), primary};
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::vector<std::string> lines_;
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
  EXPECT_THAT(lines_, Contains("[launch] worker 1 exited with code 3; stopping all"));
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
  Status s = group.Start(ChildSpec{"server 0", {"/nonexistent/downpour-server", "--id", "0"}, "", false});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("child \"server 0\": cannot run /nonexistent/downpour-server"));
  s = group.Start(ChildSpec{"x", {"/bin/true"}, Path("no/dir/x.log"), false});
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

}  // namespace
}  // namespace downpour
