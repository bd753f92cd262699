// factor_expander.h — FactorExpander, the thread that turns a shard's sufficient-factor pushes
// into dense ones (ExpandFactorPush, server/factor_push.h) off the shard's loop. Forming δᵀ·a is
// an sgemm of tens of milliseconds per message: on the loop it held every other peer's messages
// (and an emulated link's paced replies) for that long. The loop submits the push and goes on;
// the expander hands it back expanded, or refused, and wakes the loop, which validates, logs and
// applies it as any push (docs/architecture.md "The server's parts and threads").
//
// Order: jobs finish in the order they were submitted. Bounded: at most kMaxInFlight jobs queued
// or running; Submit waits for the oldest to finish when full (the loop takes finished ones
// after every receive).
// Thread-safety: Submit, TakeDone and WaitAll from one thread (the shard's loop). The dense
// gradients come from a pool of the expander's thread (common/buffer_pool.h); their frames may
// be released on any thread. `wake` is called on the expander's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/buffer_pool.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/trace.h"
#include "common/transport.h"

namespace downpour {

// One push: in, as the shard checked its sender; out, with its factor chunks dense.
struct FactorJob {
  PeerId peer;
  PeerInfo info;
  MessageHeader header;  // out: the dense push's (or, refused, the push as it came)
  Frames frames;         // header frame first
  // The push as the wire carried it (header, frames), kept for the log when `keep_wire`.
  bool keep_wire = false;
  MessageHeader wire_header;
  Frames wire_frames;
  // Out: Ok, or the refusal and its reason; per chunk, whether it is known finite.
  Status status;
  RejectReason reason = RejectReason::kUndecodable;
  std::vector<bool> finite;
};

struct FactorExpanderOptions {
  size_t scratch_elems = 0;    // the dense gradients' pool (a shard: twice its chunks' rows)
  int threads = 1;             // compression.factor_threads: one chunk's sgemm per thread at a time
  TraceLog* trace = nullptr;   // a "factors" span per push on a track of its own; null = none
  std::string track;           // that track's name
  std::function<void()> wake;  // a job finished: the loop should come back and take it
};

class FactorExpander {
 public:
  static constexpr size_t kMaxInFlight = 2;

  FactorExpander(const ParamLayout& layout, FactorExpanderOptions options);
  ~FactorExpander();  // finishes what was submitted, then joins
  FactorExpander(const FactorExpander&) = delete;
  FactorExpander& operator=(const FactorExpander&) = delete;

  void Submit(std::unique_ptr<FactorJob> job);
  // The finished jobs, in submission order (empty when none).
  std::vector<std::unique_ptr<FactorJob>> TakeDone();
  // Returns once every submitted job has finished (they wait in TakeDone).
  void WaitAll();
  // Submitted and not yet taken back (queued, running or finished).
  size_t in_flight() const;
  // Nanoseconds spent expanding (stats factor_ns). Thread-safe.
  uint64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }

 private:
  void Run();

  const ParamLayout& layout_;
  const FactorExpanderOptions o_;
  BufferPool<float> scratch_;  // the expander thread's
  int track_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // work submitted, or stopping (the thread waits on it)
  std::condition_variable progress_;  // a job finished (Submit and WaitAll wait on it)
  std::deque<std::unique_ptr<FactorJob>> queue_;
  std::deque<std::unique_ptr<FactorJob>> done_;
  bool running_ = false;
  bool stop_ = false;
  std::atomic<uint64_t> busy_ns_{0};
  std::thread thread_;
};

}  // namespace downpour
