// pull_ahead.cc — see pull_ahead.h.
#include "client/worker/pull_ahead.h"

#include <algorithm>
#include <cstring>

namespace downpour::worker {

std::vector<std::vector<int32_t>> ChunksByLayer(const engine::Net& net, const ParamLayout& layout) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(net.num_layers()));
  for (int li = 0; li < net.num_layers(); ++li) {
    std::vector<int32_t>& ids = out[static_cast<size_t>(li)];
    for (int t : net.layer_param_tensors(li)) {
      const std::vector<int32_t> in = layout.ChunksInRange(layout.tensor_flat_offset(t), layout.tensor_flat_offset(t + 1));
      ids.insert(ids.end(), in.begin(), in.end());
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  return out;
}

PullAhead::PullAhead(ParamChannel* channel, const ParamLayout& layout,
                     const std::vector<std::vector<int32_t>>& layer_chunks, std::span<float> weights, int lag,
                     std::span<uint16_t> weights16)
    : channel_(channel),
      layout_(layout),
      layer_chunks_(layer_chunks),
      weights_(weights),
      weights16_(weights16),
      lag_(lag) {
  DP_CHECK_GE(lag, 0);
  DP_CHECK(weights16.empty() || (lag == 0 && weights16.size() == weights.size()));
  DP_CHECK_EQ(static_cast<int64_t>(weights.size()), layout.total_elems());
  if (staged()) staging_.assign(weights.size(), 0.0f);
  const auto chunks = static_cast<size_t>(layout.num_chunks());
  in_flight_.assign(chunks, 0);
  landed_.assign(chunks, false);
  landed_step_.assign(chunks, 0);
  held_.assign(chunks, 0);
  held_version_.assign(chunks, -1);
  landed_version_.assign(chunks, -1);
  want_.assign(chunks, -1);
  want_clock_.assign(chunks, 0);
  pulled_.assign(chunks, false);
  tensor_final_.assign(layout.tensors().size(), false);
}

PullAhead::~PullAhead() {
  if (flights_.empty()) return;
  // The channel writes into the weights or the staging copy until each pull is waited.
  if (!WaitInFlight().ok() && staged()) {
    // A pull that failed may still be written by the channel until it is destroyed: leave the
    // staging copy to it rather than free memory that may be written.
    new std::vector<float>(std::move(staging_));
  }
}

void PullAhead::Reset(int64_t step) {
  DP_CHECK(flights_.empty());
  std::fill(held_.begin(), held_.end(), step - 1);
  for (int32_t c = 0; c < layout_.num_chunks(); ++c) held_version_[static_cast<size_t>(c)] = channel_->PulledVersion(c);
  std::fill(landed_.begin(), landed_.end(), false);
  std::fill(want_.begin(), want_.end(), -1);
  active_ = false;
}

void PullAhead::BeginStep(int64_t step, int64_t next_clock, bool pull_next) {
  step_ = step;
  next_clock_ = next_clock;
  pull_next_ = pull_next;
  active_ = pull_next;
  if (!pull_next) return;
  std::fill(pulled_.begin(), pulled_.end(), false);
  std::fill(tensor_final_.begin(), tensor_final_.end(), false);
  waiting_.clear();
}

Status PullAhead::Start(const std::vector<int32_t>& chunk_ids, int64_t step, int64_t clock) {
  // One pull per server (a pull request goes to one server's chunks).
  std::map<int, std::vector<int32_t>> by_server;
  for (int32_t c : chunk_ids) by_server[layout_.chunk(c).server].push_back(c);
  for (auto& [server, ids] : by_server) {
    std::sort(ids.begin(), ids.end());
    Flight f;
    f.step = step;
    f.chunks = ids;
    if (!weights16_.empty()) {
      DP_RETURN_IF_ERROR(channel_->StartPull16(clock, ids, weights16_, &f.handle));
    } else {
      DP_RETURN_IF_ERROR(channel_->StartPull(clock, ids, staged() ? std::span<float>(staging_) : weights_, &f.handle));
    }
    const uint64_t id = next_flight_++;
    for (int32_t c : ids) in_flight_[static_cast<size_t>(c)] = id;
    flights_.emplace(id, std::move(f));
  }
  return Status::Ok();
}

Status PullAhead::Land(uint64_t flight) {
  auto it = flights_.find(flight);
  DP_CHECK(it != flights_.end());
  Flight f = std::move(it->second);
  flights_.erase(it);
  for (int32_t c : f.chunks) in_flight_[static_cast<size_t>(c)] = 0;
  PullInfo info;
  DP_RETURN_IF_ERROR(channel_->WaitPull(f.handle, &info));
  for (int32_t c : f.chunks) {
    landed_[static_cast<size_t>(c)] = true;
    landed_step_[static_cast<size_t>(c)] = f.step;
    landed_version_[static_cast<size_t>(c)] = channel_->PulledVersion(c);
  }
  if (!info_set_) {
    info_ = info;
  } else {
    info_.version_min = std::min(info_.version_min, info.version_min);
    info_.version_max = std::max(info_.version_max, info.version_max);
    info_.version_sum += info.version_sum;
  }
  info_set_ = true;
  return Status::Ok();
}

void PullAhead::TakeIn(int32_t c) {
  const auto i = static_cast<size_t>(c);
  if (staged()) {
    const Chunk& chunk = layout_.chunk(c);
    std::memcpy(weights_.data() + chunk.flat_offset, staging_.data() + chunk.flat_offset,
                static_cast<size_t>(chunk.count) * sizeof(float));
  }
  held_[i] = landed_step_[i];
  held_version_[i] = landed_version_[i];
  landed_[i] = false;
}

Status PullAhead::BeforeForward(int layer) {
  const int64_t need = step_ - 1 - lag_;  // the oldest own push the weights must hold
  std::vector<int32_t> again;             // wanted pulls whose previous pull just landed
  int64_t again_step = -1, again_clock = 0;
  for (int32_t c : layer_chunks_[static_cast<size_t>(layer)]) {
    const auto i = static_cast<size_t>(c);
    for (;;) {
      if (in_flight_[i] != 0) {
        const Flight& f = flights_.at(in_flight_[i]);
        if (held_[i] < need || channel_->PullDone(f.handle)) DP_RETURN_IF_ERROR(Land(in_flight_[i]));
      }
      if (landed_[i]) {
        TakeIn(c);
        if (want_[i] >= 0) {
          // Wants all come from one step's backward, so they share a step and clock.
          again.push_back(c);
          again_step = want_[i];
          again_clock = want_clock_[i];
          want_[i] = -1;
        }
      }
      if (held_[i] >= need) break;
      // What the lag requires is not even on the wire yet (its pull was wanted): start it now.
      DP_CHECK(in_flight_[i] == 0 && !again.empty() && again.back() == c);
      again.pop_back();
      DP_RETURN_IF_ERROR(Start({c}, again_step, again_clock));
    }
  }
  if (!again.empty()) DP_RETURN_IF_ERROR(Start(again, again_step, again_clock));
  return Status::Ok();
}

void PullAhead::TensorFinal(int tensor) {
  if (pull_next_) tensor_final_[static_cast<size_t>(tensor)] = true;
}

Status PullAhead::Pushed(std::span<const int32_t> chunk_ids) {
  if (!pull_next_) return Status::Ok();
  std::vector<int32_t> check;
  check.swap(waiting_);
  check.insert(check.end(), chunk_ids.begin(), chunk_ids.end());
  std::vector<int32_t> start;
  for (int32_t c : check) {
    const auto i = static_cast<size_t>(c);
    if (pulled_[i]) continue;
    if (!tensor_final_[static_cast<size_t>(layout_.chunk(c).tensor)]) {
      waiting_.push_back(c);
      continue;
    }
    pulled_[i] = true;
    if (in_flight_[i] != 0 || landed_[i]) {
      // Its previous pull is still out: one pull per chunk, so pull again once that one landed.
      DP_CHECK(staged());
      want_[i] = step_;
      want_clock_[i] = next_clock_;
      continue;
    }
    start.push_back(c);
  }
  if (start.empty()) return Status::Ok();
  return Start(start, step_, next_clock_);
}

Status PullAhead::EndBackward() {
  if (!pull_next_) return Status::Ok();
  std::fill(tensor_final_.begin(), tensor_final_.end(), true);
  DP_RETURN_IF_ERROR(Pushed({}));
  DP_CHECK(std::all_of(pulled_.begin(), pulled_.end(), [](bool b) { return b; }));
  return Status::Ok();
}

Status PullAhead::WaitInFlight() {
  Status first;
  while (!flights_.empty()) {
    Status s = Land(flights_.begin()->first);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

bool PullAhead::TakeInfo(PullInfo* info) {
  if (!info_set_) return false;
  *info = info_;
  info_set_ = false;
  return true;
}

}  // namespace downpour::worker
