// transport.cc — see transport.h.
#include "common/transport.h"

#include <fmt/core.h>

namespace downpour {

Frame Frame::Copy(const void* data, size_t size) {
  auto bytes = std::make_shared<std::vector<std::byte>>(size);
  if (size > 0) std::memcpy(bytes->data(), data, size);
  Frame f;
  f.data_ = bytes->data();
  f.size_ = size;
  f.owner_ = std::move(bytes);
  return f;
}

size_t MessageBytes(const Frames& frames) {
  size_t n = 0;
  for (const Frame& f : frames) n += f.size();
  return n;
}

std::string PeerHex(const PeerId& peer) {
  std::string out;
  for (unsigned char c : peer) out += fmt::format("{:02x}", c);
  return out;
}

uint64_t DroppedPeers::Add(const PeerId& peer) {
  if (ids_.insert(peer).second) {
    order_.push_back(peer);
    if (order_.size() > kRemember) {
      ids_.erase(order_.front());
      order_.pop_front();
    }
  }
  return count_.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::string DroppedPeers::Drop(const PeerId& peer, std::string_view endpoint, size_t replies, size_t bytes,
                               size_t more_bytes, size_t bound) {
  const uint64_t n = Add(peer);
  return fmt::format(
      "{}: dropped peer {}: it does not read its replies ({} replies, {} bytes queued, {} more would pass the {} byte "
      "bound); {} peers dropped so far",
      endpoint, PeerHex(peer), replies, bytes, more_bytes, bound, n);
}

}  // namespace downpour
