// ps_channel.h — the ParamChannel of a distributed worker: client/ps's PsClient underneath.
//
// Pull: one PsClient::Pull of every chunk (all servers in parallel), waited up to
// `wait_timeout` (sync/ssp servers hold a pull until its clock is servable, and a restarting
// server is waited for up to the client's server_wait, so this is generous: the client's own
// error, naming the server, should come first). StartPull: PsClient::PullChunks of the given
// chunks, waited by WaitPull (same timeout). Versions come from PsClient::last_versions(), read
// only for the chunks of the pull just completed (other pulls may be in flight).
// Push: PsClient::PushChunks per planner group, zero-copy from the caller's buffer; WaitPush
// waits for one (its chunks' floats are then free again), WaitPushes for every one not waited.
// Staleness is measured by the servers (they know the version a gradient meets); the channel
// reports it as unknown and the worker reads the servers' stats at the end.
//
// Completion times: a watcher thread polls the requests in flight, records when each completed
// and wakes the training thread waiting for it. So a WaitPull for a layer's chunks returns as
// soon as those chunks arrived, whatever is still in flight before it, and each request's wire
// span (issue → completion) is known (TakeWireSpans, the step-time breakdown's comm_ms). A
// server answers a link's requests in order, so each round polls only the oldest pending pull
// and the oldest pending push of every server (waiting up to 1 ms on the first of them), and
// every 10th round all of them: completions are seen within about 1 ms (10 ms for one that
// overtook an older request of its server), at a few polls per millisecond.
//
// Ownership: borrows the PsClient (must outlive the channel). Thread-safety: the ParamChannel
// methods are called from one training thread; the watcher is internal (mu_ guards what it
// shares with that thread) and is joined by the destructor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "client/ps/ps_client.h"
#include "client/worker/param_channel.h"

namespace downpour::worker {

class PsChannel : public ParamChannel {
 public:
  // `on_clock(clock)` / `on_leave()` forward clocks and the departure to the coordinator
  // (may be empty when there is none, e.g. in tests with bare servers).
  PsChannel(PsClient* client, std::chrono::milliseconds wait_timeout, std::function<Status(int64_t)> on_clock = {},
            std::function<Status()> on_leave = {});
  ~PsChannel() override;
  PsChannel(const PsChannel&) = delete;
  PsChannel& operator=(const PsChannel&) = delete;

  Status Pull(int64_t clock, std::span<float> weights, PullInfo* info) override;
  Status StartPull(int64_t clock, std::span<const int32_t> chunk_ids, std::span<float> weights,
                   PullHandle* handle) override;
  Status Pull16(int64_t clock, std::span<uint16_t> weights, PullInfo* info) override;
  Status StartPull16(int64_t clock, std::span<const int32_t> chunk_ids, std::span<uint16_t> weights,
                     PullHandle* handle) override;
  bool pulls16() const override { return client_->pull_dtype() != DType::kF32; }
  Status WaitPull(PullHandle handle, PullInfo* info) override;
  bool PullDone(PullHandle handle) override;
  Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads,
                   PushHandle* handle) override;
  Status WaitPush(PushHandle handle, PushInfo* info) override;
  Status SetPushFactors(std::span<const PushFactor> factors) override;
  void SetPushVersions(std::span<const int64_t> versions) override { push_versions_ = versions; }
  Status SetPushCast(std::span<const uint16_t> cast) override {
    push_cast_ = cast;
    return Status::Ok();
  }
  int64_t PulledVersion(int32_t chunk) const override;
  Status WaitPushes(PushInfo* info) override;
  Status PushElastic(int64_t clock, std::span<const float> diff, PushInfo* info) override;
  Status Clock(int64_t clock) override;
  Status Leave() override;
  std::vector<WireSpan> TakeWireSpans() override;

 private:
  Status AwaitAll(RequestId id, double t0, PullInfo* info);
  uint64_t TrackChunks(RequestId id, std::span<const int32_t> chunk_ids, double t0);
  struct Request {
    RequestId id = 0;
    int server = -1;              // the one server it goes to; -1 = all (a whole pull)
    bool push = false;
    std::vector<int32_t> chunks;  // a pull's chunks (for their versions); empty for pushes
    double issued_s = 0;
    double done_s = 0;
    bool done = false;
    Status status;                // the PsClient's answer, once done
    std::vector<int64_t> staleness;  // a push's: per applied chunk, from the acks
  };
  std::vector<FactorTensor> factors_;  // SetPushFactors: for the pushes started next
  std::span<const int64_t> push_versions_;  // SetPushVersions: borrowed
  std::span<const uint16_t> push_cast_;     // SetPushCast: borrowed
  // Registers a request just issued with the watcher; returns its handle.
  uint64_t Track(RequestId id, int server, bool push, std::vector<int32_t> chunks, double issued_s);
  // Blocks until request `handle` is done (up to wait_timeout_), then forgets it and records its
  // wire span; `chunks` gets a pull's chunk ids.
  Status Await(uint64_t handle, std::vector<int32_t>* chunks, std::vector<int64_t>* staleness = nullptr);
  void FillVersions(const std::vector<int32_t>& chunks, PullInfo* info) const;
  // Await for a push; adds its acks' staleness to `info`.
  Status AwaitPush(uint64_t handle, PushInfo* info);
  void WatchLoop();

  PsClient* client_;
  std::chrono::milliseconds wait_timeout_;
  std::function<Status(int64_t)> on_clock_;
  std::function<Status()> on_leave_;
  std::vector<uint64_t> pending_pushes_;  // training thread only: started, not waited
  std::vector<WireSpan> spans_;           // training thread only

  std::mutex mu_;
  std::condition_variable cv_;            // a request registered, done, or stop
  std::map<uint64_t, Request> requests_;  // guarded by mu_
  int watching_ = 0;                      // guarded by mu_: requests not done yet
  uint64_t next_handle_ = 1;              // guarded by mu_
  bool stop_ = false;                     // guarded by mu_
  std::thread watcher_;                   // last: starts after everything it reads
};

}  // namespace downpour::worker
