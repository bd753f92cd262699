// push_window.cc — see push_window.h.
#include "client/worker/push_window.h"

namespace downpour::worker {

PushWindow::PushWindow(ParamChannel* channel, int num_chunks)
    : channel_(channel), chunk_push_(static_cast<size_t>(num_chunks), 0) {}

void PushWindow::Started(PushHandle handle, int64_t step, std::span<const int32_t> chunk_ids) {
  DP_CHECK_NE(handle, PushHandle{0});
  Push& p = pending_[handle];
  p.step = step;
  p.chunks.assign(chunk_ids.begin(), chunk_ids.end());
  // A chunk is pushed once a step, and its previous push was waited before its gradient changed.
  for (int32_t c : chunk_ids) {
    DP_CHECK_EQ(chunk_push_[static_cast<size_t>(c)], PushHandle{0});
    chunk_push_[static_cast<size_t>(c)] = handle;
  }
}

Status PushWindow::Wait(PushHandle handle, PushInfo* info) {
  auto it = pending_.find(handle);
  DP_CHECK(it != pending_.end());
  for (int32_t c : it->second.chunks) chunk_push_[static_cast<size_t>(c)] = 0;
  pending_.erase(it);
  return channel_->WaitPush(handle, info);
}

bool PushWindow::Pending(std::span<const int32_t> chunk_ids) const {
  for (int32_t c : chunk_ids)
    if (chunk_push_[static_cast<size_t>(c)] != 0) return true;
  return false;
}

Status PushWindow::WaitFor(std::span<const int32_t> chunk_ids, PushInfo* info) {
  Status first;
  for (int32_t c : chunk_ids) {
    const PushHandle h = chunk_push_[static_cast<size_t>(c)];
    if (h == 0) continue;
    Status s = Wait(h, info);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status PushWindow::WaitThrough(int64_t step, PushInfo* info) {
  Status first;
  while (!pending_.empty() && pending_.begin()->second.step <= step) {
    Status s = Wait(pending_.begin()->first, info);
    if (!s.ok() && first.ok()) first = s;
  }
  // Handles ascend in start order and steps with them, so nothing older is left.
  for (const auto& [h, p] : pending_) DP_CHECK_GT(p.step, step);
  return first;
}

Status PushWindow::WaitAll(PushInfo* info) {
  Status first;
  while (!pending_.empty()) {
    Status s = Wait(pending_.begin()->first, info);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace downpour::worker
