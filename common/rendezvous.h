// rendezvous.h — a process's link to the coordinator (server/coordinator.h): register (role,
// layout hash, own address, the run's token) to get an id and the server list, then heartbeat
// on a thread of its own, hearing about dead workers and shutdown. Used by shard servers, workers
// and the evaluator, so it lives in common/ (server and client never include each other).
//
// Membership changes. The client keeps its own gone list and the sequence number of the last
// change it has seen (sent as gone_seq with every heartbeat); a reply adds the workers gone
// since, or, flagged kFlagGoneListFull, replaces the list (new client, far behind, another
// coordinator incarnation, a gone worker came back). gone_workers() is always the whole list.
// Worker heartbeat replies carry the server addresses: OnServerMoved hears of a changed one.
//
// Surviving the coordinator. A heartbeat that gets no reply is not fatal: the thread keeps
// heartbeating and logs "coordinator ... unreachable for N s" every few seconds. When a
// heartbeat is refused because the id is not registered on this connection (a restarted
// coordinator knows nobody, or the id was taken over), the client registers again with the same
// role, id and address, so a new coordinator rebuilds membership from the living. A new
// coordinator incarnation is logged.
//
// Thread-safety: after Register(), the heartbeat thread owns the endpoint; the accessors and
// set_clock() are thread-safe. Destroying the object stops the thread. The Transport must
// outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/codec.h"
#include "common/transport.h"

namespace downpour {

// Heartbeat replies (coordinator): dead_workers / finished_workers are the whole current gone
// list, not the changes since the request's gone_seq. A high bit, apart from the push flags.
inline constexpr uint32_t kFlagGoneListFull = 1u << 16;

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
  // Polled about every 100 ms while Register waits for the coordinator: true ends the wait with
  // kUnavailable (a process that blocks SIGTERM to handle it must still stop while it waits).
  std::function<bool()> stop_requested;
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
  // with both hashes in the message. An id still held by this process's previous connection (a
  // restart in place) is retried every heartbeat interval until the coordinator releases it.
  static Status Register(Transport* transport, RendezvousOptions options, std::chrono::milliseconds timeout,
                         std::unique_ptr<RendezvousClient>* out, RendezvousInfo* info);
  ~RendezvousClient();

  // Starts heartbeats. `on_gone(worker, finished)` runs on the heartbeat thread once for each
  // worker the coordinator newly reports gone: finished normally, or dead (silent).
  void StartHeartbeats(std::function<void(int32_t worker, bool finished)> on_gone);
  // Call before StartHeartbeats. `moved(server, address)` runs on the heartbeat thread whenever
  // a reply names an address for `server` other than the last known one (a restarted server on
  // another host or port). Workers only (servers' replies carry no addresses).
  void OnServerMoved(std::function<void(int32_t server, const std::string& address)> moved);
  // The coordinator incarnation last heard from (0 before the first reply).
  uint64_t coordinator_incarnation() const { return incarnation_.load(); }
  // A worker's data slice as the coordinator's latest heartbeat reply dealt it: its rank among
  // the live workers and their number. False until a reply carried one (or when the worker is
  // no longer live: finished).
  bool data_slice(int* index, int* count) const;
  // Workers live (registered, not gone) as of the coordinator's latest heartbeat reply to this
  // worker or evaluator, joiners included; -1 before the first. The evaluator waits on it (and
  // on gone_workers()) for every worker to finish before the final evaluation.
  int live_workers() const { return live_workers_.load(); }
  // Times this client registered again (a restarted coordinator, a lost id).
  uint64_t reregistrations() const { return reregistrations_.load(); }
  bool shutdown_requested() const { return shutdown_.load(); }
  // Called once, on the heartbeat thread, when the coordinator says this worker was declared
  // dead while it was stopped or cut off (kFlagRemoved): the process is out of the run and must
  // stop. Setting it (also to empty) waits for a call in progress, so a callback cleared before
  // what it uses is destroyed is never called after.
  void SetOnRemoved(std::function<void()> on_removed);
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
  // Workers the coordinator has reported gone (dead: silent, or finished), ascending: the list
  // as of the latest reply, built from its changes.
  std::vector<int32_t> gone_workers() const;

  // "host:port" -> "tcp://host:port"; full addresses are returned unchanged.
  static std::string ToAddress(const std::string& host_port);

 private:
  RendezvousClient() = default;
  // One request and its reply. With `say_waiting`, logs every few seconds that it is still
  // waiting for the coordinator (registration, when the coordinator may not be up yet). A reply
  // that arrived (error or not) is in *reply.
  Status Exchange(const MessageHeader& request, MessageHeader* reply, std::chrono::milliseconds timeout,
                  bool say_waiting = false);
  MessageHeader RegisterRequest() const;
  // Registers again with the same role, id and address; notes the new incarnation.
  Status Reregister(std::chrono::milliseconds timeout);
  void HeartbeatLoop(std::function<void(int32_t, bool)> on_gone);
  // One heartbeat now (clock, finished flag, gone_seq); applies the reply's changes.
  Status SendHeartbeat(std::chrono::milliseconds timeout, MessageHeader* reply);
  // With gone_mu_ held: merges a reply's gone list and server addresses.
  void ApplyReplyLocked(const MessageHeader& reply);
  void NoteAddressesLocked(const std::vector<std::string>& addresses);

  RendezvousOptions options_;
  int32_t id_ = -1;
  // Random, nonzero, one per process (this object): on every register and heartbeat, so the
  // coordinator tells this process apart from another that took its id (a replaced server).
  uint64_t session_ = 0;
  std::unique_ptr<ClientEndpoint> endpoint_;
  std::mutex endpoint_mu_;  // Exchange() from the heartbeat thread and RequestShutdown()
  std::mutex heartbeat_mu_;  // one heartbeat (request + applying its reply) at a time
  uint64_t next_request_ = 1;
  std::atomic<int64_t> clock_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> incarnation_{0};
  std::atomic<int64_t> slice_{-1};  // (index << 32) | count from the latest reply; -1 = none
  std::atomic<int> live_workers_{-1};
  std::atomic<uint64_t> reregistrations_{0};
  mutable std::mutex gone_mu_;          // guards everything below up to the callbacks
  std::map<int32_t, bool> gone_;        // worker -> finished
  uint64_t gone_seq_ = 0;               // last change seen
  std::vector<std::pair<int32_t, bool>> undelivered_gone_;   // for on_gone, heartbeat thread
  std::vector<std::string> servers_;                          // last known addresses
  std::vector<std::pair<int32_t, std::string>> undelivered_moves_;
  std::function<void(int32_t, const std::string&)> on_server_moved_;
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> removed_{false};
  std::mutex removed_mu_;  // guards on_removed_ and its call
  std::function<void()> on_removed_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace downpour
