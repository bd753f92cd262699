// consistency.cc — see consistency.h.
#include "server/consistency.h"

#include <algorithm>
#include <limits>

namespace downpour {
namespace {

int64_t Staleness(const ShardUpdater& shard, const PushChunk& c) {
  return std::max<int64_t>(0, shard.version(c.local) - c.version_from);
}

// Tracks which workers are alive and how far each has got (clock = iterations finished).
class Membership {
 public:
  explicit Membership(int workers) : clock_(static_cast<size_t>(std::max(workers, 0)), 0),
                                     dead_(clock_.size(), false) {}
  bool Known(int32_t w) const { return w >= 0 && static_cast<size_t>(w) < clock_.size(); }
  void Advance(int32_t w, int64_t finished) {
    if (Known(w)) clock_[static_cast<size_t>(w)] = std::max(clock_[static_cast<size_t>(w)], finished);
  }
  void Kill(int32_t w) {
    if (Known(w)) dead_[static_cast<size_t>(w)] = true;
  }
  bool Dead(int32_t w) const { return Known(w) && dead_[static_cast<size_t>(w)]; }
  int Live() const { return static_cast<int>(std::count(dead_.begin(), dead_.end(), false)); }
  // Slowest live worker's clock; max int64 when none is live (nobody to wait for).
  int64_t MinLiveClock() const {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < clock_.size(); ++i) {
      if (!dead_[i]) m = std::min(m, clock_[i]);
    }
    return m;
  }

 private:
  std::vector<int64_t> clock_;
  std::vector<bool> dead_;
};

// Downpour: apply every gradient on arrival; optional lr / staleness. Clocks are tracked only to
// be reported (MinLiveClock); nothing waits on them.
class AsyncPolicy : public ConsistencyPolicy {
 public:
  AsyncPolicy(bool staleness_aware, int workers) : staleness_aware_(staleness_aware), members_(workers) {}
  Status CheckPush(const ShardUpdater&, const PushContext&, std::span<const PushChunk>) const override {
    return Status::Ok();
  }
  PushOutcome OnPush(ShardUpdater& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    members_.Advance(ctx.worker, ctx.clock + 1);
    for (const PushChunk& c : chunks) {
      const int64_t s = Staleness(shard, c);
      shard.RecordStaleness(s);
      const float lr_scale = staleness_aware_ && s > 1 ? 1.0f / static_cast<float>(s) : 1.0f;
      shard.Apply(c.local, c.grad, 1.0f, lr_scale);
    }
    return PushOutcome::kApplied;
  }
  bool PullReady(const ShardUpdater&, int32_t, int64_t, std::span<const int>) const override { return true; }
  void OnClock(int32_t worker, int64_t clock) override { members_.Advance(worker, clock + 1); }
  void OnWorkerDead(ShardUpdater&, int32_t worker) override { members_.Kill(worker); }
  int64_t MinLiveClock() const override { return members_.MinLiveClock(); }

 private:
  bool staleness_aware_;
  Membership members_;
};

// ssp:s — apply on arrival like async; a pull at clock c waits until the slowest live worker
// has finished c - s iterations, so no worker reads weights while more than s clocks ahead.
class SspPolicy : public AsyncPolicy {
 public:
  SspPolicy(int bound, bool staleness_aware, int workers) : AsyncPolicy(staleness_aware, workers), bound_(bound) {}
  bool PullReady(const ShardUpdater&, int32_t, int64_t clock, std::span<const int>) const override {
    return MinLiveClock() >= clock - bound_;
  }

 private:
  int bound_;
};

// BSP: per chunk, gradients of clock t (t = the chunk's version) are summed until
// live - backup workers have contributed, then applied once as their average. Pushes for a clock
// already applied (backup workers arriving late) are dropped and counted; a pull at clock c waits
// until every requested chunk has applied clock c - 1.
class SyncPolicy : public ConsistencyPolicy {
 public:
  SyncPolicy(int backup, int workers) : backup_(backup), members_(workers) {}

  Status CheckPush(const ShardUpdater& shard, const PushContext& ctx,
                   std::span<const PushChunk> chunks) const override {
    if (!members_.Known(ctx.worker)) {
      return InvalidArgument("sync: worker id {} is outside 0..{}", ctx.worker, members_.Live() - 1);
    }
    EnsureSized(shard);
    for (const PushChunk& c : chunks) {
      const int64_t now = shard.version(c.local);
      if (ctx.clock > now) {
        return InvalidArgument("sync: worker {} pushed clock {} but the shard is at clock {}",
                               ctx.worker, ctx.clock, now);
      }
      if (ctx.clock == now && Contributed(c.local, ctx.worker)) {
        return InvalidArgument("sync: worker {} pushed clock {} twice", ctx.worker, ctx.clock);
      }
    }
    return Status::Ok();
  }

  PushOutcome OnPush(ShardUpdater& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    EnsureSized(shard);
    bool any_taken = false;
    for (const PushChunk& c : chunks) {
      if (ctx.clock < shard.version(c.local)) continue;  // late: that clock is applied
      any_taken = true;
      shard.RecordStaleness(Staleness(shard, c));
      Acc& a = acc_[static_cast<size_t>(c.local)];
      if (a.sum.empty()) a.sum.assign(static_cast<size_t>(c.count), 0.0f);
      for (int64_t i = 0; i < c.count; ++i) a.sum[static_cast<size_t>(i)] += c.grad[i];
      a.workers.push_back(ctx.worker);
      MaybeApply(shard, c.local);
    }
    members_.Advance(ctx.worker, ctx.clock + 1);
    return any_taken ? PushOutcome::kAccumulated : PushOutcome::kDroppedLate;
  }

  bool PullReady(const ShardUpdater& shard, int32_t, int64_t clock, std::span<const int> locals) const override {
    for (int l : locals) {
      if (shard.version(l) < clock) return false;
    }
    return true;
  }
  void OnClock(int32_t worker, int64_t clock) override { members_.Advance(worker, clock + 1); }
  int64_t MinLiveClock() const override { return members_.MinLiveClock(); }
  void OnWorkerDead(ShardUpdater& shard, int32_t worker) override {
    members_.Kill(worker);
    EnsureSized(shard);
    for (int l = 0; l < shard.num_local(); ++l) MaybeApply(shard, l);
  }

 private:
  struct Acc {
    std::vector<float> sum;        // sum of this clock's gradients, count floats
    std::vector<int32_t> workers;  // who contributed
  };
  void EnsureSized(const ShardUpdater& shard) const {
    if (acc_.size() != static_cast<size_t>(shard.num_local())) acc_.resize(static_cast<size_t>(shard.num_local()));
  }
  bool Contributed(int local, int32_t w) const {
    const auto& ws = acc_[static_cast<size_t>(local)].workers;
    return std::find(ws.begin(), ws.end(), w) != ws.end();
  }
  int Needed() const { return std::max(1, members_.Live() - backup_); }
  void MaybeApply(ShardUpdater& shard, int local) {
    Acc& a = acc_[static_cast<size_t>(local)];
    const int have = static_cast<int>(a.workers.size());
    if (have == 0 || have < Needed()) return;
    shard.Apply(local, a.sum.data(), 1.0f / static_cast<float>(have), 1.0f);
    std::fill(a.sum.begin(), a.sum.end(), 0.0f);
    a.workers.clear();
  }

  int backup_;
  Membership members_;
  mutable std::vector<Acc> acc_;  // per local chunk; sized lazily to the shard
};

}  // namespace

std::unique_ptr<ConsistencyPolicy> MakeConsistencyPolicy(const ConsistencyConfig& config,
                                                         int expected_workers) {
  switch (config.mode) {
    case ConsistencyMode::kSync:
      return std::make_unique<SyncPolicy>(config.backup_workers, expected_workers);
    case ConsistencyMode::kSsp:
      return std::make_unique<SspPolicy>(config.staleness_bound, config.staleness_aware_lr, expected_workers);
    case ConsistencyMode::kAsync:
      break;
  }
  return std::make_unique<AsyncPolicy>(config.staleness_aware_lr, expected_workers);
}

}  // namespace downpour
