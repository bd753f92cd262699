// delay_compensation.h — DC-ASGD on a shard (Zheng et al., "Asynchronous Stochastic Gradient
// Descent with Delay Compensation", ICML 2017): g' = g + λ · g ⊙ g ⊙ (w_now − w_pulled), where
// w_pulled is the chunk as this worker last pulled it. Only when that copy is of the version the
// gradient was computed from; otherwise (no pull seen since this server started, e.g. after a
// restart) the gradient goes as pushed and is counted. λ is consistency.dc_lambda (the constant
// variant, DC-ASGD-c) or, for DC-ASGD-a, dc_lambda0 / sqrt(ms) per element, ms ← m · ms + (1 − m)
// · g ⊙ g updated with every gradient (compensated or not) before it is used. ms starts at the
// chunk's first g ⊙ g rather than the paper's 0, whose first steps would divide by
// sqrt((1 − m) · g²), a λ 4.5× too large at m = 0.95.
//
// The shard logs and applies the compensated gradient, so a replay repeats it; DC-ASGD-a's log
// records keep the raw gradients too (server/wal.h kWalFlagRaw), from which Replay rebuilds the
// mean squares; checkpoints keep them (chunk<id>.dc_mean_square).
//
// Memory: a copy of every chunk per worker id that pulled it (up to max_workers × the shard).
// Thread-safety: none; the shard calls it under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/config/consistency.h"
#include "server/consistency.h"

namespace downpour {

class DelayCompensation {
 public:
  // consistency.algorithm "dc-asgd" or "dc-asgd-a"; worker ids 0..max_workers-1; `chunks` local
  // chunks.
  DelayCompensation(const ConsistencyConfig& config, int max_workers, int chunks);

  bool adaptive() const { return adaptive_; }

  // A pull of `worker` was served chunk `local` as `weights` at `version`: its copy now.
  void RememberPulled(int32_t worker, int local, const std::vector<float>& weights, int64_t version);

  // Compensates each chunk's gradient against `worker`'s copy, pointing it at this object's
  // scratch (valid until the next Compensate); `weights_now(local)` is the chunk's weights.
  // DC-ASGD-a: stages each chunk's next mean square, which Commit makes the chunk's. Counts the
  // chunks compensated and those applied as pushed.
  void Compensate(int32_t worker, std::vector<PushChunk>* chunks, const std::function<const float*(int)>& weights_now,
                  uint64_t* compensated, uint64_t* uncompensated);
  // DC-ASGD-a: the push Compensate saw was taken; its staged mean squares become its chunks'.
  void Commit(const std::vector<PushChunk>& chunks);
  // DC-ASGD-a, replaying the log: chunk `local`'s mean square moves on by the raw gradient `g`.
  void Replay(int local, const float* g, int64_t count);

  // DC-ASGD-a's running mean square of chunk `local`; empty until its first gradient (and for
  // DC-ASGD-c).
  const std::vector<float>& mean_square(int local) const { return mean_square_[static_cast<size_t>(local)]; }
  void set_mean_square(int local, std::vector<float> ms) { mean_square_[static_cast<size_t>(local)] = std::move(ms); }

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
  std::vector<std::vector<PulledCopy>> pulled_;   // per worker id, per local chunk (empty until it pulls)
  std::vector<std::vector<float>> mean_square_;   // per local chunk (DC-ASGD-a)
  std::vector<std::vector<float>> scratch_;       // the push being compensated: its gradients
  std::vector<std::vector<float>> next_;          // ... and DC-ASGD-a's mean squares with it
};

}  // namespace downpour
