// Tests of server/shard_checkpoint.h: a shard's checkpoint round-trips through its tensor file
// field for field; older files (no schedule_iters, no state) load as they did; another server's,
// layout's, model's or worker count's file is refused; and every damaged field is refused naming
// the file and the field, with the file's tensors left whole. Before the codec had its own file
// none of these refusals had a test, and a malformed wal_seq or updates read as 0 (a wal_seq of 0
// replays the whole log over a checkpoint that already holds it).
#include "server/shard_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/testing/harness.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr const char* kPath = "/run/checkpoints/server-1.dpt";

ShardCheckpoint Sample() {
  ShardCheckpoint c;
  c.server_id = 1;
  c.server_count = 2;
  c.layout_hash = 0xfeedbeefcafe1234ull;
  c.model_id = 3;
  c.updates = 1234;
  c.wal_seq = 98765432109ull;
  c.has_state = true;
  c.max_workers = 3;
  c.pushes_by_worker = {10, 0, 7};
  c.dedup = {{{5, {1, 2, 3}}, {6, {9}}}, {}, {{1ull << 60, {1ull << 62}}}};
  for (int i = 0; i < 3; ++i) {
    ShardCheckpoint::Chunk ch;
    ch.id = 4 + 2 * i;
    ch.version = 100 + i;
    ch.iter = 300 + i;
    ch.initialized = i != 1;
    ch.weights.assign(static_cast<size_t>(5 + i), 0.5f + static_cast<float>(i));
    ch.history.assign(ch.weights.size(), -0.25f * static_cast<float>(i));
    if (i == 2) ch.rule_state["dc_mean_square"].assign(ch.weights.size(), 1e-3f);
    c.chunks.push_back(std::move(ch));
  }
  return c;
}

ShardCheckpointExpect ExpectFor(const ShardCheckpoint& c, bool dc = true) {
  ShardCheckpointExpect e;
  e.server_id = c.server_id;
  e.layout_hash = c.layout_hash;
  e.model_id = c.model_id;
  e.max_workers = c.max_workers;
  for (const auto& ch : c.chunks) {
    e.chunk_ids.push_back(ch.id);
    e.chunk_elems.push_back(ch.weights.size());
  }
  if (dc) e.rule_states = {"dc_mean_square"};
  return e;
}

// The file of Sample() with its policy's meta, as ShardServer writes it.
TensorFile SampleFile() {
  TensorFile f = EncodeShardCheckpoint(Sample());
  f.meta["policy.member_clocks"] = "1,2,3";
  return f;
}

void ExpectSame(const ShardCheckpoint& a, const ShardCheckpoint& b) {
  EXPECT_EQ(a.server_id, b.server_id);
  EXPECT_EQ(a.server_count, b.server_count);
  EXPECT_EQ(a.layout_hash, b.layout_hash);
  EXPECT_EQ(a.model_id, b.model_id);
  EXPECT_EQ(a.updates, b.updates);
  EXPECT_EQ(a.wal_seq, b.wal_seq);
  EXPECT_EQ(a.has_state, b.has_state);
  EXPECT_EQ(a.max_workers, b.max_workers);
  EXPECT_EQ(a.pushes_by_worker, b.pushes_by_worker);
  ASSERT_EQ(a.dedup.size(), b.dedup.size());
  for (size_t w = 0; w < a.dedup.size(); ++w) {
    ASSERT_EQ(a.dedup[w].size(), b.dedup[w].size()) << "worker " << w;
    for (size_t k = 0; k < a.dedup[w].size(); ++k) {
      EXPECT_EQ(a.dedup[w][k].session, b.dedup[w][k].session);
      EXPECT_EQ(a.dedup[w][k].ids, b.dedup[w][k].ids);
    }
  }
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.chunks[i].id, b.chunks[i].id);
    EXPECT_EQ(a.chunks[i].version, b.chunks[i].version);
    EXPECT_EQ(a.chunks[i].iter, b.chunks[i].iter);
    EXPECT_EQ(a.chunks[i].initialized, b.chunks[i].initialized);
    EXPECT_EQ(a.chunks[i].weights, b.chunks[i].weights);
    EXPECT_EQ(a.chunks[i].history, b.chunks[i].history);
    EXPECT_EQ(a.chunks[i].rule_state, b.chunks[i].rule_state);
  }
}

TEST(ShardCheckpoint, RoundTripsThroughItsTensorFileFieldForField) {
  const test::fs::path dir = test::ScratchDir("shard_checkpoint");
  const std::string path = (dir / "server-1.dpt").string();
  ASSERT_TRUE(WriteTensorFile(path, SampleFile()).ok());
  TensorFile read;
  ASSERT_TRUE(ReadTensorFile(path, &read).ok());
  ShardCheckpoint back;
  const Status s = DecodeShardCheckpoint(read, path, ExpectFor(Sample()), &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSame(back, Sample());
  EXPECT_EQ(read.meta.at("policy.member_clocks"), "1,2,3") << "the policy's meta stays for its LoadState";
}

// A shard without DC-ASGD-a ignores the mean squares a file has; one with it takes what is
// there (a chunk without them starts again from its next gradient).
TEST(ShardCheckpoint, MeanSquaresAreTakenOnlyByADcAsgdAShard) {
  TensorFile f = SampleFile();
  ShardCheckpoint back;
  ASSERT_TRUE(DecodeShardCheckpoint(f, kPath, ExpectFor(Sample(), /*dc=*/false), &back).ok());
  for (const auto& ch : back.chunks) EXPECT_TRUE(ch.rule_state.empty());
}

// Files written before the lr schedule counted batches (no schedule_iters: the iteration was the
// version) and before the write-ahead log (no state: counters from 0, any worker count).
TEST(ShardCheckpoint, OlderFilesLoadAsTheyDid) {
  TensorFile f = SampleFile();
  for (const char* key : {"schedule_iters", "policy.member_clocks", "pushes_by_worker", "wal_seq"}) f.meta.erase(key);
  f.meta["max_workers"] = "17";
  ShardCheckpoint back;
  const Status s = DecodeShardCheckpoint(f, kPath, ExpectFor(Sample()), &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(back.has_state);
  EXPECT_TRUE(back.pushes_by_worker.empty());
  EXPECT_EQ(back.wal_seq, 0u);
  for (size_t i = 0; i < back.chunks.size(); ++i) EXPECT_EQ(back.chunks[i].iter, back.chunks[i].version);
}

TEST(ShardCheckpoint, AnotherServersLayoutsModelsOrWorkerCountsFileIsRefused) {
  struct Case {
    const char* what;
    std::function<void(ShardCheckpointExpect&)> change;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"server", [](ShardCheckpointExpect& e) { e.server_id = 0; }, "checkpoint of server 1 with layout hash"},
      {"layout", [](ShardCheckpointExpect& e) { e.layout_hash ^= 1; }, "this is server 1 with layout hash"},
      {"model", [](ShardCheckpointExpect& e) { e.model_id = 0; }, "checkpoint of model 3; this server serves model 0"},
      {"workers", [](ShardCheckpointExpect& e) { e.max_workers = 4; },
       "accounting for 3 workers; this one accounts for 4 (cluster.max_workers)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TensorFile f = SampleFile();
    ShardCheckpointExpect e = ExpectFor(Sample());
    c.change(e);
    ShardCheckpoint back;
    const Status s = DecodeShardCheckpoint(f, kPath, e, &back);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr(kPath));
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
}

TEST(ShardCheckpoint, EveryDamagedFieldIsRefusedNamingTheFileAndTheField) {
  struct Case {
    const char* what;
    std::function<void(TensorFile&)> damage;
    const char* says;
  };
  auto set = [](const char* key, const char* value) { return [=](TensorFile& f) { f.meta[key] = value; }; };
  auto drop_tensor = [](const char* name) {
    return [=](TensorFile& f) { std::erase_if(f.tensors, [&](const NamedTensor& t) { return t.name == name; }); };
  };
  auto shrink_tensor = [](const char* name) {
    return [=](TensorFile& f) {
      for (NamedTensor& t : f.tensors) {
        if (t.name == name) t.data.pop_back();
      }
    };
  };
  const std::vector<Case> cases = {
      {"kind", set("kind", "downpour-model"), "not a shard checkpoint (meta kind = 'downpour-model')"},
      {"wal_seq", set("wal_seq", "12x"), "meta 'wal_seq' is '12x', not a number"},
      {"wal_seq negative", set("wal_seq", "-1"), "meta 'wal_seq' is '-1', not a number"},
      {"updates", set("updates", ""), "meta 'updates' is '', not a number"},
      {"updates negative", set("updates", "-3"), "meta 'updates' is -3 (< 0)"},
      {"server_count", set("server_count", "two"), "meta 'server_count' is 'two', not a number"},
      {"versions count", set("versions", "1,2"), "meta 'versions' has 2 entries, the shard has 3 chunks"},
      {"versions entry", set("versions", "1,x,3"), "versions"},
      {"versions negative", set("versions", "1,-2,3"), "meta 'versions': chunk 1 has -2 (< 0)"},
      {"schedule_iters negative", set("schedule_iters", "0,0,-1"), "meta 'schedule_iters': chunk 2 has -1 (< 0)"},
      {"initialized missing", [](TensorFile& f) { f.meta.erase("initialized"); },
       "meta 'initialized' has 0 entries, the shard has 3 chunks"},
      {"pushes_by_worker count", set("pushes_by_worker", "1,2"),
       "meta 'pushes_by_worker' has 2 entries, the shard has 3 worker ids"},
      {"pushes_by_worker negative", set("pushes_by_worker", "1,-2,3"), "meta 'pushes_by_worker': worker 1 has -2"},
      {"dedup no colon", set("dedup.1", "5"), "meta 'dedup.1': bad session entry '5'"},
      {"dedup session", set("dedup.1", "x:1"), "meta 'dedup.1': bad session entry 'x:1'"},
      {"dedup empty id", set("dedup.1", "5:1,,2"), "meta 'dedup.1': bad request id ''"},
      {"dedup id", set("dedup.2", "5:1;6:2z"), "meta 'dedup.2': bad request id '2z'"},
      {"weights missing", drop_tensor("chunk8.weights"), "tensor 'chunk8.weights' is missing"},
      {"history missing", drop_tensor("chunk4.history"), "tensor 'chunk4.history' is missing"},
      {"weights size", shrink_tensor("chunk6.weights"), "tensor 'chunk6.weights' has 5 floats, chunk needs 6"},
      {"mean square size", shrink_tensor("chunk8.dc_mean_square"),
       "tensor 'chunk8.dc_mean_square' has 6 floats, chunk needs 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TensorFile f = SampleFile();
    c.damage(f);
    const TensorFile damaged = f;
    ShardCheckpoint back;
    const Status s = DecodeShardCheckpoint(f, kPath, ExpectFor(Sample()), &back);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(kPath));
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    EXPECT_EQ(f, damaged) << "a refused file's tensors were moved out";
  }
}

}  // namespace
}  // namespace downpour
