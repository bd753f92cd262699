// sessions.cc — see sessions.h.
#include "server/sessions.h"

#include <algorithm>

namespace downpour {

bool DuplicateWindows::Seen(int32_t worker, uint64_t session, uint64_t request_id) const {
  if (session == 0 || !Known(worker)) return false;
  for (const Window& w : windows_[static_cast<size_t>(worker)]) {
    if (w.session == session) return w.ids.count(request_id) != 0;
  }
  return false;
}

void DuplicateWindows::Remember(int32_t worker, uint64_t session, uint64_t request_id) {
  if (session == 0 || !Known(worker)) return;
  auto& sessions = windows_[static_cast<size_t>(worker)];
  auto it = std::find_if(sessions.begin(), sessions.end(), [&](const Window& w) { return w.session == session; });
  if (it == sessions.end()) {
    if (sessions.size() >= static_cast<size_t>(kSessions)) sessions.pop_front();  // the oldest session
    sessions.push_back(Window{session, {}, {}});
    it = sessions.end() - 1;
  }
  if (!it->ids.insert(request_id).second) return;
  it->order.push_back(request_id);
  if (it->order.size() > static_cast<size_t>(kIdsPerSession)) {
    it->ids.erase(it->order.front());
    it->order.pop_front();
  }
}

std::vector<std::vector<ShardCheckpoint::Session>> DuplicateWindows::Export() const {
  std::vector<std::vector<ShardCheckpoint::Session>> out(windows_.size());
  for (size_t w = 0; w < windows_.size(); ++w) {
    for (const Window& sw : windows_[w]) {
      out[w].push_back({sw.session, std::vector<uint64_t>(sw.order.begin(), sw.order.end())});
    }
  }
  return out;
}

void DuplicateWindows::Import(const std::vector<std::vector<ShardCheckpoint::Session>>& windows) {
  std::vector<std::deque<Window>> in(windows_.size());
  for (size_t w = 0; w < windows.size() && w < in.size(); ++w) {
    for (const ShardCheckpoint::Session& s : windows[w]) {
      Window sw;
      sw.session = s.session;
      sw.order.assign(s.ids.begin(), s.ids.end());
      sw.ids.insert(s.ids.begin(), s.ids.end());
      in[w].push_back(std::move(sw));
    }
  }
  windows_ = std::move(in);
}

void SessionFence::Registered(int32_t worker, uint64_t session, Clock::time_point now) {
  if (session == 0 || !Known(worker)) return;
  auto& seen = seen_[static_cast<size_t>(worker)];
  auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& x) { return x.session == session; });
  if (it != seen.end()) seen.erase(it);
  seen.push_back(Seen{session, now});
  if (seen.size() > static_cast<size_t>(DuplicateWindows::kSessions)) seen.pop_front();
}

std::vector<uint64_t> SessionFence::Fence(int32_t worker, Clock::time_point cutoff) {
  std::vector<uint64_t> fenced;
  if (!Known(worker)) return fenced;
  auto& seen = seen_[static_cast<size_t>(worker)];
  auto& removed = removed_[static_cast<size_t>(worker)];
  for (auto it = seen.begin(); it != seen.end();) {
    if (it->registered > cutoff) {
      ++it;
      continue;
    }
    removed.push_back(it->session);
    if (removed.size() > static_cast<size_t>(DuplicateWindows::kSessions)) removed.pop_front();
    fenced.push_back(it->session);
    it = seen.erase(it);
  }
  return fenced;
}

bool SessionFence::Removed(int32_t worker, uint64_t session) const {
  if (session == 0 || !Known(worker)) return false;
  const auto& removed = removed_[static_cast<size_t>(worker)];
  return std::find(removed.begin(), removed.end(), session) != removed.end();
}

uint64_t PullStepOrder::Key(int32_t worker, int64_t clock, uint64_t arrived) {
  if (worker < 0 || static_cast<size_t>(worker) >= steps_.size()) return UINT64_MAX;
  Step& s = steps_[static_cast<size_t>(worker)];
  if (s.clock != clock) s = Step{clock, arrived};
  return s.first;
}

}  // namespace downpour
