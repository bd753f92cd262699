// dc_asgd.cc — see dc_asgd.h.
#include "server/rules/dc_asgd.h"

#include <cmath>

namespace downpour {

DcAsgdRule::DcAsgdRule(const ConsistencyConfig& config, int max_workers, int chunks)
    : adaptive_(config.algorithm == Algorithm::kDcAsgdAdaptive),
      lambda_(adaptive_ ? config.dc_lambda0 : config.dc_lambda),
      decay_(config.dc_mean_square_decay),
      chunks_(chunks),
      pulled_(static_cast<size_t>(max_workers)),
      mean_square_(adaptive_ ? static_cast<size_t>(chunks) : 0) {}

void DcAsgdRule::OnPullServed(RuleShard& shard, int32_t worker, std::span<const int> locals) {
  if (worker < 0 || static_cast<size_t>(worker) >= pulled_.size()) return;
  ChunkStore& store = shard.store();
  store.Drain();  // the copies are of the weights the reply carries
  auto& mine = pulled_[static_cast<size_t>(worker)];
  if (mine.empty()) mine.resize(static_cast<size_t>(chunks_));
  for (int l : locals) {
    PulledCopy& copy = mine[static_cast<size_t>(l)];
    copy.weights = store.weights(l);
    copy.version = store.version(l);
  }
}

void DcAsgdRule::NextMeanSquare(int local, const float* g, int64_t count, std::vector<float>* next) const {
  const std::vector<float>& v = mean_square_[static_cast<size_t>(local)];
  const bool first = v.size() != static_cast<size_t>(count);
  next->resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const float g2 = g[j] * g[j];
    (*next)[static_cast<size_t>(j)] = first ? g2 : decay_ * v[static_cast<size_t>(j)] + (1.0f - decay_) * g2;
  }
}

void DcAsgdRule::Prepare(RuleShard& shard, int32_t worker, std::vector<PushChunk>* chunks) {
  ChunkStore& store = shard.store();
  store.Drain();  // compensation reads the weights as they are now
  uint64_t& compensated = shard.stats().dc_compensated;
  uint64_t& uncompensated = shard.stats().dc_uncompensated;
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
    if (copy == nullptr || copy->version != c.version_from || copy->weights.size() != static_cast<size_t>(c.count)) {
      ++uncompensated;
      continue;
    }
    std::vector<float>& out = scratch_[i];
    out.resize(static_cast<size_t>(c.count));
    const float* w = store.weights(c.local).data();
    const float* w0 = copy->weights.data();
    for (int64_t j = 0; j < c.count; ++j) {
      const float g = c.grad[j];
      // ms[j] >= g² (1 − m) > 0 whenever g != 0; where g == 0 there is nothing to compensate.
      const float lam = ms == nullptr ? lambda_ : (ms[j] > 0.0f ? lambda_ / std::sqrt(ms[j]) : 0.0f);
      out[static_cast<size_t>(j)] = g + lam * g * g * (w[j] - w0[j]);
    }
    c.grad = out.data();
    ++compensated;
  }
}

void DcAsgdRule::Commit(std::span<const PushChunk> chunks) {
  if (!adaptive_) return;
  for (size_t i = 0; i < chunks.size(); ++i) mean_square_[static_cast<size_t>(chunks[i].local)].swap(next_[i]);
}

void DcAsgdRule::Replay(int local, const float* g, int64_t count) {
  if (!adaptive_) return;
  std::vector<float> next;
  NextMeanSquare(local, g, count, &next);
  mean_square_[static_cast<size_t>(local)].swap(next);
}

std::vector<float> DcAsgdRule::ChunkState(int local) const {
  if (!adaptive_ || local < 0 || local >= chunks_) return {};
  return mean_square_[static_cast<size_t>(local)];
}

void DcAsgdRule::SetChunkState(int local, std::vector<float> state) {
  if (!adaptive_ || local < 0 || local >= chunks_) return;
  mean_square_[static_cast<size_t>(local)] = std::move(state);
}

}  // namespace downpour
