// Which of a link's unsent message parts goes next (cluster.send_order). The link's I/O thread
// tells the queue what it admitted, sent, must send again and finished; the queue answers Next.
// It owns no bytes and sends nothing: the link sends the part Next names, or stops for the round.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include "common/config/cluster.h"

namespace downpour {

class SendQueue {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Kind {
    kPush,     // a gradient push: counts towards the worker's clock on the server
    kPull,     //
    kBarrier,  // a control request, a register, an init or move push: nothing overtakes it
  };
  struct Pick {
    uint64_t op = 0;
    size_t part = 0;
  };

  // `num_chunks`: the layout's (chunk ids passed to Add are below it). `reply_timeout`: an
  // operation admitted longer than half of it ago goes first (by layer), so none times out unsent.
  static std::unique_ptr<SendQueue> Make(SendOrder order, int32_t num_chunks, std::chrono::milliseconds reply_timeout);
  virtual ~SendQueue() = default;

  // An operation the link took, every part unsent; ids rise in call order. parts[k]: the chunk
  // ids of part k (none for a control request).
  void Add(uint64_t op, Kind kind, int64_t clock, Clock::time_point admitted, std::vector<std::vector<uint32_t>> parts);
  // Part `k` of `op` is to be sent (again), not before `not_before` (a backoff after the
  // server's log refused it). A part already unsent only takes the new time.
  void Unsent(uint64_t op, size_t k, Clock::time_point not_before = {});
  // Part `k` of `op` went on the wire or was answered: not to send. No effect if it was not unsent.
  void Gone(uint64_t op, size_t k);
  // The operation ended (answered, failed or timed out); an unknown id is ignored.
  void Remove(uint64_t op);
  void Clear();

  // The part to send next, if one may go at `now`: Next again after sending it (Gone), or stop
  // for the round when it cannot go (a full window). By this queue's order.
  virtual std::optional<Pick> Next(Clock::time_point now) = 0;
  // The same in call order whatever the queue's own (a same-host region keeps call order,
  // shm_path.h): the first unsent part of the first operation that has one, none while that part
  // waits out a backoff (what follows it waits too).
  std::optional<Pick> NextInCallOrder(Clock::time_point now);

  size_t unsent() const { return unsent_; }

 protected:
  struct PartState {
    std::vector<uint32_t> chunks;
    bool unsent = true;
    Clock::time_point not_before{};
    bool backoff = false;  // by layer: outside the free heap until a Next at or after not_before
  };
  struct OpState {
    Kind kind = Kind::kPull;
    int64_t clock = 0;
    Clock::time_point admitted{};
    std::vector<PartState> parts;
    size_t unsent = 0;
    size_t first_unsent = 0;  // every part before it is not unsent
    // By layer: parts that were free (first unsent of each of their chunks, out of backoff) when
    // pushed, lowest (first chunk, part) on top; checked again when popped.
    std::priority_queue<std::pair<int64_t, size_t>, std::vector<std::pair<int64_t, size_t>>, std::greater<>> free;
  };

  // What an order keeps beside the common state, told after the change; Due before every pick.
  // `fresh`: it was not unsent before (else only its time changed).
  virtual void OnUnsent(uint64_t /*op*/, OpState& /*o*/, size_t /*k*/, bool /*fresh*/) {}
  virtual void OnGone(uint64_t /*op*/, OpState& /*o*/, size_t /*k*/) {}
  virtual void OnClear() {}
  virtual void Due(Clock::time_point /*now*/) {}

  std::map<uint64_t, OpState> ops_;  // by id: call order
  size_t unsent_ = 0;
};

}  // namespace downpour
