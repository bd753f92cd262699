// push_encoding.cc — see push_encoding.h.
#include "client/ps/push_encoding.h"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

namespace downpour {

uint64_t EncodePushPart(ChunkEncoder& encoder, MessageHeader* h, Frames* payload) {
  const Encoding base = h->encoding;
  Frames encoded;
  encoded.reserve(payload->size());
  std::vector<Encoding> encodings;
  std::vector<float> scratch;
  uint64_t total = 0;
  for (size_t i = 0; i < payload->size(); ++i) {
    const Frame& f = (*payload)[i];
    const float* g = AlignedFloats(f, &scratch);
    auto chunk = std::make_shared<EncodedChunk>();
    encoder.Encode(h->chunk_ids[i], std::span<const float>(g, f.size() / sizeof(float)), chunk.get());
    encodings.push_back(chunk->encoding);
    h->byte_lengths[i] = chunk->bytes.size();
    if (!h->checksums.empty()) h->checksums[i] = Crc32c(chunk->bytes.data(), chunk->bytes.size());
    total += chunk->bytes.size();
    const std::byte* data = chunk->bytes.data();
    const size_t size = chunk->bytes.size();
    encoded.push_back(Frame::Borrow(data, size, std::move(chunk)));
  }
  if (std::any_of(encodings.begin(), encodings.end(), [&](Encoding e) { return e != base; })) {
    h->encodings = std::move(encodings);
  }
  *payload = std::move(encoded);
  return total;
}

}  // namespace downpour
