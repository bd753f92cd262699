// dc_asgd.h — DC-ASGD (Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay
// Compensation", ICML 2017): a worker's gradient push, compensated for its delay before it is
// taken, g' = g + λ · g ⊙ g ⊙ (w_now − w_pulled), where w_pulled is the chunk as this worker last
// pulled it; then taken as any gradient (gradient.h). Only when that copy is of the version the
// gradient was computed from; otherwise (no pull seen since this server started, e.g. after a
// restart) the gradient goes as pushed and is counted. λ is consistency.dc_lambda (the constant
// variant, DC-ASGD-c, "dc-asgd") or, for DC-ASGD-a ("dc-asgd-a"), dc_lambda0 / sqrt(ms) per
// element, ms ← m · ms + (1 − m) · g ⊙ g updated with every gradient (compensated or not) before
// it is used. ms starts at the chunk's first g ⊙ g rather than the paper's 0, whose first steps
// would divide by sqrt((1 − m) · g²), a λ 4.5× too large at m = 0.95.
//
// The shard logs and applies the compensated gradient (rewrites()), so a replay repeats it;
// DC-ASGD-a's log records keep the raw gradients too (keeps_raw(), server/wal.h kWalFlagRaw),
// from which Replay rebuilds the mean squares; checkpoints keep them (chunk<id>.dc_mean_square).
//
// Memory: a copy of every chunk per worker id that pulled it (up to max_workers × the shard).
#pragma once

#include <cstdint>
#include <vector>

#include "common/config/consistency.h"
#include "server/rules/gradient.h"

namespace downpour {

class DcAsgdRule final : public GradientRule {
 public:
  // consistency.algorithm "dc-asgd" or "dc-asgd-a"; worker ids 0..max_workers-1; `chunks` local
  // chunks.
  DcAsgdRule(const ConsistencyConfig& config, int max_workers, int chunks);

  std::string_view name() const override { return adaptive_ ? "dc-asgd-a" : "dc-asgd"; }
  bool rewrites() const override { return true; }
  bool keeps_raw() const override { return adaptive_; }
  // Compensates each chunk's gradient against `worker`'s copy, pointing it at this rule's scratch;
  // DC-ASGD-a stages each chunk's next mean square, which Commit makes the chunk's. Counts the
  // chunks compensated and those applied as pushed (stats dc_compensated, dc_uncompensated).
  void Prepare(RuleShard& shard, int32_t worker, std::vector<PushChunk>* chunks) override;
  void Commit(std::span<const PushChunk> chunks) override;
  // The worker's copies now (its pull's versions: compensation reads the weights it was served).
  void OnPullServed(RuleShard& shard, int32_t worker, std::span<const int> locals) override;
  // DC-ASGD-a: chunk `local`'s mean square moves on by the raw gradient `raw` (a server resumed
  // with DC-ASGD-c has no mean square to rebuild: the applied gradients alone restore its weights).
  void Replay(int local, const float* raw, int64_t count) override;

  // DC-ASGD-a's mean squares ("dc_mean_square"): a chunk no gradient has reached has none.
  std::string_view state_name() const override { return adaptive_ ? "dc_mean_square" : ""; }
  std::vector<float> ChunkState(int local) const override;
  void SetChunkState(int local, std::vector<float> state) override;

 private:
  struct PulledCopy {
    std::vector<float> weights;
    int64_t version = -1;
  };
  // m · ms + (1 − m) · g ⊙ g (the first: g ⊙ g) into `next`.
  void NextMeanSquare(int local, const float* g, int64_t count, std::vector<float>* next) const;

  const bool adaptive_;
  const float lambda_;  // dc_lambda, or DC-ASGD-a's dc_lambda0
  const float decay_;   // dc_mean_square_decay
  const int chunks_;
  std::vector<std::vector<PulledCopy>> pulled_;  // per worker id, per local chunk (empty until it pulls)
  std::vector<std::vector<float>> mean_square_;  // per local chunk (DC-ASGD-a)
  std::vector<std::vector<float>> scratch_;      // the push being compensated: its gradients
  std::vector<std::vector<float>> next_;         // ... and DC-ASGD-a's mean squares with it
};

}  // namespace downpour
