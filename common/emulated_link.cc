#include "common/emulated_link.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/log_limit.h"
#include "common/trace.h"

namespace downpour {
namespace {

using Clock = std::chrono::steady_clock;

// The link, its options and the timeline, as the endpoints of one decorator share them.
struct Link {
  const EmulatedLinkOptions& options;
  LinkPacer& pacer;

  // When a message of `bytes` may go: its virtual finish time on the link, or now for a small
  // message (charged all the same).
  Clock::time_point Due(size_t bytes) const {
    const auto now = Clock::now();
    const auto finish = pacer.ReserveAt(bytes, now);
    return bytes < options.pace_min_bytes ? now : finish;
  }
  int Track(const std::string& name) const {
    return options.trace != nullptr && options.trace->on() ? options.trace->Thread(name) : -1;
  }
  // The timeline's span of a message that waited from `queued` (its Send) to now, due at `due`.
  void Egress(int track, size_t bytes, Clock::time_point queued, Clock::time_point due) const {
    if (track < 0) return;
    const auto now = Clock::now();
    const auto ms = [](Clock::duration d) { return std::max(0.0, std::chrono::duration<double, std::milli>(d).count()); };
    options.trace->Async(track, "link", "egress", 0, queued, now,
                         {{"bytes", static_cast<double>(bytes)},
                          {"link_ms", ms(due - queued)},
                          {"late_ms", ms(now - std::max(due, queued))}});
  }
};

class PacedServer : public ServerEndpoint {
 public:
  PacedServer(std::unique_ptr<ServerEndpoint> inner, Link link)
      : inner_(std::move(inner)),
        link_(link),
        ordered_(link.options.order_by_key),
        drop_log_("link '" + inner_->address() + "'", "dropped-peer lines"),
        track_(link_.Track("egress of " + inner_->address())) {}

  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    const auto deadline = Clock::now() + timeout;
    const uint64_t woken_before = wakes_.load();
    while (true) {
      Flush();
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
      const auto wait = std::min(left, NextDue());
      Status s = inner_->Receive(from, frames, wait, info);
      if (s.code() == StatusCode::kTimeout && wait < left && wakes_.load() == woken_before) continue;
      if (s.code() == StatusCode::kTimeout) drop_log_.Flush();
      return s;
    }
  }
  Status Send(const PeerId& to, Frames frames) override { return SendOrdered(to, std::move(frames), kNoOrder); }
  Status SendOrdered(const PeerId& to, Frames frames, uint64_t order) override {
    if (dropped_.Contains(to)) {
      return Unavailable("link '{}': peer {} was dropped (it did not read its replies)", address(), PeerHex(to));
    }
    const size_t bytes = MessageBytes(frames);
    auto q = queues_.find(to);
    // Ordered by key: a large reply, or any behind a queued one, waits for its place (Schedule).
    if (ordered_ && (bytes >= link_.options.pace_min_bytes || q != queues_.end())) {
      return Enqueue(to, q, std::move(frames), bytes, order, /*scheduled=*/false, Clock::time_point{});
    }
    const auto due = link_.Due(bytes);
    if (q == queues_.end() && due <= Clock::now()) return inner_->SendOrdered(to, std::move(frames), order);
    return Enqueue(to, q, std::move(frames), bytes, order, /*scheduled=*/true, due);
  }
  void ReleaseDue() override {
    if (!queues_.empty()) Flush();
    inner_->ReleaseDue();
  }
  void Wake() override {
    wakes_.fetch_add(1);
    inner_->Wake();
  }
  uint64_t dropped_peers() const override {
    return inner_->dropped_peers() + dropped_.count();
  }
  std::string address() const override { return inner_->address(); }

 private:
  static constexpr uint64_t kNoOrder = UINT64_MAX;  // Send: the peer's last order (see Enqueue)
  struct Queued {
    Frames frames;
    Clock::time_point due;     // not before; unset while not scheduled
    Clock::time_point queued;  // its Send (the timeline's egress span)
    size_t bytes = 0;
    uint64_t order = 0;     // its order key (handed on to the inner endpoint)
    bool scheduled = true;  // has its place on the link (false: waits for Schedule)
  };
  struct PeerQueue {
    std::deque<Queued> messages;  // the scheduled ones first, then `unscheduled` waiting ones
    size_t bytes = 0;
    size_t unscheduled = 0;
    uint64_t last_order = 0;
  };
  using Queues = std::unordered_map<PeerId, PeerQueue>;

  // Queues a reply behind the peer's earlier ones. Its order is at least the peer's previous
  // one, so a peer's replies keep their order; Send's (kNoOrder) is exactly the previous one (an
  // ack rides with the replies before it), or its arrival for a first reply.
  Status Enqueue(const PeerId& to, Queues::iterator q, Frames frames, size_t bytes, uint64_t order, bool scheduled,
                 Clock::time_point due) {
    const auto now = Clock::now();
    if (q == queues_.end()) q = queues_.emplace(to, PeerQueue{}).first;
    if (q->second.bytes + bytes > link_.options.peer_queue_bytes) {
      Drop(q, bytes);
      return Unavailable("link '{}': peer {} dropped: its unsent replies exceed {} bytes", address(), PeerHex(to),
                         link_.options.peer_queue_bytes);
    }
    PeerQueue& pq = q->second;
    if (order == kNoOrder) {
      order = pq.messages.empty() ? static_cast<uint64_t>(now.time_since_epoch().count()) : pq.last_order;
    }
    pq.last_order = std::max(pq.last_order, order);
    pq.bytes += bytes;
    pq.messages.push_back(Queued{std::move(frames), due, now, bytes, pq.last_order, scheduled});
    if (!scheduled) {
      ++pq.unscheduled;
      Flush();
    }
    return Status::Ok();
  }

  // Ordered by key: gives waiting replies their place on the link, lowest order first (ties:
  // sent first), while the link has less than kOrderAhead reserved.
  void Schedule() {
    while (true) {
      const auto now = Clock::now();
      if (link_.pacer.BusyUntil() > now + EmulatedLinkTransport::kOrderAhead) return;
      Queued* best = nullptr;
      PeerQueue* best_queue = nullptr;
      for (auto& [peer, q] : queues_) {
        if (q.unscheduled == 0) continue;
        Queued& m = q.messages[q.messages.size() - q.unscheduled];
        if (best == nullptr || m.order < best->order || (m.order == best->order && m.queued < best->queued)) {
          best = &m;
          best_queue = &q;
        }
      }
      if (best == nullptr) return;
      best->due = link_.Due(best->bytes);
      best->scheduled = true;
      --best_queue->unscheduled;
    }
  }

  // Hands every due reply to the inner endpoint, oldest first per peer (ordered by key: first
  // gives waiting replies their place, and again after, as the link may have moved on).
  void Flush() {
    if (ordered_) Schedule();
    HandOnDue();
    if (ordered_) {
      Schedule();
      HandOnDue();
    }
  }
  void HandOnDue() {
    const auto now = Clock::now();
    for (auto it = queues_.begin(); it != queues_.end();) {
      PeerQueue& q = it->second;
      while (!q.messages.empty() && q.messages.front().scheduled && q.messages.front().due <= now) {
        Queued& m = q.messages.front();
        link_.Egress(track_, m.bytes, m.queued, m.due);
        q.bytes -= m.bytes;
        const Status s = inner_->SendOrdered(it->first, std::move(m.frames), m.order);
        q.messages.pop_front();
        if (!s.ok()) {  // the peer went away, or the inner endpoint dropped it: nobody to deliver to
          q.messages.clear();
          q.unscheduled = 0;
          q.bytes = 0;
        }
      }
      it = q.messages.empty() ? queues_.erase(it) : std::next(it);
    }
  }

  // How long Receive may wait before a queued reply falls due (rounded up to the millisecond),
  // or a waiting one should get its place; as long as it likes when nothing waits.
  std::chrono::milliseconds NextDue() const {
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    bool waiting = false;
    for (const auto& [peer, q] : queues_) {
      if (q.messages.empty()) continue;
      waiting = waiting || q.unscheduled > 0;
      if (!q.messages.front().scheduled) continue;
      if (q.messages.front().due <= now) return std::chrono::milliseconds(0);
      next = std::min(next, q.messages.front().due);
    }
    if (waiting) next = std::min(next, std::max(now, link_.pacer.BusyUntil() - EmulatedLinkTransport::kOrderAhead));
    if (next == Clock::time_point::max()) return std::chrono::milliseconds::max();
    return std::chrono::ceil<std::chrono::milliseconds>(next - now);
  }

  void Drop(Queues::iterator q, size_t more_bytes) {
    const std::string line = dropped_.Drop(q->first, fmt::format("link '{}'", address()), q->second.messages.size(),
                                           q->second.bytes, more_bytes, link_.options.peer_queue_bytes);
    queues_.erase(q);  // frees the frames, so their keepalives
    drop_log_.Log(line);
  }

  std::unique_ptr<ServerEndpoint> inner_;
  Link link_;
  const bool ordered_;
  Queues queues_;  // only peers with replies waiting for the link
  DroppedPeers dropped_;
  RateLimitedLog drop_log_;
  const int track_;  // -1 = no timeline
  std::atomic<uint64_t> wakes_{0};  // Wake() calls, so a wake ends Receive's own short waits
};

class PacedClient : public ClientEndpoint {
 public:
  PacedClient(std::unique_ptr<ClientEndpoint> inner, Link link, std::string address)
      : inner_(std::move(inner)), link_(link), track_(link_.Track("egress to " + address)) {}
  // Queued messages still due within the linger leave; the rest are dropped, as ZeroMQ drops what
  // a closed socket has not sent by then.
  ~PacedClient() override {
    const auto until = Clock::now() + std::chrono::milliseconds(link_.options.linger_ms);
    while (!queue_.empty() && queue_.front().due <= until) {
      std::this_thread::sleep_until(queue_.front().due);
      if (!SendHead().ok()) break;
    }
  }
  Status Send(Frames frames) override {
    DP_RETURN_IF_ERROR(Flush());
    const size_t bytes = MessageBytes(frames);
    const auto due = link_.Due(bytes);
    if (queue_.empty() && due <= Clock::now()) return inner_->Send(std::move(frames));
    queue_.push_back(Queued{std::move(frames), due, bytes, Clock::now()});
    queued_bytes_ += bytes;
    while (queued_bytes_ > link_.options.client_queue_bytes) {
      std::this_thread::sleep_until(queue_.front().due);
      DP_RETURN_IF_ERROR(SendHead());
    }
    return Status::Ok();
  }
  // Releases queued messages as they fall due while it waits (waking at the next due time).
  Status Receive(Frames* frames, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      DP_RETURN_IF_ERROR(Flush());
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
      auto wait = left;
      if (!queue_.empty()) wait = std::min(left, std::chrono::ceil<std::chrono::milliseconds>(queue_.front().due - Clock::now()));
      if (wait.count() < 0) wait = std::chrono::milliseconds(0);
      Status s = inner_->Receive(frames, wait);
      if (s.code() == StatusCode::kTimeout && wait < left) continue;
      return s;
    }
  }

 private:
  struct Queued {
    Frames frames;
    Clock::time_point due;  // its finish time on the link
    size_t bytes = 0;
    Clock::time_point queued;  // its Send (the timeline's egress span)
  };
  Status Flush() {
    const auto now = Clock::now();
    while (!queue_.empty() && queue_.front().due <= now) DP_RETURN_IF_ERROR(SendHead());
    return Status::Ok();
  }
  // Sends the oldest queued message; it leaves the queue whether or not the inner endpoint took
  // it (an error is the caller's, as an unqueued Send's would be).
  Status SendHead() {
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= q.bytes;
    link_.Egress(track_, q.bytes, q.queued, q.due);
    return inner_->Send(std::move(q.frames));
  }

  std::unique_ptr<ClientEndpoint> inner_;
  Link link_;
  std::deque<Queued> queue_;  // messages not due yet, oldest first
  size_t queued_bytes_ = 0;
  const int track_;  // -1 = no timeline
};

}  // namespace

EmulatedLinkTransport::EmulatedLinkTransport(Transport* inner, EmulatedLinkOptions options)
    : inner_(inner), options_(std::move(options)), pacer_(options_.gbps) {}

EmulatedLinkTransport::~EmulatedLinkTransport() = default;

Status EmulatedLinkTransport::Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) {
  std::unique_ptr<ServerEndpoint> inner;
  DP_RETURN_IF_ERROR(inner_->Bind(address, &inner));
  *out = std::make_unique<PacedServer>(std::move(inner), Link{options_, pacer_});
  return Status::Ok();
}

Status EmulatedLinkTransport::Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) {
  std::unique_ptr<ClientEndpoint> inner;
  DP_RETURN_IF_ERROR(inner_->Connect(address, &inner));
  *out = std::make_unique<PacedClient>(std::move(inner), Link{options_, pacer_}, address);
  return Status::Ok();
}

}  // namespace downpour
