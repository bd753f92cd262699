// delivery.h — the parts of a link's reliable delivery that hold state of their own, kept apart
// from the I/O loop that uses them (ps_client.cc LinkRunner):
//   ByteWindow       flow control: payload bytes on the wire one way, bounded by max_inflight_bytes;
//   IncarnationTracker  which server process answers, so that a restart is told from a late reply
//                    of a process already replaced;
//   LogRefusals      the backoff of a message the server's write-ahead log refused.
// Resends themselves (which parts go again after a restart) stay in the loop, which owns the parts.
//
// Thread-safety: each object belongs to one link's I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

namespace downpour {

// Payload bytes sent (push) or asked for (pull) and not answered yet. A part that does not fit
// waits for answers; one larger than the whole window goes when the wire is empty, alone.
class ByteWindow {
 public:
  explicit ByteWindow(uint64_t limit) : limit_(limit) {}
  bool Fits(uint64_t bytes) const { return inflight_ == 0 || inflight_ + bytes <= limit_; }
  void Add(uint64_t bytes) { inflight_ += bytes; }
  void Remove(uint64_t bytes) { inflight_ -= bytes < inflight_ ? bytes : inflight_; }
  void Clear() { inflight_ = 0; }
  uint64_t inflight() const { return inflight_; }

 private:
  uint64_t limit_;
  uint64_t inflight_ = 0;
};

// The server process a link talks to, by the incarnation its replies carry (a random number each
// server process draws at start; 0 = a reply that carries none).
class IncarnationTracker {
 public:
  // Records a reply's incarnation; true if it names a new process (a restart). The first one
  // heard is not a restart, nor is a late reply of one of the last kRemembered processes.
  bool Observe(uint64_t incarnation);
  // The link moved to another address: whoever answers there first is its server.
  void Forget() { current_ = 0; }
  uint64_t current() const { return current_; }

  static constexpr size_t kRemembered = 4;

 private:
  uint64_t current_ = 0;
  std::deque<uint64_t> past_;
};

// Refusals of one message by the server's write-ahead log (RejectReason::kLogWrite): nothing of
// it was applied, so it is sent again, 50 ms after the first refusal and doubling up to `cap`,
// until it has been refused for `give_up`.
struct LogRefusals {
  using Clock = std::chrono::steady_clock;
  int count = 0;
  Clock::time_point since;       // the first refusal
  Clock::time_point not_before;  // when it may be sent again

  // Counts a refusal at `now` and sets not_before; false once it has been refused for give_up
  // (the message then fails).
  bool Refuse(Clock::time_point now, Clock::duration cap, Clock::duration give_up);
  Clock::duration refused_for(Clock::time_point now) const { return now - since; }
};

}  // namespace downpour
