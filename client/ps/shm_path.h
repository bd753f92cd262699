// shm_path.h — a link's same-host payload path: the shared-memory region its server offered at
// register (common/shm_region.h), laid out as a push area then a pull area, each holding the
// server's chunks in id order. A message through it carries only its header on the socket; the
// floats are in the region. A chunk's area is not written again until the server answered the
// message that used it (busy flags), so a later message waits, and with it every message after it
// on the link, to keep call order.
//
// Thread-safety: one link's I/O thread, except the byte counters (any thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/shm_region.h"
#include "common/shm_share.h"
#include "common/status.h"
#include "common/transport.h"

namespace downpour {

class ShmPath {
 public:
  // The path to server `server` of `layout`; `asked`: whether the client asks for regions
  // (PsClientOptions::shared_memory). Off until Adopt maps one.
  ShmPath(const ParamLayout& layout, int server, bool asked);

  // A register reply: maps the region it offers, or drops the link's old one (a new register
  // means the server dropped it). Returns why there is none ("" when there is one, or none was
  // asked for).
  std::string Adopt(const MessageHeader& reply);
  bool on() const { return region_ != nullptr; }

  // Whether a message with header `h` goes through the region: f32 dense pushes and pulls when
  // one is mapped. False also when one of its chunks is busy; then *wait is set.
  bool Usable(const MessageHeader& h, bool* wait) const;
  // Writes a push's chunks (`payload`, one frame per chunk) into the push area (a pull writes
  // nothing), marks its chunks busy and makes the header-only message (flag kFlagShm) in *frames.
  Status Send(const MessageHeader& h, const Frames& payload, Frames* frames);
  // The message that Send sent with header `h` is answered, or will be sent again.
  void Release(const MessageHeader& h);
  // Copies a pull reply's chunks (`h.chunk_ids`) from the pull area into `out` (the whole flat
  // parameter buffer, at each chunk's offset).
  void ReadPull(const MessageHeader& h, std::span<float> out) const;
  // The same into 16-bit weights (`dtype` kF16 / kBf16): the region's f32 cast as the codec rounds.
  void ReadPull16(const MessageHeader& h, DType dtype, std::span<uint16_t> out) const;

  uint64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
  uint64_t received_bytes() const { return received_bytes_.load(std::memory_order_relaxed); }

 private:
  std::vector<uint8_t>& BusyOf(MsgType type) { return type == MsgType::kPull ? pull_busy_ : push_busy_; }
  const std::vector<uint8_t>& BusyOf(MsgType type) const { return type == MsgType::kPull ? pull_busy_ : push_busy_; }

  const ParamLayout& layout_;
  const bool asked_;
  std::unique_ptr<SharedRegion> region_;
  const ShmShare share_;  // where each chunk lies in an area
  std::vector<uint8_t> push_busy_, pull_busy_;
  std::atomic<uint64_t> sent_bytes_{0};              // push payload written into the region
  mutable std::atomic<uint64_t> received_bytes_{0};  // pulled weights read out of it
};

}  // namespace downpour
