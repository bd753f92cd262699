// fault_env.cc — see fault_env.h.
#include "tests/testing/fault_env.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

namespace downpour::test {

void FaultEnv::FillDiskAfter(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = bytes;
}

size_t FaultEnv::Allow(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (budget_ < 0) return SIZE_MAX;
  if (budget_ == 0 && n > 0) {
    ++failed_writes_;
    errno = ENOSPC;
    return 0;
  }
  return std::min(n, static_cast<size_t>(budget_));
}

void FaultEnv::Spent(ssize_t written) {
  std::lock_guard<std::mutex> lock(mu_);
  if (budget_ >= 0 && written > 0) budget_ = std::max<int64_t>(0, budget_ - written);
}

ssize_t FaultEnv::Write(int fd, const void* buf, size_t n) {
  const size_t allowed = Allow(n);
  if (allowed == 0 && n > 0) return -1;
  const ssize_t w = Env::Write(fd, buf, std::min(n, allowed));
  Spent(w);
  return w;
}

ssize_t FaultEnv::Writev(int fd, const iovec* iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t allowed = Allow(total);
  if (allowed == 0 && total > 0) return -1;
  if (allowed >= total) {
    const ssize_t w = Env::Writev(fd, iov, count);
    Spent(w);
    return w;
  }
  std::vector<iovec> part;  // the first `allowed` bytes: a short write
  for (int i = 0; i < count && allowed > 0; ++i) {
    const size_t take = std::min(allowed, iov[i].iov_len);
    part.push_back(iovec{iov[i].iov_base, take});
    allowed -= take;
  }
  const ssize_t w = Env::Writev(fd, part.data(), static_cast<int>(part.size()));
  Spent(w);
  return w;
}

ssize_t FaultEnv::Pwrite(int fd, const void* buf, size_t n, off_t offset) {
  if (const int e = write_err_.load()) {
    ++failed_writes_;
    errno = e;
    return -1;
  }
  if (refuse_direct_.load()) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_DIRECT) != 0) {
      errno = EINVAL;
      return -1;
    }
  }
  size_t allowed = Allow(n);
  if (allowed == 0 && n > 0) return -1;  // counted, errno ENOSPC
  if (allowed < n) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_DIRECT) != 0) allowed &= ~size_t{4095};
    if (allowed == 0) {
      ++failed_writes_;
      errno = ENOSPC;
      return -1;
    }
  }
  const ssize_t w = Env::Pwrite(fd, buf, std::min(n, allowed), offset);
  Spent(w);
  return w;
}

namespace {

// -1 with errno `err` when a failure is set, else the call itself.
template <typename Call>
int FailOr(const std::atomic<int>& err, const Call& call) {
  if (const int e = err.load()) {
    errno = e;
    return -1;
  }
  return call();
}

}  // namespace

int FaultEnv::Fsync(int fd) {
  ++fsyncs_;
  return FailOr(fsync_err_, [&] { return Env::Fsync(fd); });
}

int FaultEnv::Fdatasync(int fd) {
  ++fsyncs_;
  return FailOr(fsync_err_, [&] { return Env::Fdatasync(fd); });
}

int FaultEnv::Ftruncate(int fd, off_t length) {
  return FailOr(ftruncate_err_, [&] { return Env::Ftruncate(fd, length); });
}

int64_t FaultEnv::FreeBytes(const char* path) {
  const int64_t set = free_bytes_.load();
  return set >= 0 ? set : Env::FreeBytes(path);
}

int FaultEnv::Rename(const char* from, const char* to) {
  return FailOr(rename_err_, [&] { return Env::Rename(from, to); });
}

}  // namespace downpour::test
