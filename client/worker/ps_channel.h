// ps_channel.h — the ParamChannel of a distributed worker: client/ps's PsClient underneath.
//
// Pull: one PsClient::Pull of every chunk (all servers in parallel), waited up to
// `wait_timeout` (sync/ssp servers hold a pull until its clock is servable, and a restarting
// server is waited for up to the client's server_wait, so this is generous: the client's own
// error, naming the server, should come first). Versions come from PsClient::last_versions().
// Push: PsClient::PushChunks per planner group, zero-copy from the caller's buffer; the ids
// are kept and WaitPushes() waits for all of them (after which the buffer is free again).
// Staleness is measured by the servers (they know the version a gradient meets); the channel
// reports it as unknown and the worker reads the servers' stats at the end.
//
// Ownership: borrows the PsClient (must outlive the channel). Thread-safety: one thread.
#pragma once

#include <chrono>
#include <functional>
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

  Status Pull(int64_t clock, std::span<float> weights, PullInfo* info) override;
  Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads) override;
  Status WaitPushes(PushInfo* info) override;
  Status Clock(int64_t clock) override;
  Status Leave() override;

 private:
  PsClient* client_;
  std::chrono::milliseconds wait_timeout_;
  std::function<Status(int64_t)> on_clock_;
  std::function<Status()> on_leave_;
  std::vector<RequestId> pending_pushes_;
};

}  // namespace downpour::worker
