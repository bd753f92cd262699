// coordinator.h — the run's one well-known endpoint (docs/architecture.md "The processes of a
// job"): rendezvous, membership by heartbeats, clocks, shutdown broadcast.
//
//  * register: servers register with their --id and address, workers with the id they ask for
//    or -1: then the next of 0..W-1 never registered, and once those are all taken the lowest
//    id >= W never used (a worker joining a running job, elastic). Worker ids are bounded:
//    0..max_workers-1 (max_workers 0 = W); anything else is refused, so no made-up id ever
//    enters a table. Everyone's layout hash must equal the coordinator's; a mismatch is refused
//    with an error naming both hashes. A worker's register reply is held until every server has
//    registered, so it always carries the complete server list.
//  * heartbeat: marks the sender alive and records its clock; the reply says whether the run is
//    shutting down and carries membership CHANGES: every change (a worker gone: silent for
//    longer than heartbeat_timeout, or finished: a heartbeat with kFlagFinished) gets the next
//    sequence number; the request's gone_seq is the last one the sender has seen, the reply's
//    the newest, and dead_workers / finished_workers list only the workers gone after the
//    request's seq. The whole current gone list is sent instead (flag kFlagGoneListFull,
//    common/rendezvous.h) when the sender is new (seq 0), too far behind (older than the
//    bounded change log), from another incarnation of the coordinator, or when a gone worker
//    came back since its seq. Worker heartbeat replies also carry the server addresses (a
//    restarted server's new one) and the worker's data slice: its rank among the live workers
//    (sliceIndex) and their number (workerCount), which a worker reading a slice of a shared
//    LMDB takes at its next epoch, so the slices are dealt again when workers join or leave.
//    Servers pass the gone workers to their consistency policy and fence their processes. A
//    worker declared dead that heartbeats again (it was stopped or cut off) is answered with
//    kFlagRemoved: it is out of the run and stops; a restarted process registers anew.
//  * its own pauses: a gap in its loop longer than max(heartbeat_interval, 10 poll intervals) is
//    time this process did not run; everyone's silence and the end rule's timers move on by it
//    (ForgiveStall), so a paused coordinator declares nobody dead for its own pause. Likewise
//    while it hears no server at all (options.cut_off_limit): then it is the one cut off.
//  * shutdown: on request (admin), or by itself once every worker of 0..W-1 and every worker
//    that registered (joiners too) is done (a heartbeat with kFlagDone: evaluated, saved,
//    exiting) or silent past the timeout — how a cluster run ends without a launcher that sees
//    every process. In a run with an evaluator (options.evaluator) the evaluator must then be
//    done too (its final evaluation of the finished weights, the model saved), or silent past
//    the timeout, or — never registered — not heard of within the timeout after the workers
//    ended. Every later heartbeat reply says shutdown. Serve() returns once every registered
//    process has heard it, or after `shutdown_grace` at the latest.
//  * the evaluator (Role::kEvaluator, one per run, id 0; refused in a run without one): it
//    registers like a worker (the reply waits for the servers; the id is bound to its
//    connection and taken over by a restarted evaluator after two silent heartbeat intervals
//    when it proves its role, else after the timeout), heartbeats with kFlagDone when it has
//    made the final evaluation, and hears what a worker hears: the gone list, the server
//    addresses and how many workers are live (workerCount) — it makes the final evaluation
//    once every worker has finished or died.
//
// Every reply carries `incarnation`: random, nonzero, new per Coordinator object.
//
// Bounded state. Tables are indexed by id (S servers, max_workers workers) and sized once; a
// gone worker of id >= W leaves the gone list `gone_retention` after it went (its id stays
// used, never handed out again); the gone workers of 0..W-1 stay listed (at most W). The
// change log keeps the last kChangeLog changes. No per-message work scans ids: liveness is
// checked once per poll_interval over the live workers only, the change reply walks only the
// changes after the sender's seq.
//
// Restart (rejoin = true, downpour-coordinator --rejoin): a new coordinator knows nobody; the
// living re-register by themselves (RendezvousClient re-registers when its heartbeat is refused
// as not registered on this connection), so membership is rebuilt from their heartbeats. For
// the end-of-run rule a worker of 0..W-1 not heard from within heartbeat_timeout of the start
// counts as dead (it died, or ended, while there was no coordinator).
//
// Authorisation (server/access.h, CoordinatorOptions::access): register as a server needs the
// server role (keys) or the run's secret (no keys), as a worker the worker role or the secret,
// as an observer the admin role or the secret; shutdown needs admin or the secret. An id is
// bound to the connection (PeerId) that registered it: a server id is re-bound to another
// connection only after its holder has been silent for heartbeat_timeout (servers heartbeat
// too), a worker id likewise — except that a server id is taken over at once from a holder
// silent for more than 2 heartbeat intervals by an authenticated server (keys: the server key;
// no keys: the run secret), which is how a restarted server gets its id back quickly; heartbeats and clocks for a worker id from any other connection
// are refused. Every refusal gets an error reply, is counted (refused()) and is logged at a
// bounded rate, with a "refused" event for each line logged. Registrations are logged with the
// peer's address and authenticated role.
//
// Thread-safety: Serve() runs on one thread; Stop() and the accessors are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/config/cluster.h"
#include "common/log_limit.h"
#include "common/transport.h"
#include "server/access.h"

namespace downpour {

// A membership event, for the run's metrics (downpour-coordinator writes one JSONL line each).
struct CoordinatorEvent {
  std::string kind;    // "server_registered", "worker_registered", "worker_finished",
                       // "worker_done", "worker_dead", "evaluator_registered",
                       // "evaluator_done", "evaluator_dead", "shutdown", "refused"
  int32_t id = -1;     // server or worker id (shutdown: the requester's id, -1 = the
                       // coordinator itself; refused: the id the message claimed)
  std::string detail;  // server address; dead worker: last clock and silence; shutdown: role
                       // or reason; refused: what and why, with the running count
};

struct CoordinatorOptions {
  // The run's [cluster] as it gives it (no key copied); the coordinator reads servers (S),
  // workers (W: ids 0..W-1), max_workers (ids 0..max_workers-1; 0 = W), heartbeat_ms (the
  // processes' heartbeat interval) and heartbeat_timeout_ms (silence after which a worker is dead).
  ClusterConfig cluster;
  uint64_t layout_hash = 0;                          // the layout every process must have
  uint32_t model_id = 0;
  // How long a gone worker of id >= workers stays in the gone list (full heartbeat replies).
  std::chrono::milliseconds gone_retention{60000};
  // A restarted coordinator (see above): workers 0..W-1 not heard from within heartbeat_timeout
  // of the start count as dead.
  bool rejoin = false;
  std::chrono::milliseconds shutdown_grace{3000};     // longest wait for everyone to hear shutdown
  // While every registered server has been silent for max(4 heartbeat intervals, half the
  // timeout), this coordinator is taken to be cut off (servers never fall silent in a healthy
  // run): nobody is declared dead for that time, up to this long (then deaths are declared
  // again: the servers may be gone).
  std::chrono::milliseconds cut_off_limit{120000};
  bool evaluator = false;
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
  // This coordinator's incarnation (in every reply).
  uint64_t incarnation() const { return incarnation_; }
  // The newest membership change's sequence number.
  uint64_t gone_seq() const;
  // What the tables hold now, for tests that check they stay bounded.
  struct TableSizes {
    size_t worker_slots = 0;  // fixed: max_workers
    size_t registered = 0;    // worker ids ever registered (used)
    size_t live = 0;          // workers watched for liveness
    size_t gone_listed = 0;   // workers in a full gone list
    size_t change_log = 0;
    size_t pending = 0;       // register replies waiting for the servers
  };
  TableSizes table_sizes() const;
  // Change-log length: a sender further behind gets the full gone list.
  static constexpr size_t kChangeLog = 1024;

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
    uint64_t session = 0;  // the holding process's (RendezvousClient); 0 = not sent
  };
  // A server process whose id another process took over (kReplacedKept kept, oldest dropped).
  struct Replaced {
    int32_t server;
    uint64_t session;
    bool told = false;  // heard from again and told it is out (logged once)
  };
  static constexpr size_t kReplacedKept = 64;
  // Everything known about one worker id (index = id, 0..max_workers-1).
  struct WorkerSlot {
    Holder holder;        // seen = last heartbeat / clock / register
    bool used = false;    // registered at some time (never handed out again by -1)
    bool pending = false; // its register reply waits for the servers
    bool gone = false;    // in the gone list: silent past the timeout, or finished
    bool silent = false;  // silent past the timeout (finished or not)
    bool finished = false;
    bool done = false;
    bool told_removed = false;  // declared dead, heard from again, told it is out (logged once)
    int64_t clock = 0;
    Clock::time_point gone_at;
  };
  struct Change {
    uint64_t seq;
    int32_t worker;
    bool finished;
  };
  void Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const Frames& frames);
  Status HandleRegister(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  Status RegisterServer(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  Status RegisterWorker(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  Status RegisterEvaluator(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h);
  // Ok when `peer` may bind `what` `id` now: unbound, bound to `peer`, or its holder is silent
  // (for longer than `silence`).
  Status CheckRebind(const char* what, int32_t id, const Holder& holder, const PeerId& peer,
                     std::chrono::milliseconds silence) const;
  // The silence after which a server or the evaluator that proved its role (keys, or the run's
  // secret) takes its id over from its old holder: two heartbeat intervals; else the timeout.
  std::chrono::milliseconds TakeoverSilence(const PeerInfo& info) const;
  // With mu_ held: the record of `session`, a process of server `server` that another took over;
  // null if it is not one (or session is 0, not sent).
  Replaced* FindReplaced(int32_t server, uint64_t session);
  // `*removed` (kFlagRemoved): the sender is a worker declared dead that is heard from again, or a
  // server process whose id another process has taken over (fencing: it must serve nothing).
  Status NoteHeartbeat(const PeerId& peer, const MessageHeader& h, bool* removed);
  // Fills the reply's gone lists and seq for a sender that has seen `h.gone_seq`.
  void FillChanges(const MessageHeader& h, MessageHeader* r) const;
  void FillSlice(int32_t worker, MessageHeader* r) const;  // with mu_ held
  void MarkGone(int32_t w, bool finished);  // with mu_ held: a membership change
  void ReplyRegister(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h, int32_t id);
  void CheckLiveness();
  // This process did not run for `stalled`: every holder's silence and the end rule's timers
  // move on by as much, so nobody is declared dead for the coordinator's own pause.
  void ForgiveStall(Clock::duration stalled);
  void ForgiveLocked(Clock::duration span);  // with mu_ held: ForgiveStall's shift, no line
  // With mu_ held: whether every registered server has been silent long enough that this process
  // is taken to be cut off (see CoordinatorOptions::cut_off_limit), saying so when it changes.
  bool CutOff(Clock::time_point now);
  void MaybeEndRun();                                      // with mu_ held
  bool EveryoneTold() const;                               // with mu_ held
  void BeginShutdown(int32_t by, const std::string& who);  // with mu_ held
  void Refuse(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
              const Status& why);                               // with mu_ held
  void Emit(const char* kind, int32_t id, std::string detail);  // with mu_ held
  bool AllServersRegistered() const;
  void Reply(ServerEndpoint* ep, const PeerId& peer, MessageHeader h);

  const CoordinatorOptions options_;
  std::chrono::milliseconds heartbeat_interval() const {
    return std::chrono::milliseconds(options_.cluster.heartbeat_ms);
  }
  std::chrono::milliseconds heartbeat_timeout() const {
    return std::chrono::milliseconds(options_.cluster.heartbeat_timeout_ms);
  }
  const int32_t max_workers_;  // effective: max(max_workers, workers)
  const uint64_t incarnation_;
  Clock::time_point started_;  // moved on by a stall of this process (ForgiveStall)
  mutable std::mutex mu_;
  std::vector<std::string> server_addresses_;  // "" until registered
  std::vector<Holder> server_holders_;         // index = server id
  std::deque<Replaced> replaced_servers_;      // newest last, at most kReplacedKept
  std::vector<WorkerSlot> workers_;            // index = worker id
  // The evaluator (options_.evaluator): bound like a worker id; at most one.
  struct EvaluatorSlot {
    Holder holder;
    bool pending = false;  // its register reply waits for the servers
    bool silent = false;   // registered, then silent past the timeout
    bool done = false;     // said kFlagDone: final evaluation made
  };
  EvaluatorSlot evaluator_;
  std::vector<PendingRegister> pending_evaluator_;  // 0 or 1 entries
  bool workers_ended_ = false;                      // the workers' half of the end rule held
  Clock::time_point workers_ended_at_;
  std::set<int32_t> live_;         // registered, not silent: watched for liveness
  std::set<int32_t> gone_listed_;  // in a full gone list
  std::deque<Change> changes_;     // the last kChangeLog changes, seq ascending
  uint64_t gone_seq_ = 0;          // newest change
  uint64_t log_lost_through_ = 0;  // changes up to this seq have left the log
  uint64_t revived_seq_ = 0;       // the seq when a gone worker last came back
  std::deque<std::pair<Clock::time_point, int32_t>> expiry_;  // gone joiners, oldest first
  std::set<PeerId> told_shutdown_;
  uint64_t refused_ = 0;
  RateLimitedLog refusal_log_{"coordinator", "refusals"};
  std::vector<PendingRegister> pending_;
  int32_t next_worker_ = 0;  // no id below it is unused (for -1 registrations)
  Clock::time_point next_liveness_check_;
  bool rejoin_checked_ = false;  // rejoin: the never-heard workers of 0..W-1 counted dead
  Clock::time_point last_liveness_check_;
  Clock::time_point cut_off_since_{};  // every server silent since (epoch: hears some)
  Clock::time_point shutdown_at_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutdown_{false};
};

}  // namespace downpour
