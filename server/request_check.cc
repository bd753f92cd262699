// request_check.cc — see request_check.h.
#include "server/request_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "common/grad_codec.h"

namespace downpour {

Status ResolveChunkIds(const PushRules& rules, const MessageHeader& h, bool all_if_empty, std::vector<int>* locals,
                       RejectReason* reason) {
  locals->clear();
  if (h.chunk_ids.empty() && all_if_empty) {
    for (size_t i = 0; i < rules.owned; ++i) locals->push_back(static_cast<int>(i));
    return Status::Ok();
  }
  std::vector<bool> seen(rules.owned, false);
  for (uint32_t id : h.chunk_ids) {
    if (id >= rules.local_of.size()) {
      *reason = RejectReason::kUnknownChunk;
      return InvalidArgument("{}: chunk id {} is unknown (layout has {} chunks)", MsgTypeName(h.type), id,
                             rules.local_of.size());
    }
    const int local = rules.local_of[id];
    if (local < 0) {
      *reason = RejectReason::kUnknownChunk;
      return InvalidArgument("{}: chunk {} belongs to server {}, not server {}", MsgTypeName(h.type), id,
                             rules.layout->chunk(static_cast<int32_t>(id)).server, rules.server_id);
    }
    if (seen[static_cast<size_t>(local)]) {
      *reason = RejectReason::kDuplicateChunk;
      return InvalidArgument("{}: chunk {} listed twice", MsgTypeName(h.type), id);
    }
    seen[static_cast<size_t>(local)] = true;
    locals->push_back(local);
  }
  return Status::Ok();
}

Status CheckDensePush(const PushRules& rules, const MessageHeader& h, const Frames& frames,
                      const std::function<ChunkFacts(int local)>& facts, const std::vector<bool>& finite,
                      CheckedPush* out, RejectReason* reason) {
  const ParamLayout& layout = *rules.layout;
  const bool init = (h.flags & kFlagInit) != 0;
  const bool elastic = (h.flags & kFlagElastic) != 0;
  const bool move = (h.flags & kFlagMove) != 0;
  const bool exchanges = ExchangesModels(rules.algorithm);
  if (move) {
    *reason = RejectReason::kClock;  // the consistency policy's refusal
    if (!rules.model_moves) {
      return InvalidArgument("push: a model move (multi-model runs), but this server serves one model");
    }
    if (init || elastic) return InvalidArgument("push: a model move cannot also be an init push or an exchange");
    if (h.move_batches < 1 || h.move_batches > kMaxMoveBatches) {
      return InvalidArgument("push: a model move of {} batches (valid: 1..{})", h.move_batches, kMaxMoveBatches);
    }
  } else if (!init && elastic != exchanges) {
    *reason = RejectReason::kClock;  // the consistency policy's refusal
    if (exchanges)
      return InvalidArgument("push: a gradient push to a \"{}\" server (it takes elastic exchanges only)",
                             AlgorithmString(rules.algorithm));
    return InvalidArgument("push: an elastic exchange, but this run's consistency.algorithm is \"{}\"",
                           AlgorithmString(rules.algorithm));
  }
  if (h.dtype != DType::kF32 || h.encoding != Encoding::kDense) {
    *reason = RejectReason::kDType;
    return InvalidArgument("push: dtype {} / encoding {} not supported (server takes f32 dense)",
                           static_cast<int>(h.dtype), static_cast<int>(h.encoding));
  }
  const size_t n = h.chunk_ids.size();
  if (n == 0) {
    *reason = RejectReason::kFrameCount;
    return InvalidArgument("push: no chunks");
  }
  if (frames.size() != n + 1 || h.elem_counts.size() != n || h.byte_lengths.size() != n ||
      (!init && h.versions.size() != n)) {
    *reason = RejectReason::kFrameCount;
    return InvalidArgument("push: {} chunk ids but {} payload frames, {} elemCounts, {} byteLengths, {} versions", n,
                           frames.size() - 1, h.elem_counts.size(), h.byte_lengths.size(), h.versions.size());
  }
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules, h, /*all_if_empty=*/false, &out->locals, reason));
  // Per-chunk checks. Payloads are read in place when aligned; misaligned ones are copied once.
  out->scratch.assign(n, {});
  out->chunks.assign(n, PushChunk{});
  for (size_t i = 0; i < n; ++i) {
    const uint32_t id = h.chunk_ids[i];
    const int64_t count = layout.chunk(static_cast<int32_t>(id)).count;
    if (h.elem_counts[i] != static_cast<uint64_t>(count)) {
      *reason = RejectReason::kElemCount;
      return InvalidArgument("push: chunk {} has {} elements in the layout, header says {}", id, count,
                             h.elem_counts[i]);
    }
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(float);
    if (h.byte_lengths[i] != bytes || frames[i + 1].size() != bytes) {
      *reason = RejectReason::kByteLength;
      return InvalidArgument("push: chunk {} needs {} bytes; header says {}, frame has {}", id, bytes,
                             h.byte_lengths[i], frames[i + 1].size());
    }
    if (!h.checksums.empty()) {
      const uint32_t crc = Crc32c(frames[i + 1].data(), frames[i + 1].size());
      if (crc != h.checksums[i]) {
        *reason = RejectReason::kChecksum;
        return Corrupt("push: chunk {} CRC-32C {:#010x}, header says {:#010x}", id, crc, h.checksums[i]);
      }
    }
    const float* data = AlignedFloats(frames[i + 1], &out->scratch[i]);
    const bool known_finite = i < finite.size() && finite[i];
    if (!known_finite && !rules.all_finite(std::span<const float>(data, static_cast<size_t>(count)))) {
      *reason = RejectReason::kNonFinite;
      return InvalidArgument("push: chunk {} (tensor '{}') holds NaN or Inf", id,
                             layout.tensors()[static_cast<size_t>(layout.chunk(static_cast<int32_t>(id)).tensor)].name);
    }
    const int local = out->locals[i];
    const ChunkFacts f = facts(local);
    if (!init && !f.initialized) {
      *reason = RejectReason::kNotInitialized;
      return FailedPrecondition("push: gradient for chunk {} before its weights were initialised", id);
    }
    if (!init && (h.versions[i] < 0 || h.versions[i] > f.version)) {
      *reason = RejectReason::kVersion;
      return InvalidArgument("push: chunk {} computed from version {}, but the chunk is at version {} (valid: 0..{})",
                             id, h.versions[i], f.version, f.version);
    }
    out->chunks[i] = PushChunk{local, data, count, init ? 0 : h.versions[i], nullptr};
  }
  return Status::Ok();
}

bool CodedPush(const MessageHeader& h) {
  if (h.dtype != DType::kF32 || h.encoding != Encoding::kDense) return true;
  return std::any_of(h.encodings.begin(), h.encodings.end(), [](Encoding e) { return e != Encoding::kDense; });
}

Status DecodeCodedPush(const PushRules& rules, const MessageHeader& h, const Frames& frames, MessageHeader* dense,
                       Frames* decoded, RejectReason* reason) {
  const ParamLayout& layout = *rules.layout;
  *reason = RejectReason::kDType;
  if ((h.flags & kFlagInit) != 0) {
    return InvalidArgument("push: initial weights must be f32 dense (got dtype {} / encoding {})",
                           static_cast<int>(h.dtype), static_cast<int>(h.encoding));
  }
  if ((h.flags & kFlagShm) != 0) {
    return InvalidArgument("push: a payload in shared memory must be f32 dense (got dtype {} / encoding {})",
                           static_cast<int>(h.dtype), static_cast<int>(h.encoding));
  }
  const size_t n = h.chunk_ids.size();
  if (n == 0 || frames.size() != n + 1 || h.elem_counts.size() != n || h.byte_lengths.size() != n ||
      h.versions.size() != n) {
    *reason = RejectReason::kFrameCount;
    return InvalidArgument("push: {} chunk ids but {} payload frames, {} elemCounts, {} byteLengths, {} versions", n,
                           frames.size() - 1, h.elem_counts.size(), h.byte_lengths.size(), h.versions.size());
  }
  std::vector<int> locals;
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules, h, /*all_if_empty=*/false, &locals, reason));
  uint64_t total = 0;
  for (uint32_t id : h.chunk_ids) total += static_cast<uint64_t>(layout.chunk(static_cast<int32_t>(id)).count);
  auto floats = std::make_shared<std::vector<float>>(total);
  *dense = h;
  dense->dtype = DType::kF32;
  dense->encoding = Encoding::kDense;
  dense->encodings.clear();
  dense->checksums.clear();  // checked here, over the bytes that came
  decoded->assign(1, frames[0]);
  uint64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t id = h.chunk_ids[i];
    const auto count = static_cast<uint64_t>(layout.chunk(static_cast<int32_t>(id)).count);
    const Encoding encoding = h.encodings.empty() ? h.encoding : h.encodings[i];
    if (encoding == Encoding::kFactors) {
      // Sufficient factors are formed into a dense gradient elsewhere (issue 14, h2); not here.
      *reason = RejectReason::kDType;
      return InvalidArgument("push: chunk {} is sufficient factors, which this server does not take", id);
    }
    if (h.elem_counts[i] != count) {
      *reason = RejectReason::kElemCount;
      return InvalidArgument("push: chunk {} has {} elements in the layout, header says {}", id, count,
                             h.elem_counts[i]);
    }
    const Frame& f = frames[i + 1];
    if (h.byte_lengths[i] != f.size()) {
      *reason = RejectReason::kByteLength;
      return InvalidArgument("push: chunk {} frame has {} bytes, header says {}", id, f.size(), h.byte_lengths[i]);
    }
    if (!h.checksums.empty() && Crc32c(f.data(), f.size()) != h.checksums[i]) {
      *reason = RejectReason::kChecksum;
      return Corrupt("push: chunk {} CRC-32C {:#010x}, header says {:#010x}", id, Crc32c(f.data(), f.size()),
                     h.checksums[i]);
    }
    CodecFault fault = CodecFault::kNone;
    const std::span<float> out(floats->data() + at, static_cast<size_t>(count));
    const Status s = DecodeChunk(encoding, h.dtype, std::span<const std::byte>(f.data(), f.size()), out, id, &fault);
    if (!s.ok()) {
      *reason = fault == CodecFault::kLength      ? RejectReason::kByteLength
                : fault == CodecFault::kIndex     ? RejectReason::kElemCount
                : fault == CodecFault::kNonFinite ? RejectReason::kNonFinite
                                                  : RejectReason::kDType;
      return Status(s.code(), fmt::format("push: {}", s.message()));
    }
    dense->byte_lengths[i] = count * sizeof(float);
    decoded->push_back(Frame::Borrow(out.data(), out.size_bytes(), floats));
    at += count;
  }
  return Status::Ok();
}

}  // namespace downpour
