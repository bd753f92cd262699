// env.cc — see env.h.
#include "common/env.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

namespace downpour {
namespace {

Env g_posix;
std::atomic<Env*> g_env{&g_posix};

}  // namespace

ssize_t Env::Write(int fd, const void* buf, size_t n) { return ::write(fd, buf, n); }
ssize_t Env::Writev(int fd, const iovec* iov, int count) { return ::writev(fd, iov, count); }
ssize_t Env::Pwrite(int fd, const void* buf, size_t n, off_t offset) { return ::pwrite(fd, buf, n, offset); }
int Env::Fsync(int fd) { return ::fsync(fd); }
int Env::Fdatasync(int fd) { return ::fdatasync(fd); }
int Env::Ftruncate(int fd, off_t length) { return ::ftruncate(fd, length); }
int Env::Rename(const char* from, const char* to) { return std::rename(from, to); }
int64_t Env::FreeBytes(const char* path) {
  struct statvfs st {};
  if (::statvfs(path, &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

namespace {

// The error of a write call that returned `w` (< 0: errno says why; 0: it put down nothing).
Status WriteError(std::string_view path, ssize_t w, size_t done, size_t n) {
  const char* why = w < 0 ? std::strerror(errno) : "the call put down no bytes";
  return IoError("{}: write failed after {} of {} bytes: {}", path, done, n, why);
}

}  // namespace

Status WriteFully(int fd, const void* p, size_t n, std::string_view path, size_t* written) {
  const char* c = static_cast<const char*>(p);
  size_t done = 0;
  Status s;
  while (done < n) {
    // At most 1 GiB per call: Linux writes at most 0x7ffff000 bytes at once anyway.
    const ssize_t w = CurrentEnv().Write(fd, c + done, std::min(n - done, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      s = WriteError(path, w, done, n);
      break;
    }
    done += static_cast<size_t>(w);
  }
  if (written != nullptr) *written = done;
  return s;
}

Status WritevFully(int fd, std::vector<iovec> iov, std::string_view path, size_t* written) {
  size_t n = 0;
  for (const iovec& v : iov) n += v.iov_len;
  size_t first = 0, done = 0;
  Status s;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t w = CurrentEnv().Writev(fd, iov.data() + first, count);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      s = WriteError(path, w, done, n);
      break;
    }
    done += static_cast<size_t>(w);
    auto left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {  // a short write inside one piece
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  if (written != nullptr) *written = done;
  return s;
}

Env& CurrentEnv() { return *g_env.load(std::memory_order_acquire); }

ScopedEnv::ScopedEnv(Env* env) : previous_(g_env.exchange(env, std::memory_order_acq_rel)) {}
ScopedEnv::~ScopedEnv() { g_env.store(previous_, std::memory_order_release); }

}  // namespace downpour
