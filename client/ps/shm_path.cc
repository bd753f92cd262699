// shm_path.cc — see shm_path.h.
#include "client/ps/shm_path.h"

#include <cstring>

#include "common/grad_codec.h"

namespace downpour {

ShmPath::ShmPath(const ParamLayout& layout, int server, bool asked)
    : layout_(layout),
      asked_(asked),
      share_(layout, server),
      push_busy_(static_cast<size_t>(layout.num_chunks()), 0),
      pull_busy_(static_cast<size_t>(layout.num_chunks()), 0) {}

std::string ShmPath::Adopt(const MessageHeader& reply) {
  region_.reset();
  if (!asked_) return "";
  const uint64_t want = share_.region_bytes();
  Status s;
  if (reply.shm_path.empty()) {
    s = Unavailable("the server offered none (another host, or its shared memory is off)");
  } else if (reply.shm_bytes != want) {
    s = Corrupt("the server offered {} bytes, this layout needs {}", reply.shm_bytes, want);
  } else {
    s = SharedRegion::Open(reply.shm_path, reply.shm_bytes, reply.shm_nonce, &region_);
  }
  if (s.ok()) return "";
  region_.reset();
  return s.message();
}

bool ShmPath::Usable(const MessageHeader& h, bool* wait) const {
  *wait = false;
  if (!region_ || (h.type != MsgType::kPush && h.type != MsgType::kPull)) return false;
  if (h.dtype != DType::kF32 || h.encoding != Encoding::kDense) return false;  // lossy: frames
  if (!h.encodings.empty()) return false;  // sufficient factors: not the chunks' floats
  const auto& busy = BusyOf(h.type);
  for (uint32_t c : h.chunk_ids) {
    if (busy[c]) {
      *wait = true;
      return false;
    }
  }
  return true;
}

Status ShmPath::Send(const MessageHeader& h, const Frames& payload, Frames* frames) {
  MessageHeader only = h;
  only.flags |= kFlagShm;
  if (h.type == MsgType::kPush) {
    auto* area = reinterpret_cast<float*>(region_->payload());
    uint64_t bytes = 0;
    for (size_t i = 0; i < payload.size(); ++i) {
      std::memcpy(area + share_.offset[h.chunk_ids[i]], payload[i].data(), payload[i].size());
      bytes += payload[i].size();
    }
    sent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  frames->emplace_back();
  DP_RETURN_IF_ERROR(HeaderFrame(only, &frames->back()));
  auto& busy = BusyOf(h.type);
  for (uint32_t c : h.chunk_ids) busy[c] = 1;
  return Status::Ok();
}

void ShmPath::Release(const MessageHeader& h) {
  auto& busy = BusyOf(h.type);
  for (uint32_t c : h.chunk_ids) busy[c] = 0;
}

void ShmPath::ReadPull(const MessageHeader& h, std::span<float> out) const {
  const auto* area = reinterpret_cast<const float*>(region_->payload()) + share_.floats;  // after the push area
  uint64_t bytes = 0;
  for (uint32_t id : h.chunk_ids) {
    const Chunk& c = layout_.chunk(static_cast<int32_t>(id));
    std::memcpy(out.data() + c.flat_offset, area + share_.offset[static_cast<size_t>(c.id)],
                static_cast<size_t>(c.count) * sizeof(float));
    bytes += static_cast<uint64_t>(c.count) * sizeof(float);
  }
  received_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void ShmPath::ReadPull16(const MessageHeader& h, DType dtype, std::span<uint16_t> out) const {
  const auto* area = reinterpret_cast<const float*>(region_->payload()) + share_.floats;  // after the push area
  uint64_t bytes = 0;
  for (uint32_t id : h.chunk_ids) {
    const Chunk& c = layout_.chunk(static_cast<int32_t>(id));
    CastFloats(std::span<const float>(area + share_.offset[static_cast<size_t>(c.id)], static_cast<size_t>(c.count)),
               dtype, out.data() + c.flat_offset);
    bytes += static_cast<uint64_t>(c.count) * sizeof(float);
  }
  received_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace downpour
