// wal_test.cc — the write-ahead log file (server/wal.h): records round-trip exactly (a coded
// push's frames too, aligned, and a malformed one is refused naming the field); a torn
// last record is reported as a torn tail (safe to drop); a damaged record followed by valid
// data, a wrong magic and a sequence gap are errors naming the file, the byte offset and the
// field; a restarted log continues the sequence.
#include "server/wal.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/codec.h"
#include "common/env.h"
#include "common/file_io.h"
#include "common/tensor_file.h"
#include "tests/testing/fault_env.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

std::string TestPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/wal_test";
  std::filesystem::create_directories(dir);
  const std::string p = dir + "/" + name;
  std::filesystem::remove(p);
  return p;
}

std::vector<WalRecord> Scan(const std::string& path, WalScanInfo* info, Status* status,
                            std::vector<std::vector<float>>* data = nullptr) {
  std::vector<WalRecord> out;
  *status = ScanWal(path, [&](const WalRecord& r) {
    out.push_back(r);
    if (data) {
      for (const WalChunk& c : r.chunks) data->emplace_back(c.data, c.data + c.count);
    }
    for (WalChunk& c : out.back().chunks) c.data = nullptr;  // points into the mapping
    return Status::Ok();
  }, info);
  return out;
}

// Writes three records: an init push, a clock, a gone.
void WriteThree(const std::string& path, const std::vector<float>& g) {
  std::unique_ptr<WalWriter> w;
  ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
  WalRecord push;
  push.kind = WalKind::kPush;
  push.worker = 3;
  push.flags = 1;
  push.session = 0xABCDEF0123456789ull;
  push.request_id = 42;
  push.clock = 7;
  push.chunks = {WalChunk{5, 2, g.data(), static_cast<uint32_t>(g.size())},
                 WalChunk{9, 0, g.data(), 2}};
  ASSERT_TRUE(w->Append(&push).ok());
  WalRecord clock;
  clock.kind = WalKind::kClock;
  clock.worker = 1;
  clock.clock = 11;
  ASSERT_TRUE(w->Append(&clock).ok());
  WalRecord gone;
  gone.kind = WalKind::kGone;
  gone.worker = 2;
  gone.finished = true;
  ASSERT_TRUE(w->Append(&gone).ok());
  EXPECT_EQ(w->next_seq(), 4u);
}

std::string Bytes(const std::string& path) {
  std::string b;
  EXPECT_TRUE(ReadWholeFile(path, "log", &b).ok());
  return b;
}

// The log's records, without the zero padding a direct writer leaves after them while open.
std::string Logged(const std::string& path) {
  WalScanInfo info;
  EXPECT_TRUE(ScanWal(path, nullptr, &info).ok());
  EXPECT_FALSE(info.torn) << info.torn_reason;
  return Bytes(path).substr(0, info.valid_bytes);
}

void Overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Wal, RecordsRoundTripExactly) {
  const std::string path = TestPath("roundtrip.wal");
  const std::vector<float> g = {1.5f, -2.25f, 3.0f, 1e-30f};
  WriteThree(path, g);
  WalScanInfo info;
  Status s;
  std::vector<std::vector<float>> data;
  auto recs = Scan(path, &info, &s, &data);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_FALSE(info.torn);
  EXPECT_EQ(info.first_seq, 1u);
  EXPECT_EQ(info.last_seq, 3u);
  EXPECT_EQ(info.valid_bytes, info.file_bytes);
  EXPECT_EQ(recs[0].kind, WalKind::kPush);
  EXPECT_EQ(recs[0].seq, 1u);
  EXPECT_EQ(recs[0].worker, 3);
  EXPECT_EQ(recs[0].flags, 1u);
  EXPECT_EQ(recs[0].session, 0xABCDEF0123456789ull);
  EXPECT_EQ(recs[0].request_id, 42u);
  EXPECT_EQ(recs[0].clock, 7);
  ASSERT_EQ(recs[0].chunks.size(), 2u);
  EXPECT_EQ(recs[0].chunks[0].chunk_id, 5u);
  EXPECT_EQ(recs[0].chunks[0].version_from, 2);
  EXPECT_EQ(recs[0].chunks[1].chunk_id, 9u);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0], g);
  EXPECT_EQ(data[1], std::vector<float>(g.begin(), g.begin() + 2));
  EXPECT_EQ(recs[1].kind, WalKind::kClock);
  EXPECT_EQ(recs[1].worker, 1);
  EXPECT_EQ(recs[1].clock, 11);
  EXPECT_EQ(recs[2].kind, WalKind::kGone);
  EXPECT_EQ(recs[2].worker, 2);
  EXPECT_TRUE(recs[2].finished);
  // The writer's gathered write (floats straight from the caller) is byte for byte the
  // reference encoding.
  WalRecord push = recs[0];
  push.chunks[0].data = g.data();
  push.chunks[1].data = g.data();
  std::string ref;
  EncodeWalRecord(push, &ref);
  EXPECT_EQ(Bytes(path).substr(0, ref.size()), ref);
}

// DC-ASGD-a's records (kWalFlagRaw): each chunk's applied gradient, then the raw one; the
// writer's gathered write equals the reference encoding; a flagged record without the raw
// floats is refused naming the field.
TEST(Wal, RawGradientsRoundTripBesideTheAppliedOnes) {
  const std::string path = TestPath("raw.wal");
  const std::vector<float> applied = {1.5f, -2.25f, 3.0f}, raw = {1.0f, -2.0f, 2.5f};
  {
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
    WalRecord push;
    push.kind = WalKind::kPush;
    push.worker = 1;
    push.flags = kWalFlagRaw;
    push.clock = 4;
    push.chunks = {WalChunk{2, 3, applied.data(), 3, raw.data()}, WalChunk{7, 3, applied.data(), 2, raw.data()}};
    ASSERT_TRUE(w->Append(&push).ok());
    std::string ref;
    push.seq = 1;
    EncodeWalRecord(push, &ref);
    EXPECT_EQ(Logged(path), ref);
    // Flagged without the raw floats: the writer refuses it, nothing written.
    WalRecord bad = push;
    bad.chunks[1].raw = nullptr;
    EXPECT_EQ(w->Append(&bad).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(Logged(path), ref);
  }
  EXPECT_EQ(Bytes(path), Logged(path)) << "a closed log keeps its padding";
  WalScanInfo info;
  Status s;
  std::vector<std::vector<float>> raws;
  std::vector<WalRecord> recs;
  s = ScanWal(path, [&](const WalRecord& r) {
    recs.push_back(r);
    for (const WalChunk& c : r.chunks) raws.emplace_back(c.raw, c.raw + c.count);
    return Status::Ok();
  }, &info);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].flags, kWalFlagRaw);
  ASSERT_EQ(raws.size(), 2u);
  EXPECT_EQ(raws[0], raw);
  EXPECT_EQ(raws[1], std::vector<float>(raw.begin(), raw.begin() + 2));

  // A CRC-valid record flagged raw whose chunks lack the raw floats (then a valid record after
  // it, so it is not a torn tail): corrupt, naming the field.
  WalRecord short_one;
  short_one.kind = WalKind::kPush;
  short_one.seq = 2;
  short_one.flags = kWalFlagRaw;
  short_one.chunks = {WalChunk{2, 3, applied.data(), 3, nullptr}};
  WalRecord next;
  next.kind = WalKind::kClock;
  next.seq = 3;
  std::string tail, after;
  EncodeWalRecord(short_one, &tail);
  EncodeWalRecord(next, &after);
  Overwrite(path, Bytes(path) + tail + after);
  recs.clear();
  s = ScanWal(path, nullptr, &info);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find("raw gradient"), std::string::npos) << s.message();
}

// A push header frame (common/codec.h) for a coded push record.
Frame PushHeaderFrame(MsgType type = MsgType::kPush) {
  MessageHeader h;
  h.type = type;
  h.sender = 1;
  h.chunk_ids = {3, 4};
  h.versions = {5, 5};
  h.dtype = DType::kF16;
  h.elem_counts = {3, 0};
  h.byte_lengths = {6, 0};
  std::string bytes;
  EXPECT_TRUE(EncodeHeader(h, &bytes).ok());
  return Frame::Copy(bytes);
}

Frame BytesFrame(const std::string& b) { return Frame::Copy(b.data(), b.size()); }

// The frames' bytes of a scanned coded push (its frames point into the mapping).
std::vector<std::string> FrameBytes(const WalRecord& r) {
  std::vector<std::string> out;
  for (const Frame& f : r.frames) out.emplace_back(reinterpret_cast<const char*>(f.data()), f.size());
  return out;
}

// A record's length and CRC made right again after its payload was edited (a crafted record
// that is whole on disk, so only its meaning can be wrong).
void Reseal(std::string* rec) {
  const auto len = static_cast<uint32_t>(rec->size() - kWalHeaderBytes);
  std::memcpy(rec->data() + 16, &len, 4);
  const auto* b = reinterpret_cast<const uint8_t*>(rec->data());
  uint32_t crc = Crc32(std::span<const uint8_t>(b, 20));
  crc = Crc32(std::span<const uint8_t>(b + kWalHeaderBytes, len), crc);
  std::memcpy(rec->data() + 20, &crc, 4);
}

// A lossy or sufficient-factor push kept as the wire carried it (kCodedPush): the header frame
// and payload frames of any length come back byte for byte, each starting 4-byte aligned in the
// mapping (frames of 3 and 6 bytes are padded), the records after it read back, and the
// writer's gathered write is the reference encoding.
TEST(Wal, CodedPushRecordsKeepTheirFramesByteForByteAndAligned) {
  const std::string path = TestPath("coded.wal");
  const std::vector<std::string> payload = {std::string("\x01\x02\x03", 3), std::string(), std::string("abcdef")};
  WalRecord coded;
  coded.kind = WalKind::kCodedPush;
  coded.worker = 1;
  coded.flags = 0;
  coded.session = 0x1122334455667788ull;
  coded.request_id = 77;
  coded.clock = 9;
  coded.frames = {PushHeaderFrame()};
  for (const std::string& b : payload) coded.frames.push_back(BytesFrame(b));
  {
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
    ASSERT_TRUE(w->Append(&coded).ok());
    WalRecord clock;
    clock.kind = WalKind::kClock;
    clock.worker = 2;
    clock.clock = 10;
    ASSERT_TRUE(w->Append(&clock).ok());
    coded.request_id = 78;
    ASSERT_TRUE(w->Append(&coded).ok());
    // Without a payload frame it is no push: refused, nothing written.
    const uint64_t bytes = w->bytes();
    WalRecord bare = coded;
    bare.frames.resize(1);
    EXPECT_EQ(w->Append(&bare).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(w->bytes(), bytes);
  }
  EXPECT_EQ(std::filesystem::file_size(path) % 4, 0u);
  std::vector<WalRecord> recs;
  std::vector<std::vector<std::string>> frames;
  bool aligned = true;
  WalScanInfo info;
  Status s = ScanWal(path, [&](const WalRecord& r) {
    recs.push_back(r);
    frames.push_back(FrameBytes(r));
    for (const Frame& f : r.frames) aligned = aligned && reinterpret_cast<uintptr_t>(f.data()) % 4 == 0;
    recs.back().frames.clear();  // points into the mapping
    return Status::Ok();
  }, &info);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_FALSE(info.torn);
  EXPECT_TRUE(aligned);
  EXPECT_EQ(recs[0].kind, WalKind::kCodedPush);
  EXPECT_EQ(recs[0].seq, 1u);
  EXPECT_EQ(recs[0].worker, 1);
  EXPECT_EQ(recs[0].session, 0x1122334455667788ull);
  EXPECT_EQ(recs[0].request_id, 77u);
  EXPECT_EQ(recs[0].clock, 9);
  const Frame head = PushHeaderFrame();
  std::vector<std::string> want = {std::string(reinterpret_cast<const char*>(head.data()), head.size())};
  want.insert(want.end(), payload.begin(), payload.end());
  EXPECT_EQ(frames[0], want);
  EXPECT_EQ(recs[0].header.type, MsgType::kPush);  // frame 0, decoded by the scan
  EXPECT_EQ(recs[0].header.chunk_ids, (std::vector<uint32_t>{3, 4}));
  EXPECT_EQ(recs[0].header.dtype, DType::kF16);
  EXPECT_EQ(recs[1].kind, WalKind::kClock);
  EXPECT_EQ(recs[1].clock, 10);
  EXPECT_EQ(recs[2].kind, WalKind::kCodedPush);
  EXPECT_EQ(recs[2].request_id, 78u);
  EXPECT_EQ(frames[2], want);
  coded.request_id = 77;
  coded.seq = 1;
  std::string ref;
  EncodeWalRecord(coded, &ref);
  EXPECT_EQ(Bytes(path).substr(0, ref.size()), ref);
}

// A coded push record whose CRC is right but whose content is not a push (a damaged writer,
// or a hand-made file): corrupt, naming the file, the offset and the field, before anything
// is visited.
TEST(Wal, MalformedCodedPushRecordsAreRefusedNamingTheField) {
  const std::string path = TestPath("coded_bad.wal");
  auto refused = [&](const std::string& rec, const std::string& field) {
    WalRecord after;
    after.kind = WalKind::kClock;
    after.seq = 2;
    std::string tail;
    EncodeWalRecord(after, &tail);
    Overwrite(path, rec + tail);
    WalScanInfo info;
    int visited = 0;
    const Status s = ScanWal(path, [&](const WalRecord&) {
      ++visited;
      return Status::Ok();
    }, &info);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << field << ": " << s.ToString();
    EXPECT_NE(s.message().find(path + ": byte 0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
    EXPECT_EQ(visited, 0);
  };
  WalRecord r;
  r.kind = WalKind::kCodedPush;
  r.seq = 1;
  r.frames = {PushHeaderFrame(), BytesFrame("abcdef")};
  std::string good;
  EncodeWalRecord(r, &good);
  constexpr size_t kFrames = kWalHeaderBytes + 32;  // where frame 0's length field is
  {  // the header frame is a pull's
    WalRecord pull = r;
    pull.frames[0] = PushHeaderFrame(MsgType::kPull);
    std::string rec;
    EncodeWalRecord(pull, &rec);
    refused(rec, "field header is not a push header (pull)");
  }
  {  // the header frame is not a header at all
    WalRecord junk = r;
    junk.frames[0] = BytesFrame("not a header");
    std::string rec;
    EncodeWalRecord(junk, &rec);
    refused(rec, "field header is not a push header");
  }
  {  // a header alone
    WalRecord one = r;
    one.frames.resize(1);
    std::string rec;
    EncodeWalRecord(one, &rec);
    refused(rec, "field frames is 1");
  }
  {  // the last frame's padding is not zeros
    std::string rec = good;
    rec[rec.size() - 1] = 'x';
    Reseal(&rec);
    refused(rec, "frame 1 has nonzero padding");
  }
  {  // a frame length past the record
    std::string rec = good;
    const uint32_t huge = 1u << 20;
    std::memcpy(rec.data() + kFrames, &huge, 4);
    Reseal(&rec);
    refused(rec, "too short for field frame");
  }
}

TEST(Wal, TornLastRecordIsReportedAsATornTailAndTheRestIsKept) {
  const std::string path = TestPath("torn.wal");
  WriteThree(path, {1, 2, 3});
  const std::string full = Bytes(path);
  WalScanInfo whole;
  Status s;
  Scan(path, &whole, &s);
  ASSERT_TRUE(s.ok());
  // The process died inside the write of a 4th record: half of it is there.
  std::string rec;
  WalRecord extra;
  extra.kind = WalKind::kClock;
  extra.seq = 4;
  extra.worker = 0;
  extra.clock = 1;
  EncodeWalRecord(extra, &rec);
  Overwrite(path, full + rec.substr(0, rec.size() / 2));
  WalScanInfo info;
  auto recs = Scan(path, &info, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(recs.size(), 3u);
  EXPECT_TRUE(info.torn);
  EXPECT_EQ(info.valid_bytes, full.size());
  EXPECT_NE(info.torn_reason.find(fmt::format("byte {}: record header truncated", full.size())), std::string::npos)
      << info.torn_reason;
  // The file ends inside the payload.
  Overwrite(path, full + rec.substr(0, rec.size() - 3));
  recs = Scan(path, &info, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(recs.size(), 3u);
  EXPECT_TRUE(info.torn);
  EXPECT_NE(info.torn_reason.find("past the end"), std::string::npos) << info.torn_reason;
  // A complete last record whose bytes are wrong (CRC) with nothing after it: torn too.
  std::string bad = rec;
  bad[bad.size() - 1] ^= 0x55;
  Overwrite(path, full + bad);
  recs = Scan(path, &info, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(recs.size(), 3u);
  EXPECT_TRUE(info.torn);
  EXPECT_NE(info.torn_reason.find("crc"), std::string::npos) << info.torn_reason;
  // Dropping the tail leaves a clean log.
  ASSERT_TRUE(TruncateWal(path, info.valid_bytes).ok());
  recs = Scan(path, &info, &s);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(info.torn);
  EXPECT_EQ(info.file_bytes, full.size());
}

TEST(Wal, CorruptMiddleRecordIsRefusedNamingFileOffsetAndField) {
  const std::string path = TestPath("corrupt.wal");
  WriteThree(path, {1, 2, 3});
  std::string b = Bytes(path);
  // Flip a payload byte of the first record (a float): its CRC fails and valid records follow.
  b[kWalHeaderBytes + 40] ^= 0x01;
  Overwrite(path, b);
  WalScanInfo info;
  Status s;
  int visited = 0;
  s = ScanWal(path, [&](const WalRecord&) {
    ++visited;
    return Status::Ok();
  }, &info);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("byte 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("crc"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("valid record follows"), std::string::npos) << s.message();
  EXPECT_EQ(visited, 0) << "a damaged log must apply nothing";
}

TEST(Wal, WrongMagicInTheMiddleIsRefused) {
  const std::string path = TestPath("magic.wal");
  WriteThree(path, {1, 2, 3});
  std::string b = Bytes(path);
  WalScanInfo info;
  Status s;
  Scan(path, &info, &s);
  // The second record starts after the first: find it by its magic.
  const size_t second = b.find(std::string("DPWL"), 1);
  ASSERT_NE(second, std::string::npos);
  b[second] = 'X';
  Overwrite(path, b);
  s = ScanWal(path, nullptr, &info);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find(fmt::format("byte {}", second)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.message();
}

TEST(Wal, SequenceGapIsRefusedNamingTheSeqField) {
  const std::string path = TestPath("gap.wal");
  std::string bytes, rec;
  for (uint64_t seq : {1u, 2u, 4u}) {
    WalRecord r;
    r.kind = WalKind::kJoin;
    r.seq = seq;
    r.worker = 1;
    EncodeWalRecord(r, &rec);
    bytes += rec;
  }
  Overwrite(path, bytes);
  WalScanInfo info;
  Status s = ScanWal(path, nullptr, &info);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("seq"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(fmt::format("byte {}", 2 * rec.size())), std::string::npos) << s.message();
}

TEST(Wal, RestartEmptiesTheLogAndTheSequenceGoesOn) {
  const std::string path = TestPath("restart.wal");
  std::unique_ptr<WalWriter> w;
  ASSERT_TRUE(WalWriter::Open(path, 10, true, 200ms, &w).ok());
  WalRecord r;
  r.kind = WalKind::kClock;
  ASSERT_TRUE(w->Append(&r).ok());
  EXPECT_EQ(r.seq, 10u);
  ASSERT_TRUE(w->Restart().ok());
  ASSERT_TRUE(w->Append(&r).ok());
  EXPECT_EQ(r.seq, 11u);
  ASSERT_TRUE(w->Sync().ok());
  WalScanInfo info;
  ASSERT_TRUE(ScanWal(path, nullptr, &info).ok());
  EXPECT_EQ(info.records, 1u);
  EXPECT_EQ(info.first_seq, 11u);
  EXPECT_EQ(info.valid_bytes, w->bytes());
  EXPECT_EQ(info.file_bytes, info.valid_bytes + info.padding_bytes);
}

// The log thread's CPU is counted (its writes and fdatasyncs run there, beside the shard's loop),
// with fdatasync on every batch and on a timer alike.
TEST(Wal, TheLogThreadCountsItsCpuTime) {
  const std::vector<float> g(1 << 20, 0.25f);  // 4 MiB a record
  for (auto fsync_ms : {5ms, 0ms}) {
    SCOPED_TRACE(fmt::format("fsync_ms {}", fsync_ms.count()));
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(TestPath("sync_cpu.wal"), 1, true, fsync_ms, &w).ok());
    WalRecord push;
    push.kind = WalKind::kPush;
    push.chunks = {WalChunk{0, 0, g.data(), static_cast<uint32_t>(g.size())}};
    for (int i = 0; i < 200 && w->sync_cpu_ns() == 0; ++i) {  // bounded
      ASSERT_TRUE(w->Append(&push).ok());
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_GT(w->sync_cpu_ns(), 0u);
  }
}

// A push record of the gradient `g` on chunk 0.
WalRecord Push(const std::vector<float>& g) {
  WalRecord push;
  push.kind = WalKind::kPush;
  push.chunks = {WalChunk{0, 0, g.data(), static_cast<uint32_t>(g.size())}};
  return push;
}

// Every record's floats (push records of one chunk), the log checked whole first.
std::vector<std::vector<float>> LoggedFloats(const std::string& path, WalScanInfo* info) {
  Status s;
  std::vector<std::vector<float>> data;
  Scan(path, info, &s, &data);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return data;
}

// A disk without room stalls the log: the record it could not take is reported and stays staged,
// later records are refused without being staged (no seq used), and once there is room the
// stalled record is written once, at its place, and later records follow. The log reads back
// undamaged, the sequence without a gap, with the buffered and the direct writer alike.
TEST(Wal, ADiskWithoutRoomStallsTheLogAndTheStalledRecordIsWrittenOnceThereIsRoom) {
  for (WalIo io : {WalIo::kBuffered, WalIo::kAuto}) {
    for (auto fsync_ms : {0ms, 200ms}) {
      SCOPED_TRACE(fmt::format("fsync_ms {} io {}", fsync_ms.count(), static_cast<int>(io)));
      const std::string path = TestPath("full.wal");
      const std::vector<float> g(4096, 0.5f);  // 16 KiB a record
      test::FaultEnv env;                      // outlives the writer, whose thread may still be calling it
      std::unique_ptr<WalWriter> w;
      WalOptions o;
      o.fsync_ms = fsync_ms;
      o.io = io;
      ASSERT_TRUE(WalWriter::Open(path, 1, true, o, &w).ok());
      WalRecord push = Push(g);
      ASSERT_TRUE(w->Append(&push).ok());
      {
        ScopedEnv scoped(&env);
        env.FillDiskAfter(5000);
        Status s = w->Append(&push);
        EXPECT_EQ(s.code(), StatusCode::kIoError);
        EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
        EXPECT_NE(s.message().find("the disk is full"), std::string::npos) << s.message();
        EXPECT_EQ(w->durable_seq(), 1u);
        WalRecord later = Push(g);
        s = w->Submit(&later);
        EXPECT_EQ(s.code(), StatusCode::kIoError) << "a stalled log staged a record";
        EXPECT_EQ(w->next_seq(), 3u) << "a refused record used up a sequence number";
        env.FillDiskAfter(-1);  // room again: the stalled record goes down on the next try
        for (int i = 0; i < 200 && w->durable_seq() < 2; ++i) std::this_thread::sleep_for(5ms);  // bounded: 1 s
        EXPECT_EQ(w->durable_seq(), 2u);
        EXPECT_TRUE(w->Stalled().ok());
        WalRecord clock;
        clock.kind = WalKind::kClock;
        clock.clock = 3;
        ASSERT_TRUE(w->Append(&clock).ok());
        EXPECT_EQ(clock.seq, 3u);
        ASSERT_TRUE(w->Sync().ok());
      }
      EXPECT_GE(env.failed_writes(), 1);
      w.reset();
      WalScanInfo info;
      Status s;
      const auto recs = Scan(path, &info, &s);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_FALSE(info.torn) << info.torn_reason;
      ASSERT_EQ(recs.size(), 3u);
      EXPECT_EQ(recs[1].seq, 2u);
      EXPECT_EQ(recs[2].kind, WalKind::kClock);
    }
  }
}

// An fdatasync that fails is for good: the batch it was for never counts as durable (fsync_ms =
// 0), and every later record is refused without being staged, also once the disk would sync again
// — after a failed fsync the kernel may have dropped unwritten pages, and a later fsync that
// succeeds says nothing about them.
TEST(Wal, AFailedFsyncIsForGoodAndItsBatchNeverCountsAsDurable) {
  const std::string path = TestPath("eio.wal");
  const std::vector<float> g(64, 0.5f);
  test::FaultEnv env;
  std::unique_ptr<WalWriter> w;
  ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
  WalRecord push = Push(g);
  ASSERT_TRUE(w->Append(&push).ok());
  env.FailFsync(EIO);
  ScopedEnv scoped(&env);
  Status s = w->Append(&push);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("fdatasync"), std::string::npos) << s.message();
  EXPECT_EQ(w->durable_seq(), 1u);
  env.FailFsync(0);
  s = w->Submit(&push);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(w->next_seq(), 3u);
  EXPECT_FALSE(w->Sync().ok());
  EXPECT_FALSE(w->Failure().ok());
}

// With fdatasync on a timer (fsync_ms > 0) its failure reaches the next Submit, which stages
// nothing: the records it could not sync were acknowledged already, and none is added after them.
TEST(Wal, TheTimedFsyncsFailureStopsTheNextSubmit) {
  const std::string path = TestPath("eio_thread.wal");
  const std::vector<float> g(64, 0.5f);
  test::FaultEnv env;  // outlives the writer and its thread
  std::unique_ptr<WalWriter> w;
  ASSERT_TRUE(WalWriter::Open(path, 1, true, 5ms, &w).ok());
  env.FailFsync(EIO);
  ScopedEnv scoped(&env);
  WalRecord push = Push(g);
  ASSERT_TRUE(w->Append(&push).ok());
  for (int i = 0; i < 400 && w->Failure().ok(); ++i) std::this_thread::sleep_for(5ms);  // bounded: 2 s
  ASSERT_GT(env.fsyncs(), 0) << "the log thread never synced";
  const Status s = w->Submit(&push);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("fdatasync"), std::string::npos) << s.message();
  EXPECT_EQ(w->next_seq(), 2u);
}

// A write that fails other than for room (EIO) is for good too: the records of that batch never
// count as durable, nothing is staged after them, and what the disk holds reads back as a log
// whose last record may be torn (what a crash mid-write leaves, and a restart drops).
TEST(Wal, AWriteErrorIsForGoodAndTheLogReadsBack) {
  const std::string path = TestPath("stuck.wal");
  const std::vector<float> g(4096, 0.5f);
  test::FaultEnv env;
  std::unique_ptr<WalWriter> w;
  ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
  WalRecord push = Push(g);
  ASSERT_TRUE(w->Append(&push).ok());
  {
    env.FailWrites(EIO);
    ScopedEnv scoped(&env);
    Status s = w->Append(&push);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.message();
    env.FailWrites(0);
    s = w->Submit(&push);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_EQ(w->durable_seq(), 1u);
    w.reset();
  }
  WalScanInfo info;
  Status s;
  const auto recs = Scan(path, &info, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(recs.size(), 1u);
}

// Records larger than the staging are staged whole once everything before them is written, and
// many records through a small staging come back in order, byte for byte.
TEST(Wal, ASmallStagingTakesRecordsLargerThanItselfAndKeepsTheirOrder) {
  const std::string path = TestPath("small_staging.wal");
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < 12; ++i) grads.emplace_back((i % 3 == 0 ? 3 << 20 : 1000 + 77 * i), 0.5f + static_cast<float>(i));
  {
    std::unique_ptr<WalWriter> w;
    WalOptions o;
    o.staging_bytes = 1;  // one block
    ASSERT_TRUE(WalWriter::Open(path, 1, true, o, &w).ok());
    for (const auto& g : grads) {
      WalRecord push = Push(g);
      ASSERT_TRUE(w->Submit(&push).ok());
    }
    ASSERT_TRUE(w->Drain().ok());
    EXPECT_EQ(w->durable_seq(), grads.size());
  }
  WalScanInfo info;
  const auto data = LoggedFloats(path, &info);
  EXPECT_EQ(info.padding_bytes, 0u) << "a closed log keeps its padding";
  ASSERT_EQ(data.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(data[i], grads[i]) << "record " << i;
}

// A log reopened to append after what is there (a restart that replayed it) goes on at its end,
// a partial last block included: the records before and after read back as one log.
TEST(Wal, AReopenedLogAppendsAfterItsLastRecord) {
  const std::string path = TestPath("reopen.wal");
  const std::vector<float> a(333, 1.0f), b(5000, 2.0f);
  {
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
    WalRecord push = Push(a);
    ASSERT_TRUE(w->Append(&push).ok());
  }
  {
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(path, 2, false, 0ms, &w).ok());
    WalRecord push = Push(b);
    ASSERT_TRUE(w->Append(&push).ok());
    EXPECT_EQ(push.seq, 2u);
  }
  WalScanInfo info;
  const auto data = LoggedFloats(path, &info);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0], a);
  EXPECT_EQ(data[1], b);
}

// Zeros after the last record, fewer than a block, are a direct writer's padding (the process
// died with the log open), not a torn record; a block of zeros or more is torn.
TEST(Wal, ZerosToTheNextBlockAreAWritersPaddingNotATornRecord) {
  const std::string path = TestPath("padded.wal");
  const std::vector<float> g(10, 1.0f);
  WalRecord push = Push(g);
  push.seq = 1;
  std::string rec;
  EncodeWalRecord(push, &rec);
  Overwrite(path, rec + std::string(kWalBlock - rec.size(), '\0'));
  WalScanInfo info;
  ASSERT_TRUE(ScanWal(path, nullptr, &info).ok());
  EXPECT_EQ(info.records, 1u);
  EXPECT_FALSE(info.torn);
  EXPECT_EQ(info.padding_bytes, kWalBlock - rec.size());
  Overwrite(path, rec + std::string(kWalBlock, '\0'));
  ASSERT_TRUE(ScanWal(path, nullptr, &info).ok());
  EXPECT_TRUE(info.torn);
  EXPECT_EQ(info.valid_bytes, rec.size());
}

// A filesystem that takes no O_DIRECT writes: kAuto writes through the page cache instead (the
// same records), kDirect is an error at Open naming the log.
TEST(Wal, WithoutODirectTheLogWritesBufferedOrSaysWhyNot) {
  const std::string path = TestPath("no_direct.wal");
  const std::vector<float> g(100, 1.5f);
  test::FaultEnv env;
  env.RefuseDirectWrites(true);
  ScopedEnv scoped(&env);
  {
    std::unique_ptr<WalWriter> w;
    ASSERT_TRUE(WalWriter::Open(path, 1, true, 0ms, &w).ok());
    EXPECT_FALSE(w->direct());
    WalRecord push = Push(g);
    ASSERT_TRUE(w->Append(&push).ok());
  }
  WalScanInfo info;
  const auto data = LoggedFloats(path, &info);
  ASSERT_EQ(data.size(), 1u);
  EXPECT_EQ(data[0], g);
  EXPECT_EQ(info.padding_bytes, 0u);
  WalOptions o;
  o.io = WalIo::kDirect;
  std::unique_ptr<WalWriter> w;
  const Status s = WalWriter::Open(path, 2, false, o, &w);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("O_DIRECT"), std::string::npos) << s.message();
}

TEST(Wal, MissingLogIsNotFound) {
  WalScanInfo info;
  EXPECT_EQ(ScanWal(TestPath("absent.wal"), nullptr, &info).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace downpour
