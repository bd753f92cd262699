// shard_checkpoint.h — a shard's checkpoint as plain data, and its codec to and from a tensor
// file (common/tensor_file.h). ShardServer::SaveCheckpoint fills a ShardCheckpoint and writes
// EncodeShardCheckpoint's file (with the consistency policy's "policy.*" meta added);
// LoadCheckpoint reads the file, DecodeShardCheckpoint checks all of it against the loading shard
// before the shard changes anything, then the shard adopts it.
//
// The file: meta kind = "downpour-shard", server_id, server_count, layout_hash, model_id,
// updates, versions / schedule_iters / initialized (one entry per owned chunk, "a,b,c"),
// wal_seq, max_workers, update_rule (common/solver/update_rule.h; "momentum" when absent, as
// in files written before it), pushes_by_worker (one per worker id), dedup.<worker> ("session:id,id;
// session:id", ids oldest first, for workers with a window); tensors chunk<id>.weights,
// chunk<id>.history (the update rule's per-weight state: momentum, AdaGrad's squares) and
// chunk<id>.<name> for a shard rule's own state of that name (server/rules/shard_rule.h; DC-ASGD-a's
// "dc_mean_square", for the chunks a gradient reached).
// Older checkpoints lack schedule_iters (the iteration was the version), and those written
// before the write-ahead log lack the state (has_state: counters start at 0, the policy at its
// initial state).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor_file.h"

namespace downpour {

struct ShardCheckpoint {
  // Whose: it is loaded only by the same server of the same layout and model.
  int32_t server_id = 0;
  int32_t server_count = 0;
  uint64_t layout_hash = 0;
  uint32_t model_id = 0;
  int64_t updates = 0;   // chunk updates the shard applied
  uint64_t wal_seq = 0;  // the last write-ahead log record it covers
  std::string update_rule = "momentum";  // whose state `history` is
  // The state written since the write-ahead log; has_state false = an older file without it.
  bool has_state = false;
  int32_t max_workers = 0;
  std::vector<int64_t> pushes_by_worker;  // max_workers entries when has_state
  struct Session {
    uint64_t session = 0;
    std::vector<uint64_t> ids;  // oldest first
  };
  std::vector<std::vector<Session>> dedup;  // per worker id (max_workers), oldest session first
  struct Chunk {
    int32_t id = 0;  // global chunk id
    int64_t version = 0;
    int64_t iter = 0;  // the lr schedule's iteration
    bool initialized = false;
    std::vector<float> weights, history;
    // The shard rules' own per-weight state, by name (DC-ASGD-a's "dc_mean_square"); a chunk
    // without one has none yet.
    std::map<std::string, std::vector<float>> rule_state;
  };
  std::vector<Chunk> chunks;  // the shard's owned chunks, in its order
};

// What the loading shard is; its checkpoint must match.
struct ShardCheckpointExpect {
  int32_t server_id = 0;
  uint64_t layout_hash = 0;
  uint32_t model_id = 0;
  int32_t max_workers = 0;
  std::vector<int32_t> chunk_ids;   // owned, in order
  std::vector<size_t> chunk_elems;  // floats per owned chunk
  // The shard rules' states to restore where the file has them (a chunk without one, or a file of
  // another algorithm, starts that state afresh).
  std::vector<std::string> rule_states;
  std::string update_rule = "momentum";  // the loading shard's rule: another's state is refused
};

// The file for `c` (its float vectors moved into the tensors). Entries of `c.dedup` with no
// session write no key.
TensorFile EncodeShardCheckpoint(ShardCheckpoint&& c);

// Checks all of `file` (read from `path`) against `expect` and fills `out` (its floats moved out
// of `file`'s tensors; the meta stays, for the policy's LoadState). Errors name the path and the
// field: kFailedPrecondition for another server's, layout's, model's, worker count's or update
// rule's checkpoint,
// kCorrupt for a damaged or incomplete one. `out` is unspecified on error.
Status DecodeShardCheckpoint(TensorFile& file, const std::string& path, const ShardCheckpointExpect& expect,
                             ShardCheckpoint* out);

}  // namespace downpour
