#include "client/ps/send_queue.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace downpour {

void SendQueue::Add(uint64_t op, Kind kind, int64_t clock, Clock::time_point admitted,
                    std::vector<std::vector<uint32_t>> parts) {
  auto [it, added] = ops_.try_emplace(op);
  if (!added) return;  // ids are unique: a second Add of one is a caller's bug, ignored
  OpState& o = it->second;
  o.kind = kind;
  o.clock = clock;
  o.admitted = admitted;
  o.parts.resize(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) o.parts[k].chunks = std::move(parts[k]);
  o.unsent = parts.size();
  unsent_ += parts.size();
  for (size_t k = 0; k < o.parts.size(); ++k) OnUnsent(op, o, k, true);
}

void SendQueue::Unsent(uint64_t op, size_t k, Clock::time_point not_before) {
  auto it = ops_.find(op);
  if (it == ops_.end() || k >= it->second.parts.size()) return;
  OpState& o = it->second;
  PartState& p = o.parts[k];
  p.not_before = not_before;
  const bool fresh = !p.unsent;
  if (fresh) {
    p.unsent = true;
    ++o.unsent;
    ++unsent_;
    o.first_unsent = std::min(o.first_unsent, k);
  }
  OnUnsent(op, o, k, fresh);
}

void SendQueue::Gone(uint64_t op, size_t k) {
  auto it = ops_.find(op);
  if (it == ops_.end() || k >= it->second.parts.size()) return;
  OpState& o = it->second;
  PartState& p = o.parts[k];
  if (!p.unsent) return;
  p.unsent = false;
  --o.unsent;
  --unsent_;
  OnGone(op, o, k);
}

void SendQueue::Remove(uint64_t op) {
  auto it = ops_.find(op);
  if (it == ops_.end()) return;
  for (size_t k = 0; k < it->second.parts.size(); ++k) Gone(op, k);
  ops_.erase(it);
}

void SendQueue::Clear() {
  ops_.clear();
  unsent_ = 0;
  OnClear();
}

std::optional<SendQueue::Pick> SendQueue::NextInCallOrder(Clock::time_point now) {
  Due(now);  // an order's own bookkeeping stays current on a same-host region's path too
  for (auto& [id, o] : ops_) {
    if (o.unsent == 0) continue;
    while (!o.parts[o.first_unsent].unsent) ++o.first_unsent;           // one is: o.unsent > 0
    if (now < o.parts[o.first_unsent].not_before) return std::nullopt;  // refused by the log: what follows waits
    return Pick{id, o.first_unsent};
  }
  return std::nullopt;
}

namespace {

class CallOrder final : public SendQueue {
 public:
  std::optional<Pick> Next(Clock::time_point now) override { return NextInCallOrder(now); }
};

// By layer. Per chunk, its unsent parts in call order: a part may go when it heads the list of
// every chunk it carries (so a chunk's own parts keep call order) and is out of its backoff;
// such parts sit in their operation's heap by first chunk. Next walks the operations (at most a
// link's active ones) for the op-level rules: a barrier waits for everything before it and
// holds everything after it; a push waits for any earlier push of a lower clock (servers count
// a worker's clock from its pushes); an operation admitted more than half reply_timeout ago goes
// first. Each event costs O(chunks of the part × log parts), not a scan of every waiting part.
class LayerOrder final : public SendQueue {
 public:
  LayerOrder(int32_t num_chunks, std::chrono::milliseconds reply_timeout)
      : waiting_(static_cast<size_t>(std::max(num_chunks, 0))), overdue_after_(reply_timeout / 2) {}

  std::optional<Pick> Next(Clock::time_point now) override {
    Due(now);
    std::optional<Pick> best;
    int64_t best_key = 0;
    bool earlier_unsent = false;
    int64_t low_push_clock = std::numeric_limits<int64_t>::max();  // of earlier pushes with unsent parts
    for (auto& [id, o] : ops_) {
      if (o.unsent == 0) continue;
      const bool barrier = o.kind == Kind::kBarrier;
      const bool held = o.kind == Kind::kPush && o.clock > low_push_clock;
      if ((!barrier || !earlier_unsent) && !held) {
        while (!o.free.empty() && !Free(id, o, o.free.top().second)) o.free.pop();  // stale entries
        if (!o.free.empty()) {
          const int64_t key =
              now - o.admitted > overdue_after_ ? std::numeric_limits<int64_t>::min() : o.free.top().first;
          if (!best || key < best_key) {  // ties: the earlier operation
            best = Pick{id, o.free.top().second};
            best_key = key;
          }
        }
      }
      earlier_unsent = true;
      if (o.kind == Kind::kPush) low_push_clock = std::min(low_push_clock, o.clock);
      if (barrier) break;
    }
    return best;
  }

 private:
  using Entry = std::pair<uint64_t, size_t>;  // (operation, part): call order

  void OnUnsent(uint64_t op, OpState& o, size_t k, bool fresh) override {
    PartState& p = o.parts[k];
    if (fresh) {
      for (uint32_t c : p.chunks) {
        if (c >= waiting_.size()) continue;  // ids are checked against the layout at Submit
        auto& w = waiting_[c];
        w.insert(std::lower_bound(w.begin(), w.end(), Entry{op, k}), Entry{op, k});
      }
    }
    p.backoff = p.not_before != Clock::time_point{};  // refused once: Next tells when it may go
    if (p.backoff) {
      backoff_.emplace(p.not_before, op, k);
    } else if (Free(op, o, k)) {
      o.free.emplace(Key(p), k);
    }
  }

  void OnGone(uint64_t op, OpState& o, size_t k) override {
    for (uint32_t c : o.parts[k].chunks) {
      if (c >= waiting_.size()) continue;
      auto& w = waiting_[c];
      auto at = std::lower_bound(w.begin(), w.end(), Entry{op, k});
      if (at == w.end() || *at != Entry{op, k}) continue;
      const bool was_head = at == w.begin();
      w.erase(at);
      if (!was_head || w.empty()) continue;
      const auto [next_op, next_k] = w.front();  // it may be free now
      auto it = ops_.find(next_op);
      if (it != ops_.end() && Free(next_op, it->second, next_k)) {
        it->second.free.emplace(Key(it->second.parts[next_k]), next_k);
      }
    }
  }

  void OnClear() override {
    for (auto& w : waiting_) w.clear();
    backoff_ = {};
  }

  // Parts whose backoff ended join their operation's heap (if free). An entry whose part ended,
  // was sent, or took a later time since (it has a newer entry) is dropped.
  void Due(Clock::time_point now) override {
    while (!backoff_.empty() && std::get<0>(backoff_.top()) <= now) {
      const auto [at, op, k] = backoff_.top();
      backoff_.pop();
      auto it = ops_.find(op);
      if (it == ops_.end() || k >= it->second.parts.size()) continue;
      PartState& p = it->second.parts[k];
      if (!p.unsent || !p.backoff || p.not_before > now) continue;
      p.backoff = false;
      if (Free(op, it->second, k)) it->second.free.emplace(Key(p), k);
    }
  }

  // Unsent, out of backoff, and first of every chunk it carries.
  bool Free(uint64_t op, const OpState& o, size_t k) const {
    const PartState& p = o.parts[k];
    if (!p.unsent || p.backoff) return false;
    for (uint32_t c : p.chunks) {
      if (c < waiting_.size() && (waiting_[c].empty() || waiting_[c].front() != Entry{op, k})) return false;
    }
    return true;
  }

  static int64_t Key(const PartState& p) { return p.chunks.empty() ? -1 : static_cast<int64_t>(p.chunks.front()); }

  std::vector<std::vector<Entry>> waiting_;  // per chunk: its unsent parts, call order
  // Parts waiting out a backoff, the earliest end on top.
  std::priority_queue<std::tuple<Clock::time_point, uint64_t, size_t>,
                      std::vector<std::tuple<Clock::time_point, uint64_t, size_t>>, std::greater<>>
      backoff_;
  const std::chrono::milliseconds overdue_after_;
};

}  // namespace

std::unique_ptr<SendQueue> SendQueue::Make(SendOrder order, int32_t num_chunks,
                                           std::chrono::milliseconds reply_timeout) {
  if (order == SendOrder::kLayer) return std::make_unique<LayerOrder>(num_chunks, reply_timeout);
  return std::make_unique<CallOrder>();
}

}  // namespace downpour
