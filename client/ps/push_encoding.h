// push_encoding.h — a lossy push part, or a part of sufficient factors, on its way out: its f32
// chunks, borrowed from the caller, become the codec's bytes (common/grad_codec.h ChunkEncoder,
// with its per-chunk residuals; factors in the codec's 16 bits), and its header says what it now
// carries. Done once, at a part's first send; a resend sends the same bytes, so a residual is
// never counted twice.
//
// Thread-safety: one link's I/O thread (the encoder's residuals are that link's).
#pragma once

#include <cstdint>

#include "common/codec.h"
#include "common/grad_codec.h"
#include "common/transport.h"

namespace downpour {

// Replaces `*payload` (one f32 frame per chunk of `h`) by the encoded frames, releasing the
// caller's buffers, and fixes `*h`: each chunk's byte length and checksum (when the header has
// checksums), and per-chunk encodings where a chunk's differs from the codec's (top-k of a small
// chunk goes dense). Returns the payload bytes now to send.
uint64_t EncodePushPart(ChunkEncoder& encoder, MessageHeader* h, Frames* payload);

// The dtype a push's sufficient factors travel in: the push codec's when it is fp16 or bf16,
// else f32 (top-k and 1-bit apply to dense chunks only; docs/factors.md).
DType FactorDType(WireCodec push);

// A message of sufficient factors (`*payload`: its δ blocks, then the activations frame, all
// f32; `*h`: its chunks) made ready to send in `dtype`: for f16 / bf16 each frame replaced by its
// 16-bit values as the host encoder casts them (EncodeDense), all in one buffer the frames share,
// releasing the caller's; then h's dtype, byte lengths and (when it has them) checksums over the
// bytes sent. A message with a value that has no finite 16-bit form (NaN, Inf, or beyond fp16's
// ±65504) stays f32 as it is: the server refuses a non-finite one. `cast`: the frames hold
// `dtype`'s values already (cast by the worker's device, Inf or NaN included, as its dense
// chunks): only the header is filled in. Returns the payload bytes.
uint64_t EncodeFactorPart(DType dtype, bool cast, MessageHeader* h, Frames* payload);

}  // namespace downpour
