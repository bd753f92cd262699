// chunk_store.h — ChunkStore, a shard's chunks: their f32 master weights, the update rule's
// per-weight state, versions and lr-schedule iterations, and the apply lanes (apply_lanes.h)
// whose threads own the floats. It applies what the shard has decided (a gradient, a change
// added as it is, the first weights) and reads pull replies; it decides nothing.
//
// Two views of each chunk. The loop's (version, iter, initialized) is what the chunk is once
// everything posted has run, so the shard answers from it at once. The floats (weights, state)
// belong to the chunk's lane: a task there, or the loop after Drain, touches them. A pull reply
// borrows the weights zero-copy; the next update then writes a copy (copy-on-write), never the
// buffer the transport still reads.
//
// Thread-safety: every method from one thread at a time (the shard's loop, under its lock);
// lane tasks touch only their chunk's floats and the pull-read pools of their lane. `done` of
// Read is called on a lane. The destructor runs what was posted, then joins the lanes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/buffer_pool.h"
#include "common/codec.h"
#include "common/config/solver.h"
#include "common/layout.h"
#include "common/shm_region.h"
#include "common/shm_share.h"
#include "common/solver/update_rule.h"
#include "server/apply_lanes.h"
#include "server/shard_checkpoint.h"

namespace downpour {

struct ChunkStoreOptions {
  int server_id = 0;                       // whose chunks of the layout
  SolverConfig solver;                     // the lr policy the step of each update is fixed by
  std::shared_ptr<const UpdateRule> rule;  // not null
  int lanes = 1;                           // cluster.server_threads
  int push_every = 1;                      // worker.push_every: worker batches per pushed gradient
};

class ChunkStore {
 public:
  ChunkStore(const ParamLayout& layout, ChunkStoreOptions options);
  ~ChunkStore();
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  // The loop's view, by local index (0..size()-1, the layout's order of the server's chunks).
  int size() const { return static_cast<int>(owned_.size()); }
  int32_t id(int local) const { return owned_[static_cast<size_t>(local)]; }
  int local_of(int32_t id) const;  // -1 if another server's or out of range
  const std::vector<int32_t>& owned() const { return owned_; }
  const std::vector<int>& locals() const { return local_of_; }  // by chunk id
  int64_t count(int local) const;
  int64_t version(int local) const { return chunks_[static_cast<size_t>(local)].version; }
  int64_t iter(int local) const { return chunks_[static_cast<size_t>(local)].iter; }
  bool initialized(int local) const { return chunks_[static_cast<size_t>(local)].initialized; }
  const UpdateRule& rule() const { return *o_.rule; }

  // Each changes the loop's view now and posts the floats to the chunk's lane; `keep` holds what
  // the task reads until it has run (null: it is read during this call only, so the lane's
  // earlier work and this run now, on this thread).
  //
  // One update by `grad` (count floats): its step fixed at the chunk's iteration now, its lr
  // scaled by lr_scale; the iteration moves on by `gradients` pushed gradients.
  void Apply(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
             std::shared_ptr<const void> keep);
  // w += delta (AddRule): EASGD's exchange, a model's move; the iteration moves on by `iters`.
  void Add(int local, const float* delta, int64_t iters, std::shared_ptr<const void> keep);
  // The first weights; false (and nothing posted) when the chunk has weights already.
  bool Init(int local, const float* w, std::shared_ptr<const void> keep);
  // `work` on the chunk's lane, in order with its updates (a policy's sum of gradients).
  void OnLane(int local, std::shared_ptr<const void> keep, std::function<void()> work);

  // Every posted task has run; until the next post the loop may read the floats below.
  void Drain() const { lanes_->Drain(); }
  const std::vector<float>& weights(int local) const;
  const std::vector<float>& state(int local) const { return chunks_[static_cast<size_t>(local)].state; }

  // Reads the chunks `locals` for a pull reply, each after the updates posted before and before
  // those posted after: into the pull area of `region` (laid out as share()), or else into
  // payload[i] (f32 borrowed zero-copy, f16 / bf16 converted into a lane's pool). When every
  // lane involved is idle the loop reads them itself and Read returns true; else it returns
  // false and the lane that reads the last chunk calls `done` (which must keep `payload` alive).
  bool Read(const std::vector<int>& locals, DType dtype, std::shared_ptr<SharedRegion> region, Frames* payload,
            std::function<void()> done);
  // Where each chunk lies in a shared region's areas.
  const ShmShare& share() const { return share_; }

  // Checkpoints: every chunk's id, version, iteration, first weights taken, weights and state
  // (drains first); Restore adopts them (checked against this store by DecodeShardCheckpoint).
  void Snapshot(std::vector<ShardCheckpoint::Chunk>* out) const;
  void Restore(std::vector<ShardCheckpoint::Chunk>* chunks);
  // A checkpoint of this store must have these ids and sizes.
  void Expect(ShardCheckpointExpect* expect) const;

  int64_t updates() const { return updates_; }  // chunk updates applied (Apply and Add)
  void set_updates(int64_t n) { updates_ = n; }
  uint64_t apply_ns() const { return apply_ns_.load(std::memory_order_relaxed); }  // lanes in the rule
  uint64_t lane_wait_ns() const { return lanes_->post_wait_ns(); }                 // the loop waited for a full lane

 private:
  struct WeightBuffer;
  struct Chunk {
    // The lane's: weights shared with in-flight pull replies (replaced before an update if read);
    // `spare` is the buffer replaced last, reused once no reply reads it.
    std::shared_ptr<WeightBuffer> weights;
    std::shared_ptr<WeightBuffer> spare;
    std::vector<float> state;  // the update rule's, count floats
    // The loop's.
    int64_t version = 0;
    int64_t iter = 0;
    bool initialized = false;
  };
  std::vector<float>& MutableWeights(int local);                           // on the chunk's lane
  void ReadOne(int local, DType dtype, SharedRegion* region, Frame* out);  // on its lane

  const ParamLayout& layout_;
  const ChunkStoreOptions o_;
  std::vector<int32_t> owned_;  // chunk ids, ascending
  std::vector<int> local_of_;   // by chunk id: local index or -1
  const ShmShare share_;
  std::vector<Chunk> chunks_;
  int64_t updates_ = 0;
  std::vector<std::unique_ptr<BufferPool<uint16_t>>> pull_scratch_;  // per lane: f16 / bf16 replies
  std::atomic<uint64_t> apply_ns_{0};
  // Declared last, so destroyed first: its tasks touch everything above.
  std::unique_ptr<ApplyLanes> lanes_;
};

}  // namespace downpour
