// access_test.cc — the one place that decides who may do what (server/access.h) as pure
// functions: roles with keys, the token without, checkpoint path confinement, the constant-time
// comparison; and the bounded-rate refusal log (common/log_limit.h) with an injected clock.
#include "server/access.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/log_limit.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

MessageHeader WithToken(MsgType type, const std::string& token) {
  MessageHeader h;
  h.type = type;
  h.token = token;
  return h;
}

TEST(Authorize, WithKeysTheKeysRoleDecidesAndTokensDoNot) {
  AccessPolicy keyed;
  keyed.keyed = true;
  keyed.run_secret = "secret";  // ignored with keys
  const MessageHeader h = WithToken(MsgType::kShutdown, "secret");
  struct Case {
    Privilege p;
    const char* role;
  };
  const std::vector<Case> granted = {{Privilege::kAdmin, "admin"},
                                     {Privilege::kObserve, "admin"},
                                     {Privilege::kRegisterServer, "server"},
                                     {Privilege::kRegisterWorker, "worker"},
                                     {Privilege::kWorkerTraffic, "worker"}};
  for (const Case& c : granted) {
    for (const char* role : {"", "admin", "server", "worker", "Admin", "admin "}) {
      const Status s = Authorize(keyed, PeerInfo{role, "10.0.0.1"}, h, c.p);
      EXPECT_EQ(s.ok(), std::string(role) == c.role) << PrivilegeName(c.p) << " as '" << role << "': " << s.ToString();
      if (!s.ok()) {
        EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
        EXPECT_NE(s.message().find(fmt::format("needs the '{}' key", c.role)), std::string::npos) << s.message();
        EXPECT_EQ(s.message().find("secret\""), std::string::npos);
      }
    }
  }
}

TEST(Authorize, WithoutKeysAdminAndRegisterNeedTheTokenWorkerTrafficDoesNot) {
  AccessPolicy p;
  p.run_secret = "s3cret-s3cret";
  for (Privilege priv :
       {Privilege::kAdmin, Privilege::kRegisterServer, Privilege::kRegisterWorker, Privilege::kObserve}) {
    SCOPED_TRACE(PrivilegeName(priv));
    EXPECT_TRUE(Authorize(p, PeerInfo{}, WithToken(MsgType::kRegister, "s3cret-s3cret"), priv).ok());
    const Status none = Authorize(p, PeerInfo{}, WithToken(MsgType::kRegister, ""), priv);
    EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(none.message().find("no token"), std::string::npos) << none.message();
    for (const char* wrong : {"s3cret-s3creT", "s3cret-s3cre", "s3cret-s3cret!", "x"}) {
      const Status s = Authorize(p, PeerInfo{}, WithToken(MsgType::kRegister, wrong), priv);
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << wrong;
      EXPECT_NE(s.message().find("wrong token"), std::string::npos) << s.message();
      EXPECT_EQ(s.message().find("s3cret"), std::string::npos) << "the secret leaked: " << s.message();
    }
    // A role claimed without keys counts for nothing.
    EXPECT_FALSE(Authorize(p, PeerInfo{"admin", ""}, WithToken(MsgType::kRegister, ""), priv).ok());
  }
  EXPECT_TRUE(Authorize(p, PeerInfo{}, WithToken(MsgType::kPush, ""), Privilege::kWorkerTraffic).ok());
  // No secret configured (in-process use): no check.
  EXPECT_TRUE(Authorize(AccessPolicy{}, PeerInfo{}, WithToken(MsgType::kShutdown, ""), Privilege::kAdmin).ok());
}

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
  // A string padded with the bytes the comparison substitutes past the end is still different.
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\xff", 3), "ab"));
}

TEST(DescribePeer, AddressAndKey) {
  EXPECT_EQ(DescribePeer(PeerInfo{"worker", "127.0.0.5"}), "127.0.0.5 (key worker)");
  EXPECT_EQ(DescribePeer(PeerInfo{"", "::1"}), "::1");
  EXPECT_EQ(DescribePeer(PeerInfo{}), "an unknown address");
}

class Confine : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test and process: ctest runs this fixture's tests in parallel, and a
    // shared one let one test's TearDown remove the other's files mid-check (a flaky failure).
    base_ = fs::path(::testing::TempDir()) /
            fmt::format("access_confine_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                        ::getpid());
    fs::remove_all(base_);
    run_ = base_ / "run";
    fs::create_directories(run_ / "sub");
    fs::create_directories(base_ / "elsewhere");
    fs::create_directory_symlink(base_ / "elsewhere", run_ / "out");
    fs::create_directory_symlink(run_ / "sub", run_ / "in");
    fs::create_symlink(base_ / "elsewhere" / "target.dpt", run_ / "file_link.dpt");
  }
  void TearDown() override { fs::remove_all(base_); }
  Status Check(const std::string& wire, std::string* resolved = nullptr) {
    std::string r;
    const Status s = ConfineToRunDir(run_.string(), wire, &r);
    if (resolved) *resolved = r;
    return s;
  }
  fs::path base_, run_;
};

TEST_F(Confine, InsideIsAcceptedAndResolved) {
  std::string r;
  ASSERT_TRUE(Check("a.dpt", &r).ok());
  EXPECT_EQ(r, (fs::weakly_canonical(run_) / "a.dpt").string());
  EXPECT_TRUE(Check("sub/a.dpt").ok());
  EXPECT_TRUE(Check("sub/../a.dpt").ok());
  EXPECT_TRUE(Check("./sub/./a.dpt").ok());
  EXPECT_TRUE(Check((run_ / "sub" / "a.dpt").string()).ok());
  ASSERT_TRUE(Check("in/a.dpt", &r).ok());
  EXPECT_EQ(r, (fs::weakly_canonical(run_) / "sub" / "a.dpt").string()) << "symlink inside, resolved";
  // The run directory given with a trailing slash, or through "..", is the same directory.
  EXPECT_TRUE(ConfineToRunDir(run_.string() + "/", "a.dpt", &r).ok());
  EXPECT_TRUE(ConfineToRunDir((run_ / "sub" / "..").string(), "a.dpt", &r).ok());
}

TEST_F(Confine, EscapesAreRefused) {
  for (const std::string& wire : std::vector<std::string>{
           "../a.dpt", "sub/../../a.dpt", "nothing/../../a.dpt", "out/a.dpt", "file_link.dpt",
           (base_ / "elsewhere" / "a.dpt").string(), "/etc/passwd", ".", "sub/..", (run_ / "..").string(),
           // A sibling whose name starts with the run directory's name is not inside it.
           (base_ / "run2" / "a.dpt").string(), "../run2/a.dpt"}) {
    const Status s = Check(wire);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << wire;
    EXPECT_NE(s.message().find("outside the run directory"), std::string::npos) << s.message();
  }
  EXPECT_EQ(Check("").code(), StatusCode::kInvalidArgument);
  std::string r;
  const Status none = ConfineToRunDir("", "a.dpt", &r);
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("no run directory"), std::string::npos) << none.message();
}

// --- RateLimitedLog. ---

struct Captured {
  std::vector<std::string> lines;
  RateLimitedLog::Sink Sink() {
    return [this](const std::string& l) { lines.push_back(l); };
  }
};

TEST(RateLimitedLog, AtMostNLinesPerWindowThenOneSummary) {
  Captured out;
  RateLimitedLog log("server 0", "refusals", 3, 10s, out.Sink());
  const auto t0 = RateLimitedLog::Clock::time_point{} + 1000s;
  for (int i = 0; i < 100; ++i) log.LogAt(t0 + std::chrono::milliseconds(i), fmt::format("refusal {}", i));
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(out.lines[2], "refusal 2");
  EXPECT_EQ(log.suppressed_total(), 97u);
  log.FlushAt(t0 + 5s);  // window not over: nothing yet
  EXPECT_EQ(out.lines.size(), 3u);
  log.FlushAt(t0 + 10s);
  ASSERT_EQ(out.lines.size(), 4u);
  EXPECT_EQ(out.lines[3], "server 0: 97 more refusals suppressed in the last 10 s");
  log.FlushAt(t0 + 30s);  // nothing held back since: no line
  EXPECT_EQ(out.lines.size(), 4u);
  // A new window logs again.
  EXPECT_TRUE(log.LogAt(t0 + 31s, "again"));
  EXPECT_EQ(out.lines.back(), "again");
}

TEST(RateLimitedLog, TheSummaryComesBeforeTheNextWindowsFirstLine) {
  Captured out;
  RateLimitedLog log("coordinator", "refusals", 1, 1s, out.Sink());
  const auto t0 = RateLimitedLog::Clock::time_point{} + 1000s;
  EXPECT_TRUE(log.LogAt(t0, "a"));
  EXPECT_FALSE(log.LogAt(t0 + 100ms, "b"));
  EXPECT_FALSE(log.LogAt(t0 + 200ms, "c"));
  EXPECT_TRUE(log.LogAt(t0 + 1500ms, "d"));
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(out.lines[1], "coordinator: 2 more refusals suppressed in the last 2 s");
  EXPECT_EQ(out.lines[2], "d");
}

// A process that stops within a window still says how many lines it dropped.
TEST(RateLimitedLog, FinalFlushReportsWhatTheOpenWindowHeldBack) {
  Captured out;
  RateLimitedLog log("server 1", "refusals", 2, 10s, out.Sink());
  const auto t0 = RateLimitedLog::Clock::time_point{} + 1000s;
  for (int i = 0; i < 7; ++i) log.LogAt(t0 + std::chrono::milliseconds(i), "refused");
  log.FlushFinalAt(t0 + 1s);
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(out.lines[2], "server 1: 5 more refusals suppressed in the last 1 s");
  log.FlushFinalAt(t0 + 2s);  // nothing more held back: no line
  EXPECT_EQ(out.lines.size(), 3u);
}

}  // namespace
}  // namespace downpour
