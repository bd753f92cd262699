// trace.h — TraceLog: one process's timeline, what its threads did and what its messages waited
// for, in Chrome's trace event format (JSON; open it in ui.perfetto.dev or chrome://tracing, or
// merge a run's files and summarise them with tools/downpour-trace). cluster.trace_events sets
// the most events a process keeps: the first ones; later ones are counted (dropped()) and not
// kept. 0 = off: every call returns at once and nothing is written (docs/operations.md
// "Timelines").
//
//   TraceLog trace("worker 0", 200000);
//   const int tid = trace.Thread("train");
//   { TraceSpan s(&trace, tid, "worker", "forward+backward"); ... }     // a span of one thread
//   trace.Async(tid, "link", "egress", 0, queued_at, sent_at, {{"bytes", 4e6}});  // id 0: a new one
//   trace.Write(run_dir + "/trace/worker-0.json");
//
// Two kinds of event:
//  * a thread's span (ph "X"): what one thread was doing from begin to end. Spans of one thread
//    nest by time (a loop's "push" holds its "factors"), as Chrome's format wants;
//  * a message's span (ph "b" / "e", an async pair keyed by an id): one message from a moment to
//    another, such as a part from its send to its reply, or a reply from its Send to the moment
//    it left the emulated link. These overlap freely.
// Each has a category and a name (string literals or other strings of static storage: only the
// pointers are kept) and at most kMaxArgs numeric args, keys likewise static.
//
// Time: "ts" is microseconds on the wall clock, so the files of one run's processes merge on one
// axis (hosts' clocks are as good as their NTP), measured with the steady clock from one
// wall-clock reading taken at construction. A kept event costs about 130 bytes of memory.
//
// Thread-safety: every method may be called from any thread (one mutex; an event is recorded
// once, at its end).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour {

struct TraceArg {
  const char* key = nullptr;  // static storage
  double value = 0;
};

class TraceLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxArgs = 4;

  // `process`: the name the timeline shows ("server 1", "worker 0"); `capacity`: the most
  // events kept, 0 = off.
  TraceLog(std::string process, size_t capacity);

  TraceLog(const TraceLog&) = delete;
  TraceLog& operator=(const TraceLog&) = delete;

  bool on() const { return capacity_ > 0; }
  // Renames the process (a worker whose id the coordinator assigned).
  void SetProcess(std::string process);
  std::string process() const;
  // A named track for one thread (or one role of a thread); returns its id for the calls below.
  int Thread(std::string name);
  // An id for a message's span, unique in this process.
  uint64_t NextId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  // A thread's span [begin, end] on track `tid`.
  void Span(int tid, const char* cat, const char* name, Clock::time_point begin, Clock::time_point end,
            std::initializer_list<TraceArg> args = {});
  // A message's span [begin, end] with id `id`, shown on track `tid` (Chrome draws async spans
  // on their own rows, grouped by category and name).
  void Async(int tid, const char* cat, const char* name, uint64_t id, Clock::time_point begin, Clock::time_point end,
             std::initializer_list<TraceArg> args = {});

  size_t size() const;       // events kept
  uint64_t dropped() const;  // events past the capacity, not kept
  // The whole timeline as one JSON object: {"traceEvents": [...], "displayTimeUnit": "ms",
  // "otherData": {"process", "pid", "events", "dropped", "capacity"}}, with the process's and
  // every track's name as metadata events.
  std::string ToJson() const;
  // ToJson() written atomically to `path`, its directory created; a no-op when off.
  Status Write(const std::string& path) const;

 private:
  struct Event {
    const char* cat;
    const char* name;
    int64_t begin_ns;  // steady-clock nanoseconds
    int64_t end_ns;
    uint64_t id;  // 0 = a thread's span
    int tid;
    uint8_t nargs;
    std::array<TraceArg, kMaxArgs> args;
  };
  friend class TraceSpan;
  void Record(int tid, const char* cat, const char* name, uint64_t id, Clock::time_point begin, Clock::time_point end,
              const TraceArg* args, size_t nargs);
  double WallMicros(int64_t steady_ns) const;

  std::string process_;  // guarded by mu_
  const size_t capacity_;
  const int pid_;
  const int64_t steady0_ns_;
  const double wall0_us_;
  std::atomic<uint64_t> next_id_{1};
  mutable std::mutex mu_;
  std::vector<Event> events_;         // guarded by mu_
  std::vector<std::string> threads_;  // guarded by mu_; index = tid
  uint64_t dropped_ = 0;              // guarded by mu_
};

// <run_dir>/trace/<name>.json: where a process of a run writes its timeline ("server-1", "worker-0").
std::string TracePath(const std::string& run_dir, const std::string& name);
// Writes `trace` (when on) to TracePath(run_dir, name) and logs one line saying where, with its
// events and how many were dropped past the capacity; a failure is logged, not returned (a
// timeline never fails the run it describes).
void WriteTraceFile(const TraceLog& trace, const std::string& run_dir, const std::string& name);

// A thread's span from construction to destruction (or End). `log` may be null or off: then
// nothing is timed.
class TraceSpan {
 public:
  TraceSpan(TraceLog* log, int tid, const char* cat, const char* name)
      : log_(log != nullptr && log->on() ? log : nullptr), tid_(tid), cat_(cat), name_(name) {
    if (log_ != nullptr) begin_ = TraceLog::Clock::now();
  }
  ~TraceSpan() { End(); }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // Sets an arg (the first kMaxArgs distinct keys are kept).
  void Arg(const char* key, double value);
  void End();

 private:
  TraceLog* log_;
  int tid_;
  const char* cat_;
  const char* name_;
  TraceLog::Clock::time_point begin_;
  std::array<TraceArg, TraceLog::kMaxArgs> args_{};
  size_t nargs_ = 0;
};

}  // namespace downpour
