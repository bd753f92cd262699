// fail_sync.cc — an LD_PRELOAD library that makes one fsync or fdatasync of one file fail with
// EIO in a process the test does not run itself (a server under downpour-launch), where the
// in-process FaultEnv (fault_env.h) cannot reach:
//
//   LD_PRELOAD=<build>/tests/testing/libdownpour_fail_sync.so
//   DOWNPOUR_FAIL_SYNC_OF=server-1.wal      fail a sync of a file whose path ends so ...
//   DOWNPOUR_FAIL_SYNC_WHEN=<dir>/trigger   ... once this file exists; the process that removes it
//                                           fails that one call, so exactly one call fails in
//                                           the whole job and a restarted process runs clean
//
// Every other call, and every call while either variable is unset, is the C library's.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using SyncFn = int (*)(int);

// Whether this call is the one to fail: the fd's file ends with DOWNPOUR_FAIL_SYNC_OF and this
// process is the one that removed the trigger.
bool FailThisOne(int fd) {
  const char* suffix = std::getenv("DOWNPOUR_FAIL_SYNC_OF");
  const char* trigger = std::getenv("DOWNPOUR_FAIL_SYNC_WHEN");
  if (suffix == nullptr || trigger == nullptr || *suffix == '\0') return false;
  char link[64], path[PATH_MAX];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return false;
  path[n] = '\0';
  const size_t len = std::strlen(suffix);
  if (static_cast<size_t>(n) < len || std::strcmp(path + n - len, suffix) != 0) return false;
  const int saved = errno;
  const bool mine = ::unlink(trigger) == 0;  // one process, one call, however many race for it
  errno = saved;
  return mine;
}

int Call(const char* name, int fd) {
  auto next = reinterpret_cast<SyncFn>(::dlsym(RTLD_NEXT, name));
  if (FailThisOne(fd)) {
    errno = EIO;
    return -1;
  }
  if (next == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return next(fd);
}

}  // namespace

extern "C" int fsync(int fd) { return Call("fsync", fd); }
extern "C" int fdatasync(int fd) { return Call("fdatasync", fd); }
