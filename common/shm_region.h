// shm_region.h — a shared-memory region one server offers one worker on the same host, so
// payloads skip the socket (docs/architecture.md "The wire format": "Same host: shared memory";
// ps_client.h, shard.h).
//
//   Server: SharedRegion::Create("downpour-s0-w1", payload_bytes, &region);
//           reply carries region->path() ("/proc/<pid>/fd/<fd>"), region->bytes(), region->nonce()
//   Worker: SharedRegion::Open(path, bytes, nonce, &region);   // the same memory, checked
//
// The region is an anonymous memfd, sealed against shrinking and growing before anyone else can
// open it, so neither side can make the other's mapping fault (SIGBUS) by truncating the file.
// Only a process of the same user that may read the server's /proc/<pid>/fd can open it: that
// is, a process that could already read and write the server's memory (ptrace rules), so the
// region gives a peer no power it did not have. What a peer writes there is still untrusted
// data: the server copies a push out of the region before validating it, exactly as it would
// read a received frame.
//
// Layout: a 4096-byte header page (magic, version, nonce, payload size), then `payload_bytes`
// (64-byte aligned) that the users divide between them (the PS: a push area and a pull area).
//
// A worker on another host (or in another pid namespace) either cannot open the path or opens
// a different file: Open checks the size, the seals and the nonce, and the caller falls back to
// the socket. BootId() lets a server skip making a region for a worker that is plainly elsewhere.
//
// Thread-safety: a region is a mapping; synchronising readers and writers is the user's job
// (the PS client never has two messages touching the same chunk's area in flight).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace downpour {

class SharedRegion {
 public:
  static constexpr uint64_t kMagic = 0x4450534852454731ull;  // "DPSHREG1"
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kHeaderBytes = 4096;

  // A new sealed region of `payload_bytes` (> 0) plus the header page, mapped read-write, with a
  // fresh random nonce. `name` shows in /proc/<pid>/fd (debugging only).
  static Status Create(const std::string& name, uint64_t payload_bytes, std::unique_ptr<SharedRegion>* out);
  // Maps the region another process made. Fails (kUnavailable, naming the path and what
  // differed) unless the file is a sealed memfd of exactly kHeaderBytes + payload_bytes whose
  // header carries `nonce`.
  static Status Open(const std::string& path, uint64_t payload_bytes, uint64_t nonce,
                     std::unique_ptr<SharedRegion>* out);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  std::byte* payload() const { return base_ + kHeaderBytes; }
  uint64_t payload_bytes() const { return payload_bytes_; }
  uint64_t nonce() const { return nonce_; }
  // Where another process of this host opens it: "/proc/<pid>/fd/<fd>".
  const std::string& path() const { return path_; }

 private:
  SharedRegion() = default;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t nonce_ = 0;
  std::string path_;
};

// This host's boot id (/proc/sys/kernel/random/boot_id), "" when unreadable. Two processes with
// different boot ids are on different machines.
std::string HostBootId();

}  // namespace downpour
