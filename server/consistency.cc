// consistency.cc — see consistency.h.
#include "server/consistency.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace downpour {
namespace {

int64_t Staleness(const ShardUpdater& shard, const PushChunk& c) {
  return std::max<int64_t>(0, shard.version(c.local) - c.version_from);
}

std::string MetaOf(const TensorFile& file, const std::string& key) {
  auto it = file.meta.find(key);
  return it == file.meta.end() ? std::string() : it->second;
}

// Tracks which workers are alive and how far each has got (clock = iterations finished).
// Ids 0..expected-1 start live, expected..max-1 absent until they join (elastic). A worker
// declared dead may come back (a restarted worker registers again); a finished one never does
// (its client re-registering with a restarted server must not make the others wait for it).
class Membership {
 public:
  enum State : int64_t { kAbsent = 0, kLive = 1, kDead = 2, kFinished = 3 };
  Membership(int expected, int max_workers)
      : clock_(static_cast<size_t>(std::max({max_workers, expected, 0})), 0), state_(clock_.size(), kAbsent) {
    for (int i = 0; i < expected; ++i) state_[static_cast<size_t>(i)] = kLive;
  }
  bool Known(int32_t w) const { return w >= 0 && static_cast<size_t>(w) < clock_.size(); }
  // A push or clock: progress, and an absent elastic worker joins (a gone one stays gone).
  void Advance(int32_t w, int64_t finished) {
    if (!Known(w)) return;
    const auto i = static_cast<size_t>(w);
    clock_[i] = std::max(clock_[i], finished);
    if (state_[i] == kAbsent) state_[i] = kLive;
  }
  bool CanJoin(int32_t w) const {
    return Known(w) && (state_[static_cast<size_t>(w)] == kAbsent || state_[static_cast<size_t>(w)] == kDead);
  }
  bool Join(int32_t w) {
    if (!CanJoin(w)) return false;
    state_[static_cast<size_t>(w)] = kLive;
    return true;
  }
  void Kill(int32_t w, bool finished) {
    if (Known(w)) state_[static_cast<size_t>(w)] = finished ? kFinished : kDead;
  }
  bool IsLive(int32_t w) const { return Known(w) && state_[static_cast<size_t>(w)] == kLive; }
  int Live() const { return static_cast<int>(std::count(state_.begin(), state_.end(), kLive)); }
  int size() const { return static_cast<int>(clock_.size()); }
  // Slowest live worker's clock; max int64 when none is live (nobody to wait for).
  int64_t MinLiveClock() const {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < clock_.size(); ++i) {
      if (state_[i] == kLive) m = std::min(m, clock_[i]);
    }
    return m;
  }
  void Save(TensorFile* file) const {
    file->meta["policy.member_clocks"] = FormatMetaInts(clock_);
    file->meta["policy.member_states"] = FormatMetaInts(std::vector<int64_t>(state_.begin(), state_.end()));
  }
  Status Load(const TensorFile& file, const std::string& path) {
    std::vector<int64_t> clocks, states;
    DP_RETURN_IF_ERROR(ParseMetaInts(MetaOf(file, "policy.member_clocks"), path, "policy.member_clocks", &clocks));
    DP_RETURN_IF_ERROR(ParseMetaInts(MetaOf(file, "policy.member_states"), path, "policy.member_states", &states));
    if (clocks.size() != clock_.size() || states.size() != clock_.size()) {
      return FailedPrecondition(
          "{}: meta 'policy.member_clocks' / 'policy.member_states' hold {} / {} workers; this server accounts for {} "
          "(cluster.max_workers)",
          path, clocks.size(), states.size(), clock_.size());
    }
    for (int64_t st : states) {
      if (st < kAbsent || st > kFinished) return Corrupt("{}: meta 'policy.member_states': bad state {}", path, st);
    }
    clock_ = clocks;
    for (size_t i = 0; i < states.size(); ++i) state_[i] = static_cast<State>(states[i]);
    return Status::Ok();
  }

 private:
  std::vector<int64_t> clock_;
  std::vector<State> state_;
};

// Downpour: apply every gradient on arrival; optional lr / staleness. Clocks are tracked only to
// be reported (MinLiveClock); nothing waits on them.
class AsyncPolicy : public ConsistencyPolicy {
 public:
  AsyncPolicy(bool staleness_aware, int workers, int max_workers)
      : staleness_aware_(staleness_aware), members_(workers, max_workers) {}
  Status CheckPush(const ShardUpdater&, const PushContext&, std::span<const PushChunk>) const override {
    return Status::Ok();
  }
  PushOutcome OnPush(ShardUpdater& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    members_.Advance(ctx.worker, ctx.clock + 1);
    for (const PushChunk& c : chunks) {
      const int64_t s = Staleness(shard, c);
      shard.RecordStaleness(c.local, s);
      const float lr_scale = staleness_aware_ && s > 1 ? 1.0f / static_cast<float>(s) : 1.0f;
      shard.Apply(c.local, c.grad, 1.0f, lr_scale, 1, c.keep);
    }
    return PushOutcome::kApplied;
  }
  bool PullReady(const ShardUpdater&, int32_t, int64_t, std::span<const int>) const override { return true; }
  void OnClock(int32_t worker, int64_t clock) override { members_.Advance(worker, clock + 1); }
  void OnWorkerDead(ShardUpdater&, int32_t worker, bool finished) override { members_.Kill(worker, finished); }
  bool OnJoin(int32_t worker) override { return members_.Join(worker); }
  bool CanJoin(int32_t worker) const override { return members_.CanJoin(worker); }
  bool IsLive(int32_t worker) const override { return members_.IsLive(worker); }
  int LiveWorkers() const override { return members_.Live(); }
  int64_t MinLiveClock() const override { return members_.MinLiveClock(); }
  void SaveState(TensorFile* file) const override { members_.Save(file); }
  Status LoadState(const TensorFile& file, const ShardUpdater&, const std::string& path) override {
    return members_.Load(file, path);
  }

 private:
  bool staleness_aware_;
  Membership members_;
};

// ssp:s — apply on arrival like async; a pull at clock c waits until the slowest live worker
// has finished c - s iterations, so no worker reads weights while more than s clocks ahead.
class SspPolicy : public AsyncPolicy {
 public:
  SspPolicy(int bound, bool staleness_aware, int workers, int max_workers)
      : AsyncPolicy(staleness_aware, workers, max_workers), bound_(bound) {}
  bool PullReady(const ShardUpdater&, int32_t, int64_t clock, std::span<const int>) const override {
    return MinLiveClock() >= clock - bound_;
  }

 private:
  int bound_;
};

// BSP: per chunk, gradients of clock t (t = the chunk's version) are summed until
// live - backup of the live workers have contributed, then applied once as their average. Pushes for a clock
// already applied (backup workers arriving late) are dropped and counted; a pull at clock c waits
// until every requested chunk has applied clock c - 1.
class SyncPolicy : public ConsistencyPolicy {
 public:
  SyncPolicy(int backup, int workers, int max_workers, RoundMembers round)
      : backup_(backup), members_(workers, max_workers), round_(std::move(round)) {}

  Status CheckPush(const ShardUpdater& shard, const PushContext& ctx,
                   std::span<const PushChunk> chunks) const override {
    if (!members_.Known(ctx.worker)) {
      return InvalidArgument("sync: worker id {} is outside 0..{}", ctx.worker, members_.size() - 1);
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
      if (ctx.clock == now && round_ && !round_(ctx.worker, now)) {
        return InvalidArgument("sync: worker {} pushed clock {}, but that round belongs to other workers (the "
                               "stage's holders of this model)",
                               ctx.worker, ctx.clock);
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
      shard.RecordStaleness(c.local, Staleness(shard, c));
      Acc& a = acc_[static_cast<size_t>(c.local)];
      const bool first = a.workers.empty();  // the clock's first gradient starts the sum
      if (a.sum == nullptr) a.sum = std::make_shared<std::vector<float>>(static_cast<size_t>(c.count));
      shard.Accumulate(c.local, a.sum->data(), c.grad, c.count, first, c.keep);
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
  void OnWorkerDead(ShardUpdater& shard, int32_t worker, bool finished) override {
    members_.Kill(worker, finished);
    EnsureSized(shard);
    for (int l = 0; l < shard.num_local(); ++l) MaybeApply(shard, l);
  }
  bool OnJoin(int32_t worker) override { return members_.Join(worker); }
  bool CanJoin(int32_t worker) const override { return members_.CanJoin(worker); }
  bool IsLive(int32_t worker) const override { return members_.IsLive(worker); }
  int LiveWorkers() const override { return members_.Live(); }

  // Per local chunk with a partial clock: meta "policy.acc_workers.<local>" (contributors) and
  // tensor "policy.acc_sum.<local>" (their summed gradients).
  void SaveState(TensorFile* file) const override {
    members_.Save(file);
    for (size_t l = 0; l < acc_.size(); ++l) {
      const Acc& a = acc_[l];
      if (a.workers.empty()) continue;
      file->meta[fmt::format("policy.acc_workers.{}", l)] =
          FormatMetaInts(std::vector<int64_t>(a.workers.begin(), a.workers.end()));
      file->tensors.push_back(
          NamedTensor{fmt::format("policy.acc_sum.{}", l), {static_cast<int64_t>(a.sum->size())}, *a.sum});
    }
  }
  Status LoadState(const TensorFile& file, const ShardUpdater& shard, const std::string& path) override {
    Membership m = members_;
    DP_RETURN_IF_ERROR(m.Load(file, path));
    std::vector<Acc> acc(static_cast<size_t>(shard.num_local()));
    for (size_t l = 0; l < acc.size(); ++l) {
      const std::string key = fmt::format("policy.acc_workers.{}", l);
      auto it = file.meta.find(key);
      if (it == file.meta.end()) continue;
      std::vector<int64_t> ws;
      DP_RETURN_IF_ERROR(ParseMetaInts(it->second, path, key, &ws));
      for (int64_t w : ws) {
        if (!m.Known(static_cast<int32_t>(w))) return Corrupt("{}: meta '{}': worker {} out of range", path, key, w);
        acc[l].workers.push_back(static_cast<int32_t>(w));
      }
      const std::string name = fmt::format("policy.acc_sum.{}", l);
      const NamedTensor* t = FindTensor(file, name);
      const auto count = static_cast<size_t>(shard.count(static_cast<int>(l)));
      if (t == nullptr || t->data.size() != count) {
        return Corrupt("{}: tensor '{}' is missing or not {} floats", path, name, count);
      }
      acc[l].sum = std::make_shared<std::vector<float>>(t->data);
    }
    members_ = m;
    acc_ = std::move(acc);
    return Status::Ok();
  }

 private:
  struct Acc {
    // Sum of this clock's gradients, count floats (written where the chunk's updates are,
    // ShardUpdater::Accumulate; valid while `workers` is not empty); null before the first clock.
    // Shared with the update that reads it.
    std::shared_ptr<std::vector<float>> sum;
    std::vector<int32_t> workers;  // who contributed
  };
  void EnsureSized(const ShardUpdater& shard) const {
    if (acc_.size() != static_cast<size_t>(shard.num_local())) acc_.resize(static_cast<size_t>(shard.num_local()));
  }
  bool Contributed(int local, int32_t w) const {
    const auto& ws = acc_[static_cast<size_t>(local)].workers;
    return std::find(ws.begin(), ws.end(), w) != ws.end();
  }
  // A clock is applied once live − backups of the workers still live have contributed to it.
  // Contributions of workers that have since finished or died stay in the sum but do not stand
  // in for a live worker's: when the fast workers finish, the last clock still waits for the
  // live straggler (without backups), and its gradient is not dropped as late.
  void MaybeApply(ShardUpdater& shard, int local) {
    Acc& a = acc_[static_cast<size_t>(local)];
    const int have = static_cast<int>(a.workers.size());
    if (have == 0) return;
    const int have_live = static_cast<int>(
        std::count_if(a.workers.begin(), a.workers.end(), [&](int32_t w) { return members_.IsLive(w); }));
    int expected = members_.Live();
    if (round_) {
      expected = 0;
      for (int32_t w = 0; w < members_.size(); ++w) expected += members_.IsLive(w) && round_(w, shard.version(local)) ? 1 : 0;
    }
    if (have_live < std::max(0, expected - backup_)) return;
    // The update reads the sum where the chunk's updates run, after the accumulations before it;
    // the next clock's first gradient overwrites it there, after this update (one buffer a chunk).
    shard.Apply(local, a.sum->data(), 1.0f / static_cast<float>(have), 1.0f, have, a.sum);
    a.workers.clear();
  }

  int backup_;
  Membership members_;
  RoundMembers round_;            // who a round waits for; empty = every live worker
  mutable std::vector<Acc> acc_;  // per local chunk; sized lazily to the shard
};

}  // namespace

std::unique_ptr<ConsistencyPolicy> MakeConsistencyPolicy(const ConsistencyConfig& config, int expected_workers,
                                                         int max_workers, RoundMembers round_members) {
  switch (config.mode) {
    case ConsistencyMode::kSync:
      return std::make_unique<SyncPolicy>(config.backup_workers, expected_workers, max_workers,
                                          std::move(round_members));
    case ConsistencyMode::kSsp:
      return std::make_unique<SspPolicy>(config.staleness_bound, config.staleness_aware_lr, expected_workers,
                                         max_workers);
    case ConsistencyMode::kAsync:
      break;
  }
  return std::make_unique<AsyncPolicy>(config.staleness_aware_lr, expected_workers, max_workers);
}

}  // namespace downpour
