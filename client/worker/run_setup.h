// run_setup.h — what the worker and the evaluator process build alike from a run config: the
// engine options, the test set, the servers' addresses and how long to wait for them.
//
// Thread-safety: free functions over values.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/engine/net.h"
#include "client/ps/ps_client.h"
#include "client/worker/sources.h"
#include "common/rendezvous.h"
#include "common/run_config.h"
#include "common/status.h"

namespace downpour::worker {

inline constexpr int kEvalBatch = 100;  // test batches (divides the 10k Fashion-MNIST test set)

// The test set data.test (an LMDB, or an IDX file pair), in batches of `batch`.
Status OpenTestSource(const RunConfig& c, int batch, int num_classes, std::unique_ptr<TestSource>* out);

// The engine options [worker] asks for, at batch size `batch`.
engine::NetOptions NetOptionsFor(const RunConfig& c, int batch);

// Server i listens on <bind>:<base_port + i> (the launcher's convention; a wildcard bind is
// reached through loopback on this machine), or with cluster.transport = "ipc" at
// ipc://<ipc_dir>/server-<i>.sock (common/run_config.h ServerAddress).
std::vector<std::string> ServerAddresses(const ClusterConfig& c, const std::string& run_dir);

// Sync/ssp pulls wait for the slowest live worker; a dead one is dropped after the heartbeat
// timeout, so wait comfortably longer than that. This is how long a server that answers may
// hold a request (PsClientOptions::reply_timeout).
std::chrono::milliseconds PullWait(const ClusterConfig& c);

// How long one request may take in all: a server may be away for up to server_wait_ms
// (restarting) and then hold the request for up to PullWait, and the client's own error (naming
// the server) should surface before the caller gives up.
std::chrono::milliseconds RequestWait(const ClusterConfig& c);

// The PS client options of a training worker (a single- or multi-model one): the servers'
// addresses (the coordinator's, else the launcher's convention), its id and the run's token,
// same-host shared memory where the run allows it (off on an emulated link), the waits above,
// and [compression]'s wire codecs. The caller sets what is its own (model_id, role).
PsClientOptions WorkerClientOptions(const RunConfig& c, const std::string& run_dir, const RendezvousInfo& info,
                                    int32_t worker_id, const std::string& token);

// Follows servers that restart at another address (the coordinator's heartbeat replies say so):
// `link`'s heartbeat thread moves `client`'s link to the new address, logging as `who`
// ("worker 3", "evaluator"). The heartbeat thread outlives the client: it reaches it through a
// slot that this object empties, under its lock, when it is destroyed — so destroy it before
// the client.
class ServerMoveFollower {
 public:
  ServerMoveFollower(RendezvousClient* link, PsClient* client, std::string who);
  // Every client of `clients` (a multi-model worker's, one per model) follows the servers.
  ServerMoveFollower(RendezvousClient* link, std::vector<PsClient*> clients, std::string who);
  ~ServerMoveFollower();
  ServerMoveFollower(const ServerMoveFollower&) = delete;
  ServerMoveFollower& operator=(const ServerMoveFollower&) = delete;

 private:
  struct Slot {
    std::mutex mu;
    std::vector<PsClient*> clients;
  };
  std::shared_ptr<Slot> slot_;
};

}  // namespace downpour::worker
