// env.h — the system calls behind every durable write (file_io.h's atomic files, tensor files,
// the servers' write-ahead logs), behind one interface that a test can replace to make any of
// them fail: a write that stops half-way as on a full disk, an fsync that reports EIO, a rename
// refused. leveldb's Env is the model; here it is only the calls whose failure the writers must
// survive, with the POSIX calls' own contract (the result, errno set on failure).
//
// CurrentEnv() is the process's: the POSIX calls unless a test installed another (ScopedEnv).
//
// Thread-safety: CurrentEnv() may be called from any thread (the log's fsync thread among them);
// an installed Env must be safe to call from several. ScopedEnv belongs to one test thread, with
// no writer running across its construction or destruction.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour {

class Env {
 public:
  virtual ~Env() = default;
  virtual ssize_t Write(int fd, const void* buf, size_t n);
  virtual ssize_t Writev(int fd, const iovec* iov, int count);
  virtual ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset);
  virtual int Fsync(int fd);
  virtual int Fdatasync(int fd);
  virtual int Ftruncate(int fd, off_t length);
  virtual int Rename(const char* from, const char* to);
  // Bytes an unprivileged writer may still put in the filesystem holding `path` (statvfs's
  // f_bavail × f_frsize); -1 with errno set on failure.
  virtual int64_t FreeBytes(const char* path);
};

Env& CurrentEnv();

// Writes all `n` bytes at `p` to `fd` through CurrentEnv(): a short write goes on from where it
// stopped, a call interrupted by a signal (EINTR) is made again. A call that fails, or puts down
// nothing, ends it with an I/O error naming `path` and how far it got ("{path}: write failed
// after 4096 of 8192 bytes: No space left on device"). `written` (if given) gets the bytes put
// down, so a caller can tell a torn write (some) from one that left the file as it was (none).
Status WriteFully(int fd, const void* p, size_t n, std::string_view path, size_t* written = nullptr);

// The same for a gather list, in writev calls of at most IOV_MAX pieces.
Status WritevFully(int fd, std::vector<iovec> iov, std::string_view path, size_t* written = nullptr);

// Installs `env` for the whole process while it lives; the previous one is put back after.
class ScopedEnv {
 public:
  explicit ScopedEnv(Env* env);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  Env* previous_;
};

}  // namespace downpour
