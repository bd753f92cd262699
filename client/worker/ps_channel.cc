// ps_channel.cc — see ps_channel.h.
#include "client/worker/ps_channel.h"

#include <algorithm>
#include <limits>

namespace downpour::worker {

PsChannel::PsChannel(PsClient* client, std::chrono::milliseconds wait_timeout, std::function<Status(int64_t)> on_clock,
                     std::function<Status()> on_leave)
    : client_(client), wait_timeout_(wait_timeout), on_clock_(std::move(on_clock)), on_leave_(std::move(on_leave)) {}

Status PsChannel::Pull(int64_t clock, std::span<float> weights, PullInfo* info) {
  const RequestId id = client_->Pull(weights, clock);
  DP_RETURN_IF_ERROR(client_->Wait(id, wait_timeout_));
  *info = PullInfo{};
  info->version_min = std::numeric_limits<int64_t>::max();
  for (int64_t v : client_->last_versions()) {
    info->version_min = std::min(info->version_min, v);
    info->version_max = std::max(info->version_max, v);
    info->version_sum += v;
  }
  if (client_->last_versions().empty()) info->version_min = 0;
  return Status::Ok();
}

Status PsChannel::StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads) {
  pending_pushes_.push_back(client_->PushChunks(grads, group.chunk_ids, clock));
  return Status::Ok();
}

Status PsChannel::WaitPushes(PushInfo* info) {
  Status first;
  for (RequestId id : pending_pushes_) {
    Status s = client_->Wait(id, wait_timeout_);
    if (!s.ok() && first.ok()) first = s;
  }
  pending_pushes_.clear();
  info->staleness_known = false;
  return first;
}

Status PsChannel::Clock(int64_t clock) { return on_clock_ ? on_clock_(clock) : Status::Ok(); }

Status PsChannel::Leave() { return on_leave_ ? on_leave_() : Status::Ok(); }

}  // namespace downpour::worker
