// rate_limiter.h — LinkPacer: the emulated egress link of one process (cluster.link_gbps, for
// experiments only). Every message a process sends reserves its bytes on one virtual link; the
// pacer answers when that message would have left the link had it gone out at `gbps` behind all
// earlier reservations (a virtual finish time: finish = max(now, last finish) + bytes / rate).
// The sender then delivers the message at that time: the endpoint queues it and releases it when
// due, so neither a server's message loop nor a client's I/O loop waits (common/zmq_transport.h).
//
// A token bucket of depth `burst` link time: an idle link saves at most `burst` of credit
// (finish = max(last finish, now - burst) + bytes / rate). Without it, a lone sender whose next
// message is handed over a little after the previous one's finish time (a wake-up late by a
// scheduler tick on a busy host, a poll rounded up to its millisecond) loses that gap on every
// message and falls short of `gbps`; with the default burst the measured rate is the set one
// (bench/RESULTS.md §11.7, "Rate limiter").
// Over any span of back-to-back sends the rate is `gbps` to within one burst of link time, not a
// sum of per-message jitter. Latency, ingress limits and switch contention are not modelled
// (docs/emulated_links.md).
//
// Thread-safety: Reserve is thread-safe (one mutex); all threads of a process that share the
// pacer share the link. The clock is a parameter (ReserveAt) so tests need not sleep.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>

namespace downpour {

class LinkPacer {
 public:
  using Clock = std::chrono::steady_clock;

  static constexpr Clock::duration kDefaultBurst = std::chrono::milliseconds(5);

  // `gbps` > 0: link speed in Gbit/s (10^9 bits per second); `burst`: the most link time an idle
  // link saves up (>= 0).
  explicit LinkPacer(double gbps, Clock::duration burst = kDefaultBurst);

  double gbps() const { return gbps_; }
  // When a message of `bytes` reserved now would finish leaving the link.
  Clock::time_point Reserve(size_t bytes) { return ReserveAt(bytes, Clock::now()); }
  Clock::time_point ReserveAt(size_t bytes, Clock::time_point now);
  // How long `bytes` take on this link.
  Clock::duration Duration(size_t bytes) const;
  // When everything reserved so far will have left the link (the last finish time; in the past
  // when the link is idle).
  Clock::time_point BusyUntil();

 private:
  const double gbps_;
  const double ns_per_byte_;
  const Clock::duration burst_;
  std::mutex mu_;
  Clock::time_point last_finish_{};  // guarded by mu_
};

}  // namespace downpour
