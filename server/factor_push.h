// factor_push.h — turns a push carrying sufficient factors (Encoding::kFactors chunks) into the
// equivalent dense f32 push, before the shard validates, logs and applies it (docs/factors.md).
//
// Wire (common/messages.capnp): a factor chunk covers flat elements [tensor_offset, +count) of
// an inner-product weight W (out×in, row-major; in = product of the dims after the first), so
// rows r0 = tensor_offset/in .. r1 = (tensor_offset+count-1)/in. Its frame holds δ[:, r0..r1],
// B × (r1-r0+1) floats (row b contiguous), B = MessageHeader::factor_batch. After the chunk
// frames comes ONE extra frame, a: B × in floats, shared by every factor chunk of the message;
// all factor chunks of one message belong to one tensor. The dense chunk is the slice of
// G = δᵀ·a (rows × in, one sgemm from oneDNN) that the chunk covers.
//
// Thread-safety: ExpandFactorPush touches only its arguments (oneDNN's sgemm may use OpenMP
// threads); its scratch pool belongs to one thread (a shard's factor expander,
// server/factor_expander.h).
// Ownership: the rewritten frames share their dense gradients' buffers (Frame::Borrow with a
// keepalive) with the pool they came from, which hands a buffer out again only once every frame
// has released it.
#pragma once

#include <limits>
#include <vector>

#include "common/buffer_pool.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/transport.h"

namespace downpour {

// The largest factor_batch a server takes (a batch beyond it is a corrupt header, not a net).
inline constexpr uint32_t kMaxFactorBatch = 65536;

// True when some chunk of `h` is sent as sufficient factors.
bool HasFactorChunks(const MessageHeader& h);

// Validates the factor chunks of a push (frames[0] is the header) and rewrites `h` and `frames`
// into the same push with those chunks dense: each factor chunk's frame becomes its count f32
// gradient, its encoding kDense, the a frame is dropped, checksums (verified here for every
// chunk) are cleared, factor_batch is 0. Chunks of other encodings are left as they are. A push
// without factor chunks is left untouched; a rewritten push is f32. Refusals (nothing rewritten):
// `reason` says why — kDType (init push, dtype not f32 / f16 / bf16, a dense chunk in a 16-bit
// message, factor chunks of two tensors or of a tensor that is not 2-D or more), kFrameCount
// (list or frame counts, missing a frame), kUnknownChunk (chunk id out of range), kElemCount
// (factor_batch outside 1..kMaxFactorBatch, element count not the layout's), kByteLength (a
// frame not exactly B×rows or B×in values of the dtype), kChecksum (over the bytes as sent),
// kNonFinite (NaN or Inf in δ or a, or an Inf where their product overflows). Every chunk it
// rewrites is finite, so the caller need not scan it again: `expanded` (when given) gets, per
// chunk of the message, whether it was rewritten. Finite by proof where max over rows of
// Σ_b |δ[b][row]| × max |a| stays well below FLT_MAX (kFactorProductBound; nothing of the product
// is read), else by a scan of the chunk's rows right after its sgemm, on the thread that formed
// them. The dense gradients are written into buffers of `scratch`, reused from push to push
// (common/buffer_pool.h; nullptr: each in a buffer of its own, freed with the frame), by
// `threads` OpenMP threads, one chunk's sgemm per thread at a time (the same floats whatever the
// count: each chunk is one sgemm on one thread).
Status ExpandFactorPush(const ParamLayout& layout, MessageHeader* h, Frames* frames, RejectReason* reason,
                        BufferPool<float>* scratch = nullptr, int threads = 1, std::vector<bool>* expanded = nullptr);

// |δᵀa| ≤ Σ_b |δ_b,row| × max |a| element by element, and an fp32 sgemm's result exceeds that sum
// by at most a relative B·2⁻²⁴ (≤ 0.4% for B ≤ kMaxFactorBatch), as does the rounded Σ_b: below
// a quarter of FLT_MAX, no element of the formed product can be Inf.
inline constexpr double kFactorProductBound = static_cast<double>(std::numeric_limits<float>::max()) / 4;

}  // namespace downpour
