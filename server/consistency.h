// consistency.h — consistency control of a shard as a pluggable policy object
// (docs/architecture.md "Consistency policies"): async (Downpour), sync (BSP with optional
// backup workers) and ssp:s.
//
// The shard validates every message first (shard.cc) and then asks the policy:
//  * CheckPush — may this push be taken at all (all chunks are checked before any is touched);
//  * OnPush    — apply now (async, ssp) or accumulate until the clock is complete (sync);
//  * PullReady — may a pull by `worker` at `clock` be answered now, or must it wait;
//  * OnClock / OnJoin / OnWorkerDead — membership and progress, so a dead worker leaves the
//    accounting and an elastic one joins it.
// The policy changes weights only through ShardUpdater (one update by the shard's rule per call).
//
// Membership. Worker ids 0..max_workers-1 are accounted for (others are refused before they
// reach the policy). Ids < expected_workers start live; ids >= expected_workers are elastic
// joiners: absent (not waited for) until they register (OnJoin) or first push / clock; a live
// worker leaves on OnWorkerDead. A registering worker that was declared dead is live again (a
// worker restarted with its id); a finished one is not (a finished worker's client registering
// with a restarted server must not make the others wait for it).
//
// State. SaveState / LoadState put everything the policy knows (each worker's state and clock;
// sync's per-chunk partial sums and contributors) into a shard checkpoint, so checkpoint +
// write-ahead log replay (server/wal.h) rebuild the exact policy, mid-clock included.
//
// Thread-safety: not thread-safe; owned and called by the shard's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/config/consistency.h"
#include "common/tensor_file.h"
#include "common/status.h"

namespace downpour {

// One validated chunk of a gradient push. `grad` (count floats) stays valid during OnPush only.
struct PushChunk {
  int local = 0;              // index among the shard's own chunks
  const float* grad = nullptr;
  int64_t count = 0;
  int64_t version_from = 0;   // chunk version the worker computed the gradient from
  // Keeps `grad` readable after the call that handed it over (the received message); null: only
  // during that call. The shard applies a kept gradient on a lane of its own (apply_lanes.h).
  std::shared_ptr<const void> keep;
};

struct PushContext {
  int32_t worker = 0;
  int64_t clock = 0;  // the worker's iteration that produced the gradient
};

// What a policy may do to the shard's chunks.
class ShardUpdater {
 public:
  virtual ~ShardUpdater() = default;
  virtual int num_local() const = 0;
  virtual int64_t version(int local) const = 0;
  virtual int64_t count(int local) const = 0;
  // One update by the shard's UpdateRule of chunk `local` with grad * grad_scale at lr (from the
  // lr policy at the chunk's schedule iteration) times lr_scale; bumps the version. `gradients` is how many worker
  // gradients the update combines (1 applied on arrival, n averaged in sync): the schedule
  // iteration advances by gradients × batches per push (common/solver/lr_policy.h). `keep` keeps
  // `grad` readable until the update has run (the update may run after the call returns, before
  // any later read of the chunk); null: the update has run when the call returns.
  virtual void Apply(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
                     std::shared_ptr<const void> keep) = 0;
  // Records one measured staleness of chunk `local` (versions the gradient was behind when
  // taken); the push's ack reports it to the worker.
  virtual void RecordStaleness(int local, int64_t staleness) = 0;
  // sum = grad (`first`) or sum += grad, count floats, done where chunk `local`'s updates are
  // (its lane) and in order with them: a later Apply of `sum` sees it. `sum` must stay valid and
  // untouched by the caller until an Apply of it (or the next Accumulate into it) was handed
  // over; `keep` keeps `grad` readable (null: done when the call returns).
  virtual void Accumulate(int local, float* sum, const float* grad, int64_t count, bool first,
                          std::shared_ptr<const void> keep) = 0;
};

enum class PushOutcome { kApplied, kAccumulated, kDroppedLate };

class ConsistencyPolicy {
 public:
  virtual ~ConsistencyPolicy() = default;
  virtual Status CheckPush(const ShardUpdater& shard, const PushContext& ctx,
                           std::span<const PushChunk> chunks) const = 0;
  virtual PushOutcome OnPush(ShardUpdater& shard, const PushContext& ctx,
                             std::span<const PushChunk> chunks) = 0;
  virtual bool PullReady(const ShardUpdater& shard, int32_t worker, int64_t clock,
                         std::span<const int> locals) const = 0;
  // The worker has finished iteration `clock` (clock messages, and implied by its pushes).
  virtual void OnClock(int32_t worker, int64_t clock) = 0;
  // `worker` registered: an elastic joiner, or a worker declared dead coming back, is live from
  // now on (CanJoin says whether it would change anything; the shard logs the join only then).
  // A finished worker stays gone.
  virtual bool CanJoin(int32_t worker) const = 0;
  virtual bool OnJoin(int32_t worker) = 0;
  // Whether `worker` is live now (registered / started and not gone).
  virtual bool IsLive(int32_t worker) const = 0;
  virtual int LiveWorkers() const = 0;
  // The coordinator declared `worker` gone — dead (silent), or finished: drop it from the
  // accounting (sync may now complete a clock and apply).
  virtual void OnWorkerDead(ShardUpdater& shard, int32_t worker, bool finished) = 0;
  // The slowest live worker's clock (iterations finished) as this shard knows it, from pushes
  // and clock messages, in every mode (ssp waits on it; the others report it for the logs);
  // INT64_MAX when no worker is live.
  virtual int64_t MinLiveClock() const = 0;

  // Policy state into / out of a shard checkpoint: meta keys and tensors named "policy.*".
  // LoadState checks the file against this policy and `shard` (worker count, chunk sizes) and
  // names `path` and the field in errors; on error the policy is unchanged.
  virtual void SaveState(TensorFile* file) const = 0;
  virtual Status LoadState(const TensorFile& file, const ShardUpdater& shard, const std::string& path) = 0;
};

// Sync only: whether `worker` takes part in the round that turns a chunk's version `version`
// into version + 1. Empty = every live worker. A pipeline whose stages' holders of a model train
// it together (common/rotation.h HoldsModel) gives the holders of the stage the round is in: the
// round waits for its live holders only (less backups), and a push of the current round by any
// other worker is refused (CheckPush). A pure function of (worker, version), so checkpoint and
// write-ahead-log replay rebuild the same rounds.
using RoundMembers = std::function<bool(int32_t worker, int64_t version)>;

// expected_workers: W of the run (ids 0..W-1 start live); max_workers (>= W; 0 = W): ids
// 0..max_workers-1 are accounted for.
std::unique_ptr<ConsistencyPolicy> MakeConsistencyPolicy(const ConsistencyConfig& config, int expected_workers,
                                                         int max_workers = 0, RoundMembers round_members = {});

}  // namespace downpour
