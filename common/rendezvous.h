// rendezvous.h — a process's link to the coordinator (server/coordinator.h): register (role,
// layout hash, own address, the run's token) to get an id and the server list, then heartbeat
// on a thread of its own, hearing about dead workers and shutdown. Used by shard servers and by workers, so it
// lives in common/ (server and client never include each other).
//
// Thread-safety: after Register(), the heartbeat thread owns the endpoint; the accessors and
// set_clock() are thread-safe. Destroying the object stops the thread. The Transport must
// outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/codec.h"
#include "common/transport.h"

namespace downpour {

struct RendezvousOptions {
  std::string coordinator;          // "host:port" or a full transport address ("tcp://...")
  Role role = Role::kWorker;
  int32_t requested_id = -1;        // servers: their --id; workers: -1 = coordinator assigns
  uint64_t layout_hash = 0;
  uint32_t model_id = 0;
  std::string address;              // servers: the address workers connect to
  std::chrono::milliseconds heartbeat_interval{500};
  // The run's secret (runs without keys), sent with register and RequestShutdown so the
  // coordinator can tell this process from a stranger (server/access.h). "" = none.
  std::string token;
};

struct RendezvousInfo {
  int32_t id = -1;                          // this process's id for its role
  std::vector<std::string> server_addresses;  // index = server id
  int32_t workers = 0;                      // W of the run
};

class RendezvousClient {
 public:
  // Connects and registers; waits (up to `timeout`) until the coordinator answers, which for a
  // worker is when every server has registered. A layout hash mismatch is kFailedPrecondition
  // with both hashes in the message.
  static Status Register(Transport* transport, RendezvousOptions options, std::chrono::milliseconds timeout,
                         std::unique_ptr<RendezvousClient>* out, RendezvousInfo* info);
  ~RendezvousClient();

  // Starts heartbeats. `on_gone(worker, finished)` runs on the heartbeat thread once for each
  // worker the coordinator newly reports gone: finished normally, or dead (silent).
  void StartHeartbeats(std::function<void(int32_t worker, bool finished)> on_gone);
  bool shutdown_requested() const { return shutdown_.load(); }
  // The worker's clock, reported with the next heartbeat.
  void set_clock(int64_t clock) { clock_.store(clock); }
  // Asks the coordinator to end the run (every process hears it at its next heartbeat).
  Status RequestShutdown(std::chrono::milliseconds timeout);
  // A worker that has finished training (its last push acknowledged) says so now, and in
  // every later heartbeat; the coordinator then lists it with the dead ("gone") workers.
  Status AnnounceFinished(std::chrono::milliseconds timeout);
  // A worker that is done with everything (final evaluation, model saved) and about to exit
  // says so now, and in every later heartbeat (kFlagDone, which implies finished). The
  // coordinator ends the run once every worker is done or dead: how a cluster run stops
  // without a launcher that sees every process exit.
  Status AnnounceDone(std::chrono::milliseconds timeout);
  // Workers the coordinator's latest reply listed as gone: dead (silent) or finished.
  std::vector<int32_t> gone_workers() const;

  // "host:port" -> "tcp://host:port"; full addresses are returned unchanged.
  static std::string ToAddress(const std::string& host_port);

 private:
  RendezvousClient() = default;
  // One request and its reply. With `say_waiting`, logs every few seconds that it is still
  // waiting for the coordinator (registration, when the coordinator may not be up yet).
  Status Exchange(const MessageHeader& request, MessageHeader* reply, std::chrono::milliseconds timeout,
                  bool say_waiting = false);
  void HeartbeatLoop(std::function<void(int32_t, bool)> on_gone);
  // One heartbeat now (clock, finished flag); records the reply's gone workers.
  Status SendHeartbeat(std::chrono::milliseconds timeout, MessageHeader* reply);

  RendezvousOptions options_;
  int32_t id_ = -1;
  std::unique_ptr<ClientEndpoint> endpoint_;
  std::mutex endpoint_mu_;  // Exchange() from the heartbeat thread and RequestShutdown()
  uint64_t next_request_ = 1;
  std::atomic<int64_t> clock_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> done_{false};
  mutable std::mutex gone_mu_;
  std::vector<int32_t> gone_;  // the latest reply's dead_workers
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace downpour
