// model_host.h — one server process serving its shards of several models on one endpoint.
//
// A multi-model run ([[models]] in the run config, docs/multi_model.md) trains K models on one
// set of servers. Each model is a ShardServer of its own (server/shard.h): its own layout
// (models may differ in shape), solver and lr schedule, consistency state, versions, counters,
// registrations, duplicate window, write-ahead log and checkpoint files. Nothing is shared
// between two models but the socket: the host receives every message, reads the model id in
// its header and hands the message to that model's shard, which validates it exactly as a
// single-model server does (so a push for model B cannot touch model A's weights: they are
// different objects). A message naming a model id this process does not serve is refused with
// an error reply (flags = RejectReason::kModelId) and counted in unknown_model(); a message
// whose header cannot be decoded goes to model 0's shard, which refuses and counts it as
// undecodable. A shutdown that any model's shard accepted (it checks the sender's authority)
// ends the whole process.
//
// Memory is the sum of the models' shards; every model's layout splits its floats evenly over
// the S servers (common/layout.h), so the set stays balanced within K floats per server.
//
// Order of work (ShardOptions::cluster.reply_order = "step", model 0's option):
// by default the loop handles messages one at a time in the order it receives them, so two
// workers pushing at once have their pushes applied interleaved and both wait for the last.
// With reply_order "step" it first takes every message already waiting (at most kInbox messages and
// kInboxBytes), then handles, of each peer's oldest waiting message, the one with the lowest
// key: a worker's push, pull and clock messages of one step share the key of the first of them
// to arrive (a push of clock c, a pull and a clock report of c + 1 are step c); other messages
// (registrations, heartbeats, stats, the evaluator's pulls) go first. A peer's own messages keep
// their order, and the loop never waits for a message
// it does not have. Keys are only an order: a message with a false sender id is refused by its
// shard as before.
//
// Thread-safety: Serve runs on one thread; Stop(), shutdown_requested(), unknown_model() and the
// shards' own thread-safe calls may be made from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "common/layout.h"
#include "common/run_config.h"
#include "common/status.h"
#include "common/transport.h"
#include "server/shard.h"

namespace downpour {

// The layouts a server or the coordinator of the run `config` (read from `config_path`) serves:
// one model's, from --tensors `tensors_file` or the built-in --model `model`; or, with
// [[models]], every model's from <run_dir>/tensors-model-<k>.txt (downpour-launch writes them;
// --tensors and --model are then refused, naming the config). CombinedLayoutHash of the result is
// the hash every process of the run compares at rendezvous.
Status LoadRunLayouts(const RunConfig& config, const std::string& config_path, const std::string& tensors_file,
                      const std::string& model, const std::string& run_dir, std::vector<ParamLayout>* out);

// What shard `model` of server `server_id` takes from the run config: solver, consistency,
// worker counts, threads, heartbeat timeout and [checkpoint] — everything its updates and their
// replay depend on. Paths, access, trace and callbacks are the caller's (downpour-server's, or
// downpour-history's replay).
ShardOptions RunShardOptions(const RunConfig& config, int server_id, int model = 0);

class ModelHost {
 public:
  // shards[k] must serve model id k (ShardOptions::model_id == k) and the same server id.
  static Status Create(std::vector<std::unique_ptr<ShardServer>> shards, std::unique_ptr<ModelHost>* out);

  // Opens every shard's write-ahead log, then runs the message loop on the calling thread until
  // Stop() or a shutdown message; returns the endpoint's error if receiving fails otherwise, and a
  // shard's log failure if its log stops taking records (the loop then stops at once).
  Status Serve(ServerEndpoint* endpoint);
  void Start(std::unique_ptr<ServerEndpoint> endpoint);  // Serve on a thread of its own
  Status Join();
  void Stop();
  // Fencing (thread-safe): every shard is fenced (ShardServer::Fence) and the loop stops.
  void Fence() {
    for (const auto& s : shards_) s->Fence();
    Stop();
  }
  bool fenced() const {
    return std::any_of(shards_.begin(), shards_.end(), [](const auto& s) { return s->fenced(); });
  }

  int models() const { return static_cast<int>(shards_.size()); }
  ShardServer* shard(int model) const { return shards_[static_cast<size_t>(model)].get(); }
  bool shutdown_requested() const;
  bool log_failed() const;  // a shard's write-ahead log takes nothing more (ShardServer::log_failed)
  uint64_t unknown_model() const { return unknown_model_.load(); }

 private:
  static constexpr size_t kInbox = 64;                      // messages taken ahead (reply_order "step")
  static constexpr size_t kInboxBytes = size_t{512} << 20;  // ... and their bytes
  struct Inbound {
    PeerId peer;
    PeerInfo info;
    Frames frames;
    MessageHeader h;
    bool parsed = false;
    uint64_t key = 0;  // reply_order "step": lower first (see above); 0 = not a worker's step message
    size_t bytes = 0;
  };

  explicit ModelHost(std::vector<std::unique_ptr<ShardServer>> shards) : shards_(std::move(shards)) {}
  void RefuseUnknownModel(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h);
  void Dispatch(ServerEndpoint* ep, Inbound& m);
  // reply_order "step": the message's key, from its arrival and its worker's step.
  uint64_t StepKey(const Inbound& m, uint64_t arrival_ns);
  // reply_order "step": the index in inbox_ of the message to handle next.
  size_t Next() const;

  std::vector<std::unique_ptr<ShardServer>> shards_;
  std::atomic<uint64_t> unknown_model_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Status thread_status_;
  std::unique_ptr<ServerEndpoint> owned_endpoint_;
  std::vector<Inbound> inbox_;  // received, not yet handled, oldest first (reply_order "step")
  // Per worker id (0..max_workers-1): its latest step and when that step's first message came.
  std::vector<std::pair<int64_t, uint64_t>> step_key_;
};

}  // namespace downpour
