// delay_compensation.cc — see delay_compensation.h.
#include "server/delay_compensation.h"

#include <cmath>

namespace downpour {

DelayCompensation::DelayCompensation(const ConsistencyConfig& config, int max_workers, int chunks)
    : adaptive_(config.algorithm == Algorithm::kDcAsgdAdaptive),
      lambda_(adaptive_ ? config.dc_lambda0 : config.dc_lambda),
      decay_(config.dc_mean_square_decay),
      chunks_(chunks),
      pulled_(static_cast<size_t>(max_workers)),
      mean_square_(adaptive_ ? static_cast<size_t>(chunks) : 0) {}

void DelayCompensation::RememberPulled(int32_t worker, int local, const std::vector<float>& weights,
                                       int64_t version) {
  if (worker < 0 || static_cast<size_t>(worker) >= pulled_.size()) return;
  auto& mine = pulled_[static_cast<size_t>(worker)];
  if (mine.empty()) mine.resize(static_cast<size_t>(chunks_));
  PulledCopy& copy = mine[static_cast<size_t>(local)];
  copy.weights = weights;
  copy.version = version;
}

void DelayCompensation::NextMeanSquare(int local, const float* g, int64_t count, std::vector<float>* next) const {
  const std::vector<float>& v = mean_square_[static_cast<size_t>(local)];
  const bool first = v.size() != static_cast<size_t>(count);
  next->resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const float g2 = g[j] * g[j];
    (*next)[static_cast<size_t>(j)] = first ? g2 : decay_ * v[static_cast<size_t>(j)] + (1.0f - decay_) * g2;
  }
}

void DelayCompensation::Compensate(int32_t worker, std::vector<PushChunk>* chunks,
                                   const std::function<const float*(int)>& weights_now, uint64_t* compensated,
                                   uint64_t* uncompensated) {
  // This worker's pulled copies; empty when it has pulled nothing here (or is no known worker).
  static const std::vector<PulledCopy> kNone;
  const bool known = worker >= 0 && static_cast<size_t>(worker) < pulled_.size();
  const std::vector<PulledCopy>& mine = known ? pulled_[static_cast<size_t>(worker)] : kNone;
  scratch_.resize(chunks->size());
  if (adaptive_) next_.resize(chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) {
    PushChunk& c = (*chunks)[i];
    const float* ms = nullptr;
    if (adaptive_) {  // the new mean square, with this gradient in it, is the one λ uses
      NextMeanSquare(c.local, c.grad, c.count, &next_[i]);
      ms = next_[i].data();
    }
    const PulledCopy* copy = mine.empty() ? nullptr : &mine[static_cast<size_t>(c.local)];
    if (copy == nullptr || copy->version != c.version_from ||
        copy->weights.size() != static_cast<size_t>(c.count)) {
      ++*uncompensated;
      continue;
    }
    std::vector<float>& out = scratch_[i];
    out.resize(static_cast<size_t>(c.count));
    const float* w = weights_now(c.local);
    const float* w0 = copy->weights.data();
    for (int64_t j = 0; j < c.count; ++j) {
      const float g = c.grad[j];
      // ms[j] >= g² (1 − m) > 0 whenever g != 0; where g == 0 there is nothing to compensate.
      const float lam = ms == nullptr ? lambda_ : (ms[j] > 0.0f ? lambda_ / std::sqrt(ms[j]) : 0.0f);
      out[static_cast<size_t>(j)] = g + lam * g * g * (w[j] - w0[j]);
    }
    c.grad = out.data();
    ++*compensated;
  }
}

void DelayCompensation::Commit(const std::vector<PushChunk>& chunks) {
  if (!adaptive_) return;
  for (size_t i = 0; i < chunks.size(); ++i) mean_square_[static_cast<size_t>(chunks[i].local)].swap(next_[i]);
}

void DelayCompensation::Replay(int local, const float* g, int64_t count) {
  if (!adaptive_) return;
  std::vector<float> next;
  NextMeanSquare(local, g, count, &next);
  mean_square_[static_cast<size_t>(local)].swap(next);
}

}  // namespace downpour
