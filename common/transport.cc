// transport.cc — see transport.h.
#include "common/transport.h"

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

}  // namespace downpour
