// coordinator.h — the run's one well-known endpoint (DESIGN.md "Coordinator"): rendezvous,
// membership by heartbeats, clocks, shutdown broadcast.
//
//  * register: servers register with their --id and address, workers get the next free id
//    (or the one they ask for). Everyone's layout hash must equal the coordinator's; a mismatch
//    is refused with an error naming both hashes. A worker's register reply is held until every
//    server has registered, so it always carries the complete server list.
//  * heartbeat: marks the sender alive and records its clock; the reply lists every worker
//    declared dead (silent for longer than heartbeat_timeout, or finished: a heartbeat with
//    kFlagFinished) and whether the run is shutting down. Servers pass the dead list to their
//    consistency policy; so the run finishes.
//  * shutdown: on request (admin), or by itself once every worker 0..W-1 is done (a heartbeat
//    with kFlagDone: evaluated, saved, exiting) or silent past the timeout — how a cluster run
//    ends without a launcher that sees every process. Every later heartbeat reply says
//    shutdown. Serve() returns once every registered process has heard it, or after
//    `shutdown_grace` at the latest.
//
// Authorisation (server/access.h, CoordinatorOptions::access): register as a server needs the
// server role (keys) or the run's secret (no keys), as a worker the worker role or the secret,
// as an observer the admin role or the secret; shutdown needs admin or the secret. An id is
// bound to the connection (PeerId) that registered it: a server id is re-bound to another
// connection only after its holder has been silent for heartbeat_timeout (servers heartbeat
// too), a worker id likewise; heartbeats and clocks for a worker id from any other connection
// are refused. Every refusal gets an error reply, is counted (refused()) and is logged at a
// bounded rate, with a "refused" event for each line logged. Registrations are logged with the
// peer's address and authenticated role.
//
// Thread-safety: Serve() runs on one thread; Stop() and the accessors are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/log_limit.h"
#include "common/transport.h"
#include "server/access.h"

namespace downpour {

// A membership event, for the run's metrics (downpour-coordinator writes one JSONL line each).
struct CoordinatorEvent {
  std::string kind;    // "server_registered", "worker_registered", "worker_finished",
                       // "worker_done", "worker_dead", "shutdown", "refused"
  int32_t id = -1;     // server or worker id (shutdown: the requester's id, -1 = the
                       // coordinator itself; refused: the id the message claimed)
  std::string detail;  // server address; dead worker: last clock and silence; shutdown: role
                       // or reason; refused: what and why, with the running count
};

struct CoordinatorOptions {
  int servers = 1;                                   // S
  int workers = 1;                                   // W (worker ids 0..W-1)
  uint64_t layout_hash = 0;                          // the layout every process must have
  uint32_t model_id = 0;
  std::chrono::milliseconds heartbeat_timeout{5000};  // silence after which a worker is dead
  std::chrono::milliseconds shutdown_grace{3000};     // longest wait for everyone to hear shutdown
  std::chrono::milliseconds poll_interval{20};
  // Called on the Serve thread with the coordinator's lock held; keep it short.
  std::function<void(const CoordinatorEvent&)> on_event;
  // Who may register as a server / worker / observer and request shutdown (server/access.h).
  // The default (no keys, no run secret) checks nothing.
  AccessPolicy access;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);

  Status Serve(ServerEndpoint* endpoint);
  void Stop() { stop_.store(true); }

  std::vector<int32_t> dead_workers() const;
  std::vector<std::string> server_addresses() const;
  bool shutting_down() const { return shutdown_.load(); }
  // Messages answered with an error (unauthorised, id bound elsewhere, bad layout, ...).
  uint64_t refused() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct PendingRegister {
    PeerId peer;
    MessageHeader request;
  };
  // The connection an id is bound to, and when it was last heard from.
  struct Holder {
    bool bound = false;
    PeerId peer;
    Clock::time_point seen;
  };
  void Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const Frames& frames);
  Status HandleRegister(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  Status RegisterServer(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  Status RegisterWorker(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  // Ok when `peer` may bind `what` `id` now: unbound, bound to `peer`, or its holder is silent.
  Status CheckRebind(const char* what, int32_t id, const Holder& holder, const PeerId& peer) const;
  Status NoteHeartbeat(const PeerId& peer, const MessageHeader& h);
  void ReplyRegister(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h, int32_t id);
  void CheckLiveness();
  void MaybeEndRun();                                      // with mu_ held
  void BeginShutdown(int32_t by, const std::string& who);  // with mu_ held
  void Refuse(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
              const Status& why);                               // with mu_ held
  void Emit(const char* kind, int32_t id, std::string detail);  // with mu_ held
  bool AllServersRegistered() const;
  bool RegisterPending(int32_t worker) const;  // its register reply waits for the servers
  void Reply(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h);

  const CoordinatorOptions options_;
  mutable std::mutex mu_;
  std::vector<std::string> server_addresses_;  // "" until registered
  std::vector<Holder> server_holders_;         // index = server id
  std::map<int32_t, Holder> worker_holders_;   // seen = last heartbeat / clock / register
  std::map<int32_t, int64_t> worker_clock_;
  std::set<int32_t> dead_;      // gone: silent past the timeout, or finished
  std::set<int32_t> silent_;    // silent past the timeout (finished or not)
  std::set<int32_t> finished_;  // said they finished (kFlagFinished)
  std::set<int32_t> done_;      // said they are done and exiting (kFlagDone)
  std::set<PeerId> told_shutdown_;
  std::set<PeerId> peers_;  // registered processes
  uint64_t refused_ = 0;
  RateLimitedLog refusal_log_{"coordinator", "refusals"};
  std::vector<PendingRegister> pending_;
  int32_t next_worker_ = 0;
  std::chrono::steady_clock::time_point shutdown_at_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutdown_{false};
};

}  // namespace downpour
