// shard_durability_test.cc — ShardDurability (server/shard_durability.h) around a stand-in shard
// whose state is the list of clocks it applied: a recovered shard is its checkpoint plus exactly
// the records logged after it, replayed in order; checkpoints come every n rounds and at the
// log's bound and empty the log, and one at the bound that fails holds the bound; nothing
// checkpoints during a replay; a file the shard refuses changes nothing.
#include "server/shard_durability.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace downpour {
namespace {

// Its state: the clocks of the records it applied, and as many updates.
class ClockShard : public DurableShard {
 public:
  TensorFile Checkpoint(uint64_t wal_seq) override {
    TensorFile f;
    f.meta["kind"] = "clock-shard";
    f.meta["wal_seq"] = std::to_string(wal_seq);
    f.meta["clocks"] = FormatMetaInts(clocks);
    return f;
  }
  Status Restore(TensorFile& file, const std::string& path, uint64_t* wal_seq) override {
    if (file.meta["kind"] != "clock-shard") return Corrupt("{}: field kind: not a clock shard's", path);
    std::vector<int64_t> read;
    DP_RETURN_IF_ERROR(ParseMetaInts(file.meta["clocks"], path, "clocks", &read));
    clocks = read;
    *wal_seq = std::stoull(file.meta["wal_seq"]);
    return Status::Ok();
  }
  Status Apply(const WalRecord& r, const std::string& path) override {
    if (r.kind != WalKind::kClock) return Corrupt("{}: record seq {}: not a clock", path, r.seq);
    clocks.push_back(r.clock);
    replayed_while_replaying = replayed_while_replaying && durability->replaying();
    return Status::Ok();
  }
  int64_t updates() const override { return static_cast<int64_t>(clocks.size()); }

  std::vector<int64_t> clocks;
  ShardDurability* durability = nullptr;
  bool replayed_while_replaying = true;
};

class ShardDurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/shard_durability_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ShardDurabilityOptions Options(int64_t every_rounds = 0, uint64_t max_bytes = uint64_t{64} << 20) const {
    ShardDurabilityOptions o;
    o.checkpoint_path = dir_ + "/shard.dpt";
    o.every_rounds = every_rounds;
    o.owned_chunks = 2;
    o.log.path = dir_ + "/shard.wal";
    o.log.fsync_ms = std::chrono::milliseconds(0);
    o.log.max_bytes = max_bytes;
    o.log.checkpoint_bytes = 4096;
    o.log.checkpoint_path = o.checkpoint_path;
    return o;
  }
  std::unique_ptr<ShardDurability> Make(ClockShard* shard, ShardDurabilityOptions o) {
    auto d = std::make_unique<ShardDurability>(std::move(o), shard);
    shard->durability = d.get();
    return d;
  }
  // A live change: logged, then applied by the shard.
  static void Change(ShardDurability* d, ClockShard* shard, int64_t clock) {
    WalRecord r;
    r.kind = WalKind::kClock;
    r.clock = clock;
    ASSERT_TRUE(d->Stage(&r).ok());
    shard->clocks.push_back(clock);
    d->AfterChange();
  }
  static ShardStatsWire Stats(const ShardDurability& d) {
    ShardStatsWire s;
    d.AddStats(&s);
    return s;
  }

  std::string dir_;
};

TEST_F(ShardDurabilityTest, ARecoveredShardIsItsCheckpointPlusTheRecordsLoggedAfterIt) {
  {
    ClockShard live;
    auto d = Make(&live, Options());
    ASSERT_TRUE(d->Open().ok());
    for (int64_t c : {10, 11, 12}) Change(d.get(), &live, c);
    ASSERT_TRUE(d->Save(Options().checkpoint_path).ok());  // covers seq 1..3 and empties the log
    for (int64_t c : {13, 14}) Change(d.get(), &live, c);
    EXPECT_EQ(d->seq(), 5u);
    ASSERT_TRUE(d->log().Sync().ok());
    const ShardStatsWire s = Stats(*d);
    EXPECT_EQ(s.wal_records, 5u);
    EXPECT_EQ(s.checkpoints_written, 1u);
    EXPECT_GT(s.wal_bytes, 0u);
  }
  ClockShard back;
  auto d = Make(&back, Options());
  RecoverReport report;
  ASSERT_TRUE(d->Recover(&report).ok());
  EXPECT_TRUE(report.checkpoint_loaded);
  EXPECT_EQ(report.checkpoint_seq, 3u);
  EXPECT_EQ(report.checkpoint_updates, 3);
  EXPECT_EQ(report.replayed, 2u);
  EXPECT_EQ(report.replayed_pushes, 0u);
  EXPECT_EQ(back.clocks, (std::vector<int64_t>{10, 11, 12, 13, 14}));
  EXPECT_TRUE(back.replayed_while_replaying);
  EXPECT_FALSE(d->replaying());
  EXPECT_EQ(d->seq(), 5u);
  EXPECT_EQ(Stats(*d).replayed, 2u);
  EXPECT_EQ(Stats(*d).checkpoints_written, 1u) << "what was replayed is checkpointed at once";
  ASSERT_TRUE(d->logging()) << "Recover leaves the log open";
  WalRecord next;
  next.kind = WalKind::kClock;
  ASSERT_TRUE(d->Stage(&next).ok());
  EXPECT_EQ(next.seq, 6u) << "seq goes on after the replayed records";
}

TEST_F(ShardDurabilityTest, CheckpointsComeEveryNRoundsAndAtTheLogsBoundAndEmptyIt) {
  ClockShard shard;
  auto d = Make(&shard, Options(/*every_rounds=*/2));
  ASSERT_TRUE(d->Open().ok());
  // Two owned chunks: a round is two updates, so a checkpoint every fourth change.
  for (int64_t c = 0; c < 9; ++c) Change(d.get(), &shard, c);
  EXPECT_EQ(Stats(*d).checkpoints_written, 2u);
  EXPECT_TRUE(std::filesystem::exists(Options().checkpoint_path));

  ClockShard bounded;
  ShardDurabilityOptions o = Options(/*every_rounds=*/0, /*max_bytes=*/1);
  o.checkpoint_path = dir_ + "/bounded.dpt";
  o.log.checkpoint_path = o.checkpoint_path;
  o.log.path = dir_ + "/bounded.wal";
  auto b = Make(&bounded, o);
  ASSERT_TRUE(b->Open().ok());
  for (int64_t c = 0; c < 3; ++c) {
    Change(b.get(), &bounded, c);
    EXPECT_EQ(b->log().bytes(), 0u) << "each record reached the bound: a checkpoint emptied the log";
  }
  EXPECT_EQ(Stats(*b).checkpoints_written, 3u);
}

// The checkpoint at the log's bound cannot be written (its directory is a file here; a full disk
// in a run): the bound holds — every change is refused, nothing is staged — and the checkpoint is
// tried again on the loop's ticks, not per message; once it goes through, changes are taken.
TEST_F(ShardDurabilityTest, ACheckpointAtTheBoundThatFailsHoldsTheBoundUntilItGoesThrough) {
  ClockShard shard;
  ShardDurabilityOptions o = Options(/*every_rounds=*/0, /*max_bytes=*/1);
  const std::string blocked = dir_ + "/not-a-dir";
  o.checkpoint_path = blocked + "/shard.dpt";
  o.log.checkpoint_path = dir_ + "/shard.dpt";  // the room check's view: the directory exists
  o.bound_retry = std::chrono::milliseconds(20);
  { std::ofstream(blocked) << "a file where the checkpoint's directory should be"; }
  auto d = Make(&shard, o);
  ASSERT_TRUE(d->Open().ok());
  Change(d.get(), &shard, 1);  // staged; the log is at its bound and the checkpoint fails
  ASSERT_FALSE(d->bound_failure().ok());
  EXPECT_NE(d->bound_failure().message().find("not-a-dir"), std::string::npos) << d->bound_failure().ToString();
  const uint64_t bytes = d->log().bytes();
  EXPECT_GT(bytes, 0u) << "the log was not emptied";
  WalRecord refused;
  refused.kind = WalKind::kClock;
  const Status s = d->Stage(&refused);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("at its bound"), std::string::npos) << s.ToString();
  EXPECT_EQ(d->seq(), 1u) << "nothing staged";
  EXPECT_EQ(d->log().bytes(), bytes);
  d->Tick();  // before the retry is due: no second attempt
  EXPECT_EQ(Stats(*d).checkpoints_written, 0u);
  std::filesystem::remove(blocked);
  std::filesystem::create_directories(blocked);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  d->Tick();
  EXPECT_TRUE(d->bound_failure().ok()) << d->bound_failure().ToString();
  EXPECT_EQ(Stats(*d).checkpoints_written, 1u);
  EXPECT_EQ(d->log().bytes(), 0u) << "the checkpoint emptied the log";
  EXPECT_TRUE(std::filesystem::exists(o.checkpoint_path));
  WalRecord taken;
  taken.kind = WalKind::kClock;
  EXPECT_TRUE(d->Stage(&taken).ok());
  EXPECT_EQ(taken.seq, 2u);
}

TEST_F(ShardDurabilityTest, AReplayedRecordTakesItsSeqAndNothingCheckpointsDuringIt) {
  ClockShard shard;
  auto d = Make(&shard, Options(/*every_rounds=*/1, /*max_bytes=*/1));
  WalRecord r;
  r.kind = WalKind::kClock;
  r.seq = 42;
  r.clock = 7;
  ASSERT_TRUE(d->Replay(r, "kept.wal").ok());
  EXPECT_EQ(d->seq(), 42u);
  EXPECT_EQ(shard.clocks, std::vector<int64_t>{7});
  EXPECT_TRUE(shard.replayed_while_replaying);
  EXPECT_EQ(Stats(*d).replayed, 1u);
  EXPECT_EQ(Stats(*d).checkpoints_written, 0u);
  r.kind = WalKind::kGone;
  const Status s = d->Replay(r, "kept.wal");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("kept.wal"), std::string::npos) << s.ToString();
  EXPECT_EQ(d->seq(), 42u) << "a refused record moves nothing";
}

TEST_F(ShardDurabilityTest, AFileTheShardRefusesChangesNothing) {
  ClockShard shard;
  auto d = Make(&shard, Options());
  TensorFile other;
  other.meta["kind"] = "something-else";
  ASSERT_TRUE(WriteTensorFile(dir_ + "/other.dpt", other).ok());
  const Status s = d->Load(dir_ + "/other.dpt");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("other.dpt"), std::string::npos) << s.ToString();
  EXPECT_EQ(d->seq(), 0u);
  EXPECT_TRUE(shard.clocks.empty());
  EXPECT_FALSE(d->Load(dir_ + "/missing.dpt").ok());
}

}  // namespace
}  // namespace downpour
