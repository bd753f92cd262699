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

DType FactorDType(WireCodec push) {
  return push == WireCodec::kFp16 || push == WireCodec::kBf16 ? CodecDType(push) : DType::kF32;
}

namespace {

// The frames cast to f16 / bf16 in one buffer they share; false, frames untouched, when a value
// does not fit (EncodeFactorPart).
bool CastFactorFrames(DType dtype, Frames* payload) {
  size_t floats = 0;
  for (const Frame& f : *payload) floats += f.size() / sizeof(float);
  auto bytes = std::make_shared<std::vector<std::byte>>();
  bytes->reserve(floats * sizeof(uint16_t));
  std::vector<float> scratch;
  for (const Frame& f : *payload) {
    const float* x = AlignedFloats(f, &scratch);
    EncodeDense(std::span<const float>(x, f.size() / sizeof(float)), dtype, bytes.get());
  }
  // A finite float past fp16's range has rounded to Inf.
  if (FirstNonFinite(bytes->data(), dtype, floats) >= 0) return false;
  Frames cast;
  cast.reserve(payload->size());
  size_t at = 0;
  for (const Frame& f : *payload) {
    const size_t n = f.size() / sizeof(float) * sizeof(uint16_t);
    cast.push_back(Frame::Borrow(bytes->data() + at, n, bytes));
    at += n;
  }
  *payload = std::move(cast);
  return true;
}

}  // namespace

uint64_t EncodeFactorPart(DType dtype, bool cast, MessageHeader* h, Frames* payload) {
  DP_CHECK(!cast || dtype != DType::kF32);
  h->dtype = dtype != DType::kF32 && (cast || CastFactorFrames(dtype, payload)) ? dtype : DType::kF32;
  uint64_t total = 0;
  for (size_t i = 0; i < payload->size(); ++i) {
    const Frame& f = (*payload)[i];
    total += f.size();
    if (i >= h->chunk_ids.size()) continue;  // the activations: no list entry of their own
    h->byte_lengths[i] = f.size();
    if (!h->checksums.empty()) h->checksums[i] = Crc32c(f.data(), f.size());
  }
  return total;
}

}  // namespace downpour
