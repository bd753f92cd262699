// request_check.h — the checks a shard makes of a request before it touches any state, as pure
// functions of the message, the layout and the shard's rules: which of its chunks a request
// names (ResolveChunkIds, every request), a lossy push decoded to f32 (DecodeCodedPush), and
// whether a dense f32 push may be taken at all
// (CheckDensePush: its flags against the run, its dtype and frame counts, and per chunk the
// element count, byte length, CRC-32C, finite values, initialisation and version range). The
// shard (shard.h) runs them, then the consistency policy's own check, then logs and applies.
// Every refusal names the field and sets the RejectReason the shard counts it under; a push is
// checked whole, so a refused one leaves nothing half taken.
//
// Thread-safety: pure functions of their arguments (PushRules::all_finite may use threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/config/consistency.h"
#include "common/status.h"
#include "common/transport.h"
#include "server/consistency.h"

namespace downpour {

// What a shard takes.
struct PushRules {
  const ParamLayout* layout = nullptr;
  std::span<const int> local_of;  // chunk id -> index among the shard's chunks; -1 = another server's
  size_t owned = 0;               // the shard's chunks
  int32_t server_id = 0;
  Algorithm algorithm = Algorithm::kSgd;  // ExchangesModels: elastic exchanges only
  bool model_moves = false;               // a multi-model server: kFlagMove pushes
  // Whether every value is finite (the shard runs the check on its threads).
  std::function<bool(std::span<const float>)> all_finite;
};

// What the shard knows of one of its chunks.
struct ChunkFacts {
  bool initialized = false;
  int64_t version = 0;
};

// The chunk ids of `h` as local indices, in order: each owned by this server (kUnknownChunk)
// and named once (kDuplicateChunk). `all_if_empty`: no ids = all the shard's chunks (a pull of
// everything).
Status ResolveChunkIds(const PushRules& rules, const MessageHeader& h, bool all_if_empty, std::vector<int>* locals,
                       RejectReason* reason);

// A dense f32 push that passed: per chunk its local index, its gradient (in the frame when
// aligned, else copied once into `scratch`), element count and the version it was computed from
// (0 for an init push).
struct CheckedPush {
  std::vector<int> locals;
  std::vector<PushChunk> chunks;
  std::vector<std::vector<float>> scratch;
};

// Whether `h` is a lossy push (dtype or some chunk's encoding not f32 dense, common/grad_codec.h),
// which DecodeCodedPush turns into a dense one before CheckDensePush.
bool CodedPush(const MessageHeader& h);

// A lossy push decoded into `dense` / `decoded` (f32 dense frames; CRC-32C checked over the bytes
// that came, then dropped), every frame validated whole before a float is written (DecodeChunk),
// so the decoded values are finite. kDType for what is not taken: an init push or a shared-memory
// payload not f32 dense, a sufficient-factors chunk (server/factor_push.h forms those first); a
// codec fault under the reason it maps to.
Status DecodeCodedPush(const PushRules& rules, const MessageHeader& h, const Frames& frames, MessageHeader* dense,
                       Frames* decoded, RejectReason* reason);

// Checks the push `h` with payload `frames` (header frame first) against `rules` and the facts
// of its chunks (`facts(local)`); `finite[i]` = chunk i is already known finite (decoded lossy
// chunks). Fills `out` when it may be taken; otherwise the error, with *reason set.
Status CheckDensePush(const PushRules& rules, const MessageHeader& h, const Frames& frames,
                      const std::function<ChunkFacts(int local)>& facts, const std::vector<bool>& finite,
                      CheckedPush* out, RejectReason* reason);

}  // namespace downpour
