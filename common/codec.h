// codec.h — the one codec between a wire Header (common/messages.capnp) and its plain C++
// mirror, MessageHeader. Every message type uses the same struct; fields a type does not use
// keep their defaults. Payload frames are never encoded here: the header only describes them.
//
// Decoding is defensive: any byte string (garbage, truncated, oversized, wrong magic or
// version, unknown enum values, list lengths that disagree) yields an error Status, never a
// crash or an exception (Cap'n Proto reader limits + kj exceptions caught).
//
// Thread-safety: free functions over values; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport.h"

namespace downpour {

enum class MsgType : uint16_t {
  kInvalid = 0,
  kRegister = 1,
  kRegisterReply = 2,
  kPull = 3,
  kPullReply = 4,
  kPush = 5,
  kAck = 6,
  kClock = 7,
  kHeartbeat = 8,
  kStats = 9,
  kStatsReply = 10,
  kCheckpoint = 11,
  kShutdown = 12,
  kError = 13,
};
inline constexpr uint16_t kMaxMsgType = 13;
const char* MsgTypeName(MsgType t);

enum class DType : uint16_t { kF32 = 0, kF16 = 1, kBf16 = 2 };
enum class Encoding : uint16_t { kDense = 0, kTopK = 1, kOneBit = 2, kFactors = 3 };
inline constexpr uint16_t kMaxEncoding = 3;
// kEvaluator: the run's one evaluator process (downpour-evaluator), which pulls snapshots only.
enum class Role : uint16_t { kUnknown = 0, kServer = 1, kWorker = 2, kObserver = 3, kEvaluator = 4 };

// Bytes per element of a dense payload of `dtype`.
inline size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }
// "f32" | "f16" | "bf16" (the schema's names), for messages.
inline const char* DTypeName(DType d) {
  return d == DType::kF32 ? "f32" : d == DType::kF16 ? "f16" : d == DType::kBf16 ? "bf16" : "unknown";
}

// Why a server refused a message; indexes ShardStatsWire::rejected_by_reason.
enum class RejectReason : uint16_t {
  kUndecodable = 0,  // header is not a valid Header
  kBadType,          // type a server does not serve
  kNotRegistered,    // sender id unknown / not matching the peer
  kLayoutHash,       // layout hash differs from the server's
  kModelId,          // model id unknown
  kUnknownChunk,     // chunk id out of range or owned by another server
  kDType,            // dtype / encoding not supported
  kElemCount,        // element count differs from the layout's chunk size
  kByteLength,       // payload frame length differs from the header / count
  kFrameCount,       // number of payload frames differs from the chunk list
  kNonFinite,        // NaN or Inf in a gradient
  kChecksum,         // CRC-32C mismatch
  kDuplicateChunk,   // same chunk twice in one push
  kNotInitialized,   // gradient for a chunk that has no weights yet
  kClock,            // refused by the consistency policy (e.g. sync: wrong clock)
  kUnauthorized,     // the peer's role / token does not allow it (server/access.h)
  kOutsideRunDir,    // checkpoint path from the wire resolves outside the run directory
  kVersion,          // a push's version_from is negative or ahead of the chunk's version
  kLogWrite,         // the server's write-ahead log could not be written: nothing was taken
  kRemoved,          // the sender's worker was declared dead: this process is out of the run
  kCount
};
const char* RejectReasonName(RejectReason r);

inline constexpr uint32_t kHeaderMagic = 0x44504D31;  // "DPM1"
inline constexpr uint16_t kHeaderVersion = 1;
// Header frames larger than this are refused before parsing (a header is a few KiB at most:
// AlexNet has 68 chunks at the default chunk size).
inline constexpr size_t kMaxHeaderBytes = size_t{4} << 20;
inline constexpr uint32_t kFlagInit = 1u << 0;  // push: set weights (init), not a gradient
// heartbeat from a worker: it has finished training and pushes no more (the coordinator
// reports it with the dead workers at once, so sync/ssp stop waiting for it).
inline constexpr uint32_t kFlagFinished = 1u << 1;
// heartbeat from a worker: it is done with everything (final evaluation, model saved) and is
// about to exit; once every worker is done or dead the coordinator ends the run (cluster mode,
// where no launcher sees every process exit).
inline constexpr uint32_t kFlagDone = 1u << 2;
// register: the worker asks for a shared-memory region (common/shm_region.h); push / pull / pull
// reply: the payload is in that region, not in frames (ps_client.h "Shared memory").
inline constexpr uint32_t kFlagShm = 1u << 3;
// push: an elastic-averaging exchange (EASGD, consistency.algorithm = "easgd"): the payload is
// α(x_worker − x_center) for each chunk, which the server adds to its weights as it is (no
// learning rate, momentum or decay). Refused by a server whose run is not EASGD, and vice versa.
inline constexpr uint32_t kFlagElastic = 1u << 4;
// push: a model moves on (multi-model runs, common/rotation.h): a stage of local training ended
// and the payload is, per chunk, the change of the weights over the stage divided by the stage's
// group size (w_end − w_pulled) / g, which the server adds as it is (no learning rate, momentum
// or decay) and counts as one update; header.move_batches (>= 1) is the batches trained, by
// which the chunks' lr-schedule iteration advances. Taken only by a multi-model server
// (ShardOptions::model_moves).
inline constexpr uint32_t kFlagMove = 1u << 5;
inline constexpr uint32_t kMaxMoveBatches = 1u << 24;  // a move push's move_batches: 1..this
// heartbeat reply to a worker: the coordinator declared it dead (silent past the heartbeat
// timeout: the process was stopped or cut off) while it was away. The process is out of the run
// and must stop; a restart (a new process, downpour-worker --resume) joins it again.
inline constexpr uint32_t kFlagRemoved = 1u << 6;

struct ShardStatsWire {
  uint64_t pushes_received = 0;
  uint64_t pushes_applied = 0;
  uint64_t pushes_rejected = 0;
  std::vector<uint64_t> rejected_by_reason;  // size RejectReason::kCount
  uint64_t chunk_updates = 0;
  uint64_t pulls_served = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  std::vector<uint64_t> staleness_histogram;
  uint64_t dropped_late = 0;
  uint64_t checkpoints_written = 0;
  uint64_t undecodable = 0;
  uint64_t duplicates = 0;                // pushes already taken, acknowledged again (resends)
  uint64_t dc_compensated = 0;            // DC-ASGD: chunk gradients compensated for their delay
  uint64_t dc_uncompensated = 0;          // DC-ASGD: chunk gradients applied as pushed (no matching pull copy)
  uint64_t evaluator_pulls = 0;           // pulls served to the evaluator (not in pulls_served)
  uint64_t dropped_peers = 0;             // peers dropped for not reading their replies
  std::vector<uint64_t> pushes_by_worker;  // gradient pushes taken per worker id
  uint64_t wal_records = 0;
  uint64_t replayed = 0;
  uint64_t sgd_ns = 0;   // in the update rule
  uint64_t busy_ns = 0;  // handling messages on the loop thread
  uint64_t region_parts = 0;  // push / pull messages whose payload went through shared memory
  uint64_t wal_ns = 0;           // the loop's time appending to the write-ahead log (part of busy_ns)
  uint64_t wal_sync_cpu_ns = 0;  // CPU time of the log's fsync thread (not on the loop)
  uint64_t factor_ns = 0;        // the factor expander's time forming factor pushes' dense gradients (beside the loop)
  uint64_t wal_bytes = 0;          // bytes appended to the write-ahead log
  uint64_t wal_coded_records = 0;  // of wal_records, pushes logged as the wire carried them
  bool operator==(const ShardStatsWire&) const = default;
};

// Plain mirror of capnp Header. See messages.capnp for what each field means per type.
struct MessageHeader {
  MsgType type = MsgType::kInvalid;
  int32_t sender = -1;
  uint64_t request_id = 0;
  uint32_t model_id = 0;
  int64_t clock = 0;
  uint64_t layout_hash = 0;
  Role role = Role::kUnknown;
  uint32_t flags = 0;

  std::vector<uint32_t> chunk_ids;
  std::vector<int64_t> versions;
  DType dtype = DType::kF32;
  Encoding encoding = Encoding::kDense;
  std::vector<uint64_t> elem_counts;
  std::vector<uint64_t> byte_lengths;
  std::vector<uint32_t> checksums;
  std::vector<Encoding> encodings;  // per chunk (push); empty = all `encoding`
  uint32_t factor_batch = 0;        // push with factor chunks: rows of delta / activations
  std::vector<int64_t> staleness;   // ack of a gradient push: per chunk, as the server measured (-1: not applied)
  std::vector<int64_t> iters;       // pull reply: per chunk, its lr-schedule iteration (batches applied)
  uint32_t move_batches = 0;        // push with kFlagMove: batches the stage trained

  uint16_t error_code = 0;  // StatusCode
  std::string error_text;

  int32_t assigned_id = -1;
  std::vector<std::string> server_addresses;
  int32_t server_count = 0;
  int32_t worker_count = 0;
  std::vector<int32_t> dead_workers;      // gone: silent past the heartbeat timeout, or finished
  std::vector<int32_t> finished_workers;  // the gone ones that finished normally
  bool shutdown = false;
  std::string text;
  std::string token;  // bytes: the run's secret on register / admin messages (server/access.h)
  uint64_t session = 0;      // push/register: the sending client's session (see messages.capnp)
  uint64_t incarnation = 0;  // replies: the answering process's incarnation
  uint64_t gone_seq = 0;     // heartbeat: membership changes seen / the coordinator's newest
  int32_t slice_index = -1;  // heartbeat reply to a worker: its rank among the live workers
  std::string boot_id;       // register asking for shared memory: the worker's host boot id
  std::string shm_path;      // register reply: the offered region ("" = none), its payload
  uint64_t shm_bytes = 0;    //   size and nonce (common/shm_region.h)
  uint64_t shm_nonce = 0;

  ShardStatsWire stats;

  bool operator==(const MessageHeader&) const = default;
};

// Serialises `h` as a flat (unpacked) Cap'n Proto message. Fails only on inconsistent list
// lengths (versions / counts / lengths / checksums must be empty or match chunk_ids).
Status EncodeHeader(const MessageHeader& h, std::string* out);

// Parses a header frame. Errors: kCorrupt for undecodable bytes, kInvalidArgument for a valid
// message with bad field values; never throws.
Status DecodeHeader(const void* data, size_t size, MessageHeader* out);

// CRC-32C (Castagnoli) of a payload, for the optional per-frame checksum.
uint32_t Crc32c(const void* data, size_t size);

}  // namespace downpour

// ---- Helpers shared by server and client: build / parse whole messages. ----
namespace downpour {

// Encodes `h` into a header frame (owning).
Status HeaderFrame(const MessageHeader& h, Frame* out);

// Decodes frames[0] of a received message.
Status ParseHeader(const Frames& frames, MessageHeader* out);

// An error reply to `request`: type kError, same request id / model id, the status' code/text.
MessageHeader ErrorReply(const MessageHeader& request, const Status& status);

// The Status carried by an error reply (kOk if `h` is not an error).
Status StatusFromReply(const MessageHeader& h);

}  // namespace downpour
