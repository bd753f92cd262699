// Tests for common/run_secret.h: the secret is made once per run directory (mode 0600, 64 hex
// characters), racing creators all get the first one, and a secret others may read is refused.
#include "common/run_secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(RunSecret, MadeOnceWithOwnerOnlyPermissions) {
  const fs::path dir = test::ScratchDir("run_secret");
  const std::string run = (dir / "run").string();  // does not exist yet
  std::string a, b;
  ASSERT_TRUE(EnsureRunSecret(run, &a).ok());
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  struct stat st {};
  ASSERT_EQ(::stat(RunSecretPath(run).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(EnsureRunSecret(run, &b).ok());
  EXPECT_EQ(a, b);
  ASSERT_TRUE(ReadRunSecret(run, &b).ok());
  EXPECT_EQ(a, b);
  // No temporary left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(run)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

TEST(RunSecret, RacingProcessesAllGetTheFirstOne) {
  const fs::path dir = test::ScratchDir("run_secret_race");
  const std::string run = (dir / "run").string();
  constexpr int kProcs = 8;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string s;
      if (!EnsureRunSecret(run, &s).ok()) ::_exit(1);
      std::ofstream((dir / fmt::format("got-{}", i)).string()) << s;
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::set<std::string> seen;
  for (int i = 0; i < kProcs; ++i) seen.insert(test::ReadFile(dir / fmt::format("got-{}", i)));
  EXPECT_EQ(seen.size(), 1u);
  std::string mine;
  ASSERT_TRUE(ReadRunSecret(run, &mine).ok());
  EXPECT_EQ(*seen.begin(), mine);
  fs::remove_all(dir);
}

TEST(RunSecret, ReadableByOthersOrGarbledIsRefused) {
  const fs::path dir = test::ScratchDir("run_secret_bad");
  std::string s;
  EXPECT_EQ(ReadRunSecret(dir.string(), &s).code(), StatusCode::kNotFound);
  ASSERT_TRUE(EnsureRunSecret(dir.string(), &s).ok());
  const std::string path = RunSecretPath(dir.string());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  Status st = ReadRunSecret(dir.string(), &s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(fmt::format("permissions 0644 for '{}' are too open", path)));
  EXPECT_THAT(st.message(), HasSubstr(fmt::format("chmod 600 {}", path)));
  // EnsureRunSecret does not paper over it by making a new one.
  EXPECT_EQ(EnsureRunSecret(dir.string(), &s).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  test::WriteFile(path, "short\n");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  st = ReadRunSecret(dir.string(), &s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("not a run secret"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour
