// fail_io.cc — an LD_PRELOAD library that makes the disk under one file fail, in processes the
// test does not run itself (servers under downpour-launch), where the in-process FaultEnv
// (fault_env.h) cannot reach. Preload it into a job with LD_PRELOAD=<build>/tests/testing/
// libdownpour_fail_io.so and set:
//
//   DOWNPOUR_FAIL_SYNC_OF=server-1.wal     one fsync / fdatasync of a file whose path ends so
//   DOWNPOUR_FAIL_SYNC_WHEN=<dir>/trigger  fails with EIO once this file exists; the process that
//                                          removes it fails that one call, so exactly one call
//                                          fails in the whole job and a restarted process runs clean
//
//   DOWNPOUR_FULL_DISK_OF=server-1.wal     every write / writev / pwrite to a file whose path ends so fails
//   DOWNPOUR_FULL_DISK_WHILE=<dir>/full    with ENOSPC, writing nothing, while this file exists
//
// Every other call, and every call while a pair is unset, is the C library's.
#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// Whether `fd` is a file whose path ends with `suffix`.
bool FdEndsWith(int fd, const char* suffix) {
  char link[64], path[PATH_MAX];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return false;
  path[n] = '\0';
  const size_t len = std::strlen(suffix);
  return static_cast<size_t>(n) >= len && std::strcmp(path + n - len, suffix) == 0;
}

// The sync to fail: the fd's file ends with DOWNPOUR_FAIL_SYNC_OF and this process removed the
// trigger.
bool FailThisSync(int fd) {
  const char* suffix = std::getenv("DOWNPOUR_FAIL_SYNC_OF");
  const char* trigger = std::getenv("DOWNPOUR_FAIL_SYNC_WHEN");
  if (suffix == nullptr || trigger == nullptr || *suffix == '\0' || !FdEndsWith(fd, suffix)) return false;
  return ::unlink(trigger) == 0;  // one process, one call, however many race for it
}

// A write to refuse: the fd's file ends with DOWNPOUR_FULL_DISK_OF while the marker exists.
bool DiskFull(int fd) {
  const char* suffix = std::getenv("DOWNPOUR_FULL_DISK_OF");
  const char* marker = std::getenv("DOWNPOUR_FULL_DISK_WHILE");
  if (suffix == nullptr || marker == nullptr || *suffix == '\0') return false;
  return ::access(marker, F_OK) == 0 && FdEndsWith(fd, suffix);
}

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

// Runs `fail` with errno kept, so a call that is let through sees the errno it was called with.
template <typename F>
bool Check(F fail) {
  const int saved = errno;
  const bool r = fail();
  errno = saved;
  return r;
}

}  // namespace

extern "C" int fsync(int fd) {
  static const auto next = Next<int (*)(int)>("fsync");
  if (Check([&] { return FailThisSync(fd); })) return errno = EIO, -1;
  return next(fd);
}

extern "C" int fdatasync(int fd) {
  static const auto next = Next<int (*)(int)>("fdatasync");
  if (Check([&] { return FailThisSync(fd); })) return errno = EIO, -1;
  return next(fd);
}

extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  static const auto next = Next<ssize_t (*)(int, const void*, size_t)>("write");
  if (n > 0 && Check([&] { return DiskFull(fd); })) return errno = ENOSPC, -1;
  return next(fd, buf, n);
}

extern "C" ssize_t writev(int fd, const iovec* iov, int count) {
  static const auto next = Next<ssize_t (*)(int, const iovec*, int)>("writev");
  if (count > 0 && Check([&] { return DiskFull(fd); })) return errno = ENOSPC, -1;
  return next(fd, iov, count);
}

extern "C" ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  static const auto next = Next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  if (n > 0 && Check([&] { return DiskFull(fd); })) return errno = ENOSPC, -1;
  return next(fd, buf, n, offset);
}

extern "C" ssize_t pwrite64(int fd, const void* buf, size_t n, off_t offset) {
  static const auto next = Next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite64");
  if (n > 0 && Check([&] { return DiskFull(fd); })) return errno = ENOSPC, -1;
  return next(fd, buf, n, offset);
}
