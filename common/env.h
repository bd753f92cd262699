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

namespace downpour {

class Env {
 public:
  virtual ~Env() = default;
  virtual ssize_t Write(int fd, const void* buf, size_t n);
  virtual ssize_t Writev(int fd, const iovec* iov, int count);
  virtual int Fsync(int fd);
  virtual int Fdatasync(int fd);
  virtual int Ftruncate(int fd, off_t length);
  virtual int Rename(const char* from, const char* to);
};

Env& CurrentEnv();

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
