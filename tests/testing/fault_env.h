// fault_env.h — an Env (common/env.h) that fails where a test says: a disk that fills after so
// many bytes (a short write, then ENOSPC), or fsync / fdatasync, rename, ftruncate failing with a
// given errno. Every other call, and every call it lets through, is the POSIX one. Install it
// with ScopedEnv for the part of the test that writes.
//
// Thread-safety: its calls and settings may come from any thread (the log's fsync thread calls
// Fdatasync).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "common/env.h"

namespace downpour::test {

class FaultEnv : public Env {
 public:
  // Writes may put `bytes` more bytes on disk; -1 = no limit (the default).
  void FillDiskAfter(int64_t bytes);
  // Each call of that kind fails with `err`; 0 = it works (the default).
  void FailFsync(int err) { fsync_err_ = err; }  // fsync and fdatasync
  void FailRename(int err) { rename_err_ = err; }
  void FailFtruncate(int err) { ftruncate_err_ = err; }
  void FailWrites(int err) { write_err_ = err; }  // pwrite (the log's writes)
  // pwrite to a file opened O_DIRECT fails with EINVAL, as on a filesystem that opens O_DIRECT
  // and refuses its writes.
  void RefuseDirectWrites(bool refuse) { refuse_direct_ = refuse; }
  void SetFreeBytes(int64_t bytes) { free_bytes_ = bytes; }  // -1 = the filesystem's own (default)

  int64_t failed_writes() const { return failed_writes_; }
  int64_t fsyncs() const { return fsyncs_; }  // fsync and fdatasync calls, failed ones too

  ssize_t Write(int fd, const void* buf, size_t n) override;
  ssize_t Writev(int fd, const iovec* iov, int count) override;
  // On a file opened O_DIRECT a short write stops at a 4096-byte boundary, as the kernel's would.
  ssize_t Pwrite(int fd, const void* buf, size_t n, off_t offset) override;
  int Fsync(int fd) override;
  int Fdatasync(int fd) override;
  int Ftruncate(int fd, off_t length) override;
  int Rename(const char* from, const char* to) override;
  int64_t FreeBytes(const char* path) override;

 private:
  // How many of `n` bytes a write may put down now (0 with errno ENOSPC when the disk is full);
  // SIZE_MAX when there is no limit.
  size_t Allow(size_t n);
  void Spent(ssize_t written);

  std::mutex mu_;  // guards budget_
  int64_t budget_ = -1;
  std::atomic<int> fsync_err_{0}, rename_err_{0}, ftruncate_err_{0}, write_err_{0};
  std::atomic<int64_t> failed_writes_{0}, fsyncs_{0}, free_bytes_{-1};
  std::atomic<bool> refuse_direct_{false};
};

}  // namespace downpour::test
