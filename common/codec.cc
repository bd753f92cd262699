// codec.cc — see codec.h. The only file that builds or reads a capnp Header.
#include "common/codec.h"

#include <array>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "common/messages.capnp.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace downpour {
namespace cw = capnpwire;

// The header's enums are the schema's (messages.capnp is the source of truth): the same values,
// so a cast between them is exact, and kMax* are the schema's last enumerators.
template <typename Ours, typename Schema>
constexpr bool Same(Ours ours, Schema schema) {
  return static_cast<uint16_t>(ours) == static_cast<uint16_t>(schema);
}
static_assert(Same(DType::kF32, cw::DType::F32) && Same(DType::kF16, cw::DType::F16) &&
              Same(DType::kBf16, cw::DType::BF16));
static_assert(Same(Encoding::kDense, cw::Encoding::DENSE) && Same(Encoding::kTopK, cw::Encoding::TOP_K) &&
              Same(Encoding::kOneBit, cw::Encoding::ONE_BIT) && Same(Encoding::kFactors, cw::Encoding::FACTORS) &&
              kMaxEncoding == static_cast<uint16_t>(cw::Encoding::FACTORS));
static_assert(Same(Role::kUnknown, cw::Role::UNKNOWN) && Same(Role::kServer, cw::Role::SERVER) &&
              Same(Role::kWorker, cw::Role::WORKER) && Same(Role::kObserver, cw::Role::OBSERVER) &&
              Same(Role::kEvaluator, cw::Role::EVALUATOR));
static_assert(Same(MsgType::kInvalid, cw::MsgType::INVALID) && Same(MsgType::kRegister, cw::MsgType::REGISTER) &&
              Same(MsgType::kRegisterReply, cw::MsgType::REGISTER_REPLY) && Same(MsgType::kPull, cw::MsgType::PULL) &&
              Same(MsgType::kPullReply, cw::MsgType::PULL_REPLY) && Same(MsgType::kPush, cw::MsgType::PUSH) &&
              Same(MsgType::kAck, cw::MsgType::ACK) && Same(MsgType::kClock, cw::MsgType::CLOCK) &&
              Same(MsgType::kHeartbeat, cw::MsgType::HEARTBEAT) && Same(MsgType::kStats, cw::MsgType::STATS) &&
              Same(MsgType::kStatsReply, cw::MsgType::STATS_REPLY) &&
              Same(MsgType::kCheckpoint, cw::MsgType::CHECKPOINT) && Same(MsgType::kShutdown, cw::MsgType::SHUTDOWN) &&
              Same(MsgType::kError, cw::MsgType::ERROR) && kMaxMsgType == static_cast<uint16_t>(cw::MsgType::ERROR));

const char* MsgTypeName(MsgType t) {
  static constexpr const char* kNames[] = {"invalid", "register", "registerReply", "pull",
                                           "pullReply", "push", "ack", "clock", "heartbeat",
                                           "stats", "statsReply", "checkpoint", "shutdown", "error"};
  const auto i = static_cast<uint16_t>(t);
  return i <= kMaxMsgType ? kNames[i] : "unknown";
}

const char* RejectReasonName(RejectReason r) {
  static constexpr const char* kNames[] = {
      "undecodable",     "bad_type",        "not_registered", "layout_hash",  "model_id",       "unknown_chunk",
      "dtype",           "elem_count",      "byte_length",    "frame_count",  "non_finite",     "checksum",
      "duplicate_chunk", "not_initialized", "clock",          "unauthorized", "outside_run_dir", "version",
      "log_write",       "removed"};
  static_assert(std::size(kNames) == static_cast<size_t>(RejectReason::kCount));
  const auto i = static_cast<size_t>(r);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

namespace {

template <typename ListBuilder, typename T>
void FillList(ListBuilder list, const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) list.set(static_cast<unsigned>(i), v[i]);
}

template <typename T, typename ListReader>
std::vector<T> ReadList(ListReader list) {
  std::vector<T> v;
  v.reserve(list.size());
  for (auto x : list) v.push_back(static_cast<T>(x));
  return v;
}

Status CheckListLengths(const MessageHeader& h) {
  const size_t n = h.chunk_ids.size();
  auto bad = [&](const char* field, size_t got) {
    return InvalidArgument("header {}: field {} has {} entries but chunkIds has {}",
                           MsgTypeName(h.type), field, got, n);
  };
  if (!h.versions.empty() && h.versions.size() != n) return bad("versions", h.versions.size());
  if (!h.staleness.empty() && h.staleness.size() != n) return bad("staleness", h.staleness.size());
  if (!h.iters.empty() && h.iters.size() != n) return bad("scheduleIters", h.iters.size());
  if (!h.elem_counts.empty() && h.elem_counts.size() != n) return bad("elemCounts", h.elem_counts.size());
  if (!h.byte_lengths.empty() && h.byte_lengths.size() != n) return bad("byteLengths", h.byte_lengths.size());
  if (!h.checksums.empty() && h.checksums.size() != n) return bad("checksums", h.checksums.size());
  if (!h.encodings.empty() && h.encodings.size() != n) return bad("encodings", h.encodings.size());
  return Status::Ok();
}

void EncodeStats(const ShardStatsWire& s, cw::Stats::Builder b) {
  b.setPushesReceived(s.pushes_received);
  b.setPushesApplied(s.pushes_applied);
  b.setPushesRejected(s.pushes_rejected);
  FillList(b.initRejectedByReason(static_cast<unsigned>(s.rejected_by_reason.size())), s.rejected_by_reason);
  b.setChunkUpdates(s.chunk_updates);
  b.setPullsServed(s.pulls_served);
  b.setStalenessSum(s.staleness_sum);
  b.setStalenessMax(s.staleness_max);
  FillList(b.initStalenessHistogram(static_cast<unsigned>(s.staleness_histogram.size())), s.staleness_histogram);
  b.setDroppedLate(s.dropped_late);
  b.setCheckpointsWritten(s.checkpoints_written);
  b.setUndecodable(s.undecodable);
  b.setDuplicates(s.duplicates);
  b.setDcCompensated(s.dc_compensated);
  b.setDcUncompensated(s.dc_uncompensated);
  b.setEvaluatorPulls(s.evaluator_pulls);
  b.setDroppedPeers(s.dropped_peers);
  FillList(b.initPushesByWorker(static_cast<unsigned>(s.pushes_by_worker.size())), s.pushes_by_worker);
  b.setWalRecords(s.wal_records);
  b.setReplayed(s.replayed);
  b.setSgdNanos(s.sgd_ns);
  b.setBusyNanos(s.busy_ns);
  b.setRegionParts(s.region_parts);
  b.setWalNanos(s.wal_ns);
  b.setWalSyncCpuNanos(s.wal_sync_cpu_ns);
  b.setFactorNanos(s.factor_ns);
  b.setWalBytes(s.wal_bytes);
  b.setWalCodedRecords(s.wal_coded_records);
}

ShardStatsWire DecodeStats(cw::Stats::Reader r) {
  ShardStatsWire s;
  s.pushes_received = r.getPushesReceived();
  s.pushes_applied = r.getPushesApplied();
  s.pushes_rejected = r.getPushesRejected();
  s.rejected_by_reason = ReadList<uint64_t>(r.getRejectedByReason());
  s.chunk_updates = r.getChunkUpdates();
  s.pulls_served = r.getPullsServed();
  s.staleness_sum = r.getStalenessSum();
  s.staleness_max = r.getStalenessMax();
  s.staleness_histogram = ReadList<uint64_t>(r.getStalenessHistogram());
  s.dropped_late = r.getDroppedLate();
  s.checkpoints_written = r.getCheckpointsWritten();
  s.undecodable = r.getUndecodable();
  s.duplicates = r.getDuplicates();
  s.dc_compensated = r.getDcCompensated();
  s.dc_uncompensated = r.getDcUncompensated();
  s.evaluator_pulls = r.getEvaluatorPulls();
  s.dropped_peers = r.getDroppedPeers();
  s.pushes_by_worker = ReadList<uint64_t>(r.getPushesByWorker());
  s.wal_records = r.getWalRecords();
  s.replayed = r.getReplayed();
  s.sgd_ns = r.getSgdNanos();
  s.busy_ns = r.getBusyNanos();
  s.region_parts = r.getRegionParts();
  s.wal_ns = r.getWalNanos();
  s.wal_sync_cpu_ns = r.getWalSyncCpuNanos();
  s.factor_ns = r.getFactorNanos();
  s.wal_bytes = r.getWalBytes();
  s.wal_coded_records = r.getWalCodedRecords();
  return s;
}

Status DecodeInto(cw::Header::Reader r, MessageHeader* out) {
  if (r.getMagic() != kHeaderMagic) {
    return Corrupt("header: magic {:#x}, expected {:#x}", r.getMagic(), kHeaderMagic);
  }
  if (r.getVersion() != kHeaderVersion) {
    return Corrupt("header: schema version {}, expected {}", r.getVersion(), kHeaderVersion);
  }
  const auto type = static_cast<uint16_t>(r.getType());
  if (type == 0 || type > kMaxMsgType) return Corrupt("header: unknown message type {}", type);
  const auto dtype = static_cast<uint16_t>(r.getDtype());
  if (dtype > static_cast<uint16_t>(DType::kBf16)) return Corrupt("header: unknown dtype {}", dtype);
  const auto enc = static_cast<uint16_t>(r.getEncoding());
  if (enc > kMaxEncoding) return Corrupt("header: unknown encoding {}", enc);
  const auto role = static_cast<uint16_t>(r.getRole());
  if (role > static_cast<uint16_t>(Role::kEvaluator)) return Corrupt("header: unknown role {}", role);

  MessageHeader h;
  h.type = static_cast<MsgType>(type);
  h.sender = r.getSender();
  h.request_id = r.getRequestId();
  h.model_id = r.getModelId();
  h.clock = r.getClock();
  h.layout_hash = r.getLayoutHash();
  h.role = static_cast<Role>(role);
  h.flags = r.getFlags();
  h.chunk_ids = ReadList<uint32_t>(r.getChunkIds());
  h.versions = ReadList<int64_t>(r.getVersions());
  h.staleness = ReadList<int64_t>(r.getStaleness());
  h.iters = ReadList<int64_t>(r.getScheduleIters());
  h.move_batches = r.getMoveBatches();
  h.dtype = static_cast<DType>(dtype);
  h.encoding = static_cast<Encoding>(enc);
  h.elem_counts = ReadList<uint64_t>(r.getElemCounts());
  h.byte_lengths = ReadList<uint64_t>(r.getByteLengths());
  h.checksums = ReadList<uint32_t>(r.getChecksums());
  for (auto e : r.getEncodings()) {
    const auto v = static_cast<uint16_t>(e);
    if (v > kMaxEncoding) return Corrupt("header: unknown encoding {} in encodings", v);
    h.encodings.push_back(static_cast<Encoding>(v));
  }
  h.factor_batch = r.getFactorBatch();
  h.error_code = r.getErrorCode();
  h.error_text = r.getErrorText().cStr();
  h.assigned_id = r.getAssignedId();
  for (auto t : r.getServerAddresses()) h.server_addresses.emplace_back(t.cStr());
  h.server_count = r.getServerCount();
  h.worker_count = r.getWorkerCount();
  h.dead_workers = ReadList<int32_t>(r.getDeadWorkers());
  h.finished_workers = ReadList<int32_t>(r.getFinishedWorkers());
  h.shutdown = r.getShutdown();
  h.text = r.getText().cStr();
  const auto token = r.getToken();
  h.token.assign(reinterpret_cast<const char*>(token.begin()), token.size());
  h.session = r.getSession();
  h.incarnation = r.getIncarnation();
  h.gone_seq = r.getGoneSeq();
  h.slice_index = r.getSliceIndex();
  h.boot_id = r.getBootId().cStr();
  h.shm_path = r.getShmPath().cStr();
  h.shm_bytes = r.getShmBytes();
  h.shm_nonce = r.getShmNonce();
  if (r.hasStats()) h.stats = DecodeStats(r.getStats());
  DP_RETURN_IF_ERROR(CheckListLengths(h));
  *out = std::move(h);
  return Status::Ok();
}

}  // namespace

Status EncodeHeader(const MessageHeader& h, std::string* out) {
  DP_RETURN_IF_ERROR(CheckListLengths(h));
  capnp::MallocMessageBuilder message(256);
  auto b = message.initRoot<cw::Header>();
  b.setMagic(kHeaderMagic);
  b.setVersion(kHeaderVersion);
  b.setType(static_cast<cw::MsgType>(h.type));
  b.setSender(h.sender);
  b.setRequestId(h.request_id);
  b.setModelId(h.model_id);
  b.setClock(h.clock);
  b.setLayoutHash(h.layout_hash);
  b.setRole(static_cast<cw::Role>(h.role));
  b.setFlags(h.flags);
  auto n = [](const auto& v) { return static_cast<unsigned>(v.size()); };
  if (!h.chunk_ids.empty()) FillList(b.initChunkIds(n(h.chunk_ids)), h.chunk_ids);
  if (!h.versions.empty()) FillList(b.initVersions(n(h.versions)), h.versions);
  if (!h.staleness.empty()) FillList(b.initStaleness(n(h.staleness)), h.staleness);
  if (!h.iters.empty()) FillList(b.initScheduleIters(n(h.iters)), h.iters);
  b.setMoveBatches(h.move_batches);
  b.setDtype(static_cast<cw::DType>(h.dtype));
  b.setEncoding(static_cast<cw::Encoding>(h.encoding));
  if (!h.elem_counts.empty()) FillList(b.initElemCounts(n(h.elem_counts)), h.elem_counts);
  if (!h.byte_lengths.empty()) FillList(b.initByteLengths(n(h.byte_lengths)), h.byte_lengths);
  if (!h.checksums.empty()) FillList(b.initChecksums(n(h.checksums)), h.checksums);
  if (!h.encodings.empty()) {
    auto list = b.initEncodings(n(h.encodings));
    for (unsigned i = 0; i < list.size(); ++i) list.set(i, static_cast<cw::Encoding>(h.encodings[i]));
  }
  b.setFactorBatch(h.factor_batch);
  b.setErrorCode(h.error_code);
  if (!h.error_text.empty()) b.setErrorText(h.error_text);
  b.setAssignedId(h.assigned_id);
  if (!h.server_addresses.empty()) {
    auto list = b.initServerAddresses(n(h.server_addresses));
    for (unsigned i = 0; i < list.size(); ++i) list.set(i, h.server_addresses[i]);
  }
  b.setServerCount(h.server_count);
  b.setWorkerCount(h.worker_count);
  if (!h.dead_workers.empty()) FillList(b.initDeadWorkers(n(h.dead_workers)), h.dead_workers);
  if (!h.finished_workers.empty()) FillList(b.initFinishedWorkers(n(h.finished_workers)), h.finished_workers);
  b.setShutdown(h.shutdown);
  if (!h.text.empty()) b.setText(h.text);
  if (!h.token.empty()) {
    b.setToken(kj::arrayPtr(reinterpret_cast<const kj::byte*>(h.token.data()), h.token.size()));
  }
  b.setSession(h.session);
  b.setIncarnation(h.incarnation);
  b.setGoneSeq(h.gone_seq);
  b.setSliceIndex(h.slice_index);
  if (!h.boot_id.empty()) b.setBootId(h.boot_id);
  if (!h.shm_path.empty()) b.setShmPath(h.shm_path);
  b.setShmBytes(h.shm_bytes);
  b.setShmNonce(h.shm_nonce);
  if (h.type == MsgType::kStatsReply) EncodeStats(h.stats, b.initStats());
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  out->assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  return Status::Ok();
}

Status DecodeHeader(const void* data, size_t size, MessageHeader* out) {
  if (size == 0) return Corrupt("header: empty frame");
  if (size > kMaxHeaderBytes) {
    return Corrupt("header: {} bytes, more than the limit of {}", size, kMaxHeaderBytes);
  }
  if (size % sizeof(capnp::word) != 0) {
    return Corrupt("header: {} bytes is not a whole number of 8-byte words", size);
  }
  // Copy into word-aligned storage: receive buffers carry no alignment guarantee.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(words.begin(), data, size);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kMaxHeaderBytes / sizeof(capnp::word);
  options.nestingLimit = 8;
  Status status;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    // The reader accepts trailing bytes; a header frame must be exactly one message.
    if (reader.getEnd() != words.end()) {
      status = Corrupt("header: {} trailing bytes after the message",
                       (words.end() - reader.getEnd()) * sizeof(capnp::word));
      return;
    }
    status = DecodeInto(reader.getRoot<cw::Header>(), out);
  });
  KJ_IF_MAYBE(e, failure) {
    return Corrupt("header: undecodable ({} bytes): {}", size, e->getDescription().cStr());
  }
  return status;
}

uint32_t Crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
#if defined(__SSE4_2__)
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc = static_cast<uint32_t>(_mm_crc32_u64(crc, v));
    p += 8;
    size -= 8;
  }
  while (size--) crc = _mm_crc32_u8(crc, *p++);
#else
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  while (size--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
#endif
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace downpour

namespace downpour {

Status HeaderFrame(const MessageHeader& h, Frame* out) {
  std::string bytes;
  DP_RETURN_IF_ERROR(EncodeHeader(h, &bytes));
  *out = Frame::Copy(bytes);
  return Status::Ok();
}

Status ParseHeader(const Frames& frames, MessageHeader* out) {
  if (frames.empty()) return Corrupt("message has no frames");
  return DecodeHeader(frames[0].data(), frames[0].size(), out);
}

MessageHeader ErrorReply(const MessageHeader& request, const Status& status) {
  MessageHeader h;
  h.type = MsgType::kError;
  h.request_id = request.request_id;
  h.model_id = request.model_id;
  h.error_code = static_cast<uint16_t>(status.code());
  h.error_text = status.message();
  return h;
}

Status StatusFromReply(const MessageHeader& h) {
  if (h.type != MsgType::kError) return Status::Ok();
  auto code = static_cast<StatusCode>(h.error_code);
  if (h.error_code == 0 || h.error_code > static_cast<uint16_t>(StatusCode::kInternal)) {
    code = StatusCode::kInternal;
  }
  return Status(code, h.error_text);
}

}  // namespace downpour
