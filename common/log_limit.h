// log_limit.h — a logger with a bounded rate, for lines a stranger can provoke (refused
// messages): at most `max_lines` lines per `window`; what is held back is counted and reported
// as one "<prefix>: N more <what> suppressed in the last S s" line when the window ends (at the
// next Log or Flush after it). So a flood of bad messages costs a few lines per window, not a
// full disk, and the count of what was not logged is never lost.
//
// The clock is a parameter (LogAt / FlushAt) so tests need not sleep; Log / Flush use
// steady_clock::now(). Lines go to `sink` (default: spdlog at warn level).
//
// Thread-safety: all methods are thread-safe (one internal mutex; the sink runs under it).
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace downpour {

class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Sink = std::function<void(const std::string& line)>;

  // `prefix` starts the suppression line ("shard 0"), `what` names the lines ("refusals").
  RateLimitedLog(std::string prefix, std::string what, int max_lines = 10,
                 std::chrono::milliseconds window = std::chrono::seconds(10), Sink sink = {})
      : prefix_(std::move(prefix)),
        what_(std::move(what)),
        max_lines_(max_lines),
        window_(window),
        sink_(sink ? std::move(sink) : Sink([](const std::string& line) { spdlog::warn("{}", line); })) {}

  // Logs `line` unless this window's budget is spent; returns whether it was logged.
  bool Log(const std::string& line) { return LogAt(Clock::now(), line); }
  bool LogAt(Clock::time_point now, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    RollLocked(now);
    if (lines_ < max_lines_) {
      ++lines_;
      sink_(line);
      return true;
    }
    ++suppressed_;
    ++suppressed_total_;
    return false;
  }

  // Reports the suppressed count once the window is over (call it from a poll loop, so the
  // count appears even when the flood has stopped).
  void Flush() { FlushAt(Clock::now()); }
  void FlushAt(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    RollLocked(now);
  }

  // Reports what the current window held back now, window over or not: for the end of a loop,
  // so a process that stops within a window still says how many lines it dropped.
  void FlushFinal() { FlushFinalAt(Clock::now()); }
  void FlushFinalAt(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = false;  // RollLocked reports and resets regardless of the window
    RollLocked(now);
  }

  // Lines held back since construction.
  uint64_t suppressed_total() const {
    std::lock_guard<std::mutex> lock(mu_);
    return suppressed_total_;
  }

 private:
  // Starts a new window when the current one is over, first reporting what it held back.
  void RollLocked(Clock::time_point now) {
    if (started_ && now - window_start_ < window_) return;
    if (suppressed_ > 0) {
      sink_(fmt::format("{}: {} more {} suppressed in the last {:.0f} s", prefix_, suppressed_, what_,
                        std::chrono::duration<double>(now - window_start_).count()));
    }
    started_ = true;
    window_start_ = now;
    lines_ = 0;
    suppressed_ = 0;
  }

  const std::string prefix_;
  const std::string what_;
  const int max_lines_;
  const std::chrono::milliseconds window_;
  const Sink sink_;
  mutable std::mutex mu_;  // guards everything below
  bool started_ = false;
  Clock::time_point window_start_;
  int lines_ = 0;            // logged in this window
  uint64_t suppressed_ = 0;  // held back in this window
  uint64_t suppressed_total_ = 0;
};

}  // namespace downpour
