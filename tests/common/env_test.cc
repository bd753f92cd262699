// Tests of common/env.h's WriteFully / WritevFully: the one loop behind every durable write
// (atomic files, tensor files, the write-ahead log, the metrics files). Short writes go on from
// where they stopped, EINTR is retried, a failure (or a call that puts down nothing) ends it
// with the path and how far it got, and `written` tells a torn write from an untouched file.
#include "common/env.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "tests/testing/fault_env.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// Puts down at most `step` bytes per call, and fails every third call with EINTR first.
class ChoppyEnv : public Env {
 public:
  explicit ChoppyEnv(size_t step) : step_(step) {}
  ssize_t Write(int fd, const void* buf, size_t n) override {
    if (Interrupt()) return -1;
    return Env::Write(fd, buf, std::min(n, step_));
  }
  ssize_t Writev(int fd, const iovec* iov, int count) override {
    if (Interrupt()) return -1;
    pieces_seen_ = std::max(pieces_seen_, count);
    // The first pieces, cut to `step` bytes in all: a short write that may end inside a piece.
    std::vector<iovec> cut;
    size_t left = step_;
    for (int i = 0; i < count && left > 0; ++i) {
      cut.push_back(iovec{iov[i].iov_base, std::min(iov[i].iov_len, left)});
      left -= cut.back().iov_len;
    }
    return Env::Writev(fd, cut.data(), static_cast<int>(cut.size()));
  }
  int calls() const { return calls_; }
  int pieces_seen() const { return pieces_seen_; }

 private:
  bool Interrupt() {
    if (++calls_ % 3 != 0) return false;
    errno = EINTR;
    return true;
  }
  size_t step_;
  int calls_ = 0;
  int pieces_seen_ = 0;
};

// Every write puts down nothing and reports no error: a loop that only stops on -1 never ends.
class StuckEnv : public Env {
 public:
  ssize_t Write(int, const void*, size_t) override { return 0; }
  ssize_t Writev(int, const iovec*, int) override { return 0; }
};

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("env");
    path_ = (dir_ / "out.bin").string();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { ::close(fd_); }

  std::string Bytes(size_t n) const {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + i % 23);
    return s;
  }

  test::fs::path dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(EnvTest, WriteFullyGoesOnAfterShortWritesAndInterruptions) {
  const std::string bytes = Bytes(10000);
  ChoppyEnv env(7);
  size_t written = 0;
  {
    ScopedEnv scoped(&env);
    ASSERT_TRUE(WriteFully(fd_, bytes.data(), bytes.size(), path_, &written).ok());
  }
  EXPECT_EQ(written, bytes.size());
  EXPECT_GT(env.calls(), 1400);  // 10000 / 7 short writes, and the interrupted calls
  EXPECT_EQ(test::ReadFile(path_), bytes);
}

// More pieces than one writev takes (IOV_MAX), empty pieces among them, short writes that end
// inside a piece: the file holds the pieces in order.
TEST_F(EnvTest, WritevFullyWritesEveryPieceInOrder) {
  const size_t pieces = IOV_MAX * 2 + 5;
  const std::string bytes = Bytes(pieces * 3);
  std::vector<iovec> iov;
  std::string expect;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t len = i % 4;  // 0..3 bytes: every fourth piece is empty
    iov.push_back(iovec{const_cast<char*>(bytes.data()) + 3 * i, len});
    expect.append(bytes, 3 * i, len);
  }
  ChoppyEnv env(1000);
  size_t written = 0;
  {
    ScopedEnv scoped(&env);
    ASSERT_TRUE(WritevFully(fd_, iov, path_, &written).ok());
  }
  EXPECT_EQ(written, expect.size());
  EXPECT_LE(env.pieces_seen(), IOV_MAX);
  EXPECT_EQ(test::ReadFile(path_), expect);
}

TEST_F(EnvTest, AFullDiskEndsTheWriteWithThePathAndHowFarItGot) {
  const std::string bytes = Bytes(1000);
  test::FaultEnv env;
  env.FillDiskAfter(300);
  size_t written = 0;
  Status s;
  {
    ScopedEnv scoped(&env);
    s = WriteFully(fd_, bytes.data(), bytes.size(), path_, &written);
  }
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr(path_ + ": write failed after 300 of 1000 bytes"));
  EXPECT_THAT(s.message(), HasSubstr(std::strerror(ENOSPC)));
  EXPECT_EQ(written, 300u);
  EXPECT_EQ(test::ReadFile(path_), bytes.substr(0, 300));

  std::vector<iovec> iov = {{const_cast<char*>(bytes.data()), 500}, {const_cast<char*>(bytes.data()) + 500, 500}};
  env.FillDiskAfter(700);
  {
    ScopedEnv scoped(&env);
    s = WritevFully(fd_, iov, path_, &written);
  }
  EXPECT_THAT(s.message(), HasSubstr("write failed after 700 of 1000 bytes"));
  EXPECT_EQ(written, 700u);
}

TEST_F(EnvTest, ACallThatPutsDownNothingIsAnErrorNotALoop) {
  const std::string bytes = Bytes(10);
  StuckEnv env;
  ScopedEnv scoped(&env);
  size_t written = 99;
  Status s = WriteFully(fd_, bytes.data(), bytes.size(), path_, &written);
  EXPECT_THAT(s.message(), HasSubstr("write failed after 0 of 10 bytes: the call put down no bytes"));
  EXPECT_EQ(written, 0u);
  s = WritevFully(fd_, {iovec{const_cast<char*>(bytes.data()), bytes.size()}}, path_, &written);
  EXPECT_THAT(s.message(), HasSubstr("write failed after 0 of 10 bytes"));
  // Nothing to write is no call at all.
  EXPECT_TRUE(WriteFully(fd_, bytes.data(), 0, path_).ok());
  EXPECT_TRUE(WritevFully(fd_, {iovec{nullptr, 0}}, path_).ok());
}

}  // namespace
}  // namespace downpour
