// env.cc — see env.h.
#include "common/env.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace downpour {
namespace {

Env g_posix;
std::atomic<Env*> g_env{&g_posix};

}  // namespace

ssize_t Env::Write(int fd, const void* buf, size_t n) { return ::write(fd, buf, n); }
ssize_t Env::Writev(int fd, const iovec* iov, int count) { return ::writev(fd, iov, count); }
int Env::Fsync(int fd) { return ::fsync(fd); }
int Env::Fdatasync(int fd) { return ::fdatasync(fd); }
int Env::Ftruncate(int fd, off_t length) { return ::ftruncate(fd, length); }
int Env::Rename(const char* from, const char* to) { return std::rename(from, to); }

Env& CurrentEnv() { return *g_env.load(std::memory_order_acquire); }

ScopedEnv::ScopedEnv(Env* env) : previous_(g_env.exchange(env, std::memory_order_acq_rel)) {}
ScopedEnv::~ScopedEnv() { g_env.store(previous_, std::memory_order_release); }

}  // namespace downpour
