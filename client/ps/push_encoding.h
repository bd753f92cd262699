// push_encoding.h — a lossy push part on its way out: its f32 gradient chunks, borrowed from the
// caller, become the codec's bytes (common/grad_codec.h ChunkEncoder, with its per-chunk
// residuals), and its header says what it now carries. Done once, at a part's first send; a
// resend sends the same bytes, so a residual is never counted twice.
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

}  // namespace downpour
