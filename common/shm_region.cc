// shm_region.cc — see shm_region.h.
#include "common/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/random_id.h"

namespace downpour {

namespace {

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t nonce;
  uint64_t payload_bytes;
};

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string Errno() { return std::strerror(errno); }

}  // namespace

Status SharedRegion::Create(const std::string& name, uint64_t payload_bytes, std::unique_ptr<SharedRegion>* out) {
  if (payload_bytes == 0) return InvalidArgument("shared region {}: empty", name);
  std::unique_ptr<SharedRegion> r(new SharedRegion());
  r->fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) return Unavailable("shared region {}: memfd_create: {}", name, Errno());
  r->payload_bytes_ = payload_bytes;
  r->mapped_bytes_ = kHeaderBytes + payload_bytes;
  if (::ftruncate(r->fd_, static_cast<off_t>(r->mapped_bytes_)) != 0) {
    return Unavailable("shared region {}: cannot size it to {} bytes: {}", name, r->mapped_bytes_, Errno());
  }
  if (::fcntl(r->fd_, F_ADD_SEALS, kSeals) != 0) return Unavailable("shared region {}: cannot seal it: {}", name, Errno());
  void* p = ::mmap(nullptr, r->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) return Unavailable("shared region {}: mmap of {} bytes: {}", name, r->mapped_bytes_, Errno());
  r->base_ = static_cast<std::byte*>(p);
  r->nonce_ = RandomId();
  const Header h{kMagic, kVersion, 0, r->nonce_, payload_bytes};
  std::memcpy(r->base_, &h, sizeof(h));
  r->path_ = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(r->fd_);
  *out = std::move(r);
  return Status::Ok();
}

Status SharedRegion::Open(const std::string& path, uint64_t payload_bytes, uint64_t nonce,
                          std::unique_ptr<SharedRegion>* out) {
  // Only the form a server hands out: a path elsewhere is not a region (and is not opened).
  unsigned pid = 0, fd = 0;
  char tail = 0;
  if (std::sscanf(path.c_str(), "/proc/%u/fd/%u%c", &pid, &fd, &tail) != 2 || pid == 0) {
    return InvalidArgument("shared region '{}': not a /proc/<pid>/fd/<fd> path", path);
  }
  std::unique_ptr<SharedRegion> r(new SharedRegion());
  r->fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (r->fd_ < 0) return Unavailable("shared region {}: cannot open: {}", path, Errno());
  struct stat st {};
  if (::fstat(r->fd_, &st) != 0 || !S_ISREG(st.st_mode)) return Unavailable("shared region {}: not a regular file", path);
  r->payload_bytes_ = payload_bytes;
  r->mapped_bytes_ = kHeaderBytes + payload_bytes;
  if (static_cast<uint64_t>(st.st_size) != r->mapped_bytes_) {
    return Unavailable("shared region {}: {} bytes, expected {}", path, st.st_size, r->mapped_bytes_);
  }
  const int seals = ::fcntl(r->fd_, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Unavailable("shared region {}: not sealed against resizing", path);
  }
  void* p = ::mmap(nullptr, r->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) return Unavailable("shared region {}: mmap: {}", path, Errno());
  r->base_ = static_cast<std::byte*>(p);
  Header h{};
  std::memcpy(&h, r->base_, sizeof(h));
  if (h.magic != kMagic || h.version != kVersion || h.nonce != nonce || h.payload_bytes != payload_bytes) {
    return Unavailable("shared region {}: header does not match (another host's or process's file)", path);
  }
  r->nonce_ = nonce;
  r->path_ = path;
  *out = std::move(r);
  return Status::Ok();
}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::string HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id)) return "";
  return id;
}

}  // namespace downpour
