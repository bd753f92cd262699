// peers.h — PeerTable, who is on the other end of a shard's connections: the connections each
// worker id registered (several per worker: cluster.connections_per_server, and reconnects), the
// evaluator's connections (readers), and the same-host shared-memory region offered to a
// connection at its register (common/shm_region.h).
//
// Bounded: kPeersPerWorker connections a worker id (the oldest forgotten, with its region, when
// another registers) and kMaxReaders reader connections (oldest first). A connection registering
// as another worker id moves to that id. A region goes with its connection; the table shares it
// with whoever still writes into it (a lane copying a pull reply), so dropping one never frees
// memory in use.
//
// Thread-safety: none; the shard calls it under its lock, on the loop's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/config/cluster.h"
#include "common/shm_region.h"
#include "common/transport.h"

namespace downpour {

class PeerTable {
 public:
  // Every connection of a worker (cluster.connections_per_server), twice over for reconnects.
  static constexpr int kPeersPerWorker = 2 * kMaxConnectionsPerServer;
  static constexpr int kMaxReaders = 4;  // evaluator connections kept (oldest dropped)

  explicit PeerTable(int max_workers) : peers_of_worker_(static_cast<size_t>(max_workers)) {}

  // `peer` registers as worker `worker` (0..max_workers-1). True if that is new for this
  // connection (a repeated register of the same id changes nothing).
  bool RegisterWorker(const PeerId& peer, int32_t worker);
  // True if `peer` registered as worker `worker` and is still kept.
  bool IsWorker(const PeerId& peer, int32_t worker) const;
  // `peer` registers as the evaluator. True if new.
  bool RegisterReader(const PeerId& peer);
  bool IsReader(const PeerId& peer) const;

  // The region offered to `peer` at its last register; null if none (or it was dropped).
  std::shared_ptr<SharedRegion> Region(const PeerId& peer) const;
  void SetRegion(const PeerId& peer, std::shared_ptr<SharedRegion> region);
  void DropRegion(const PeerId& peer);

  size_t workers_kept() const { return registered_.size(); }  // worker connections kept

 private:
  void Forget(const PeerId& peer);  // its registration and region

  std::unordered_map<PeerId, int32_t> registered_;   // connection -> worker id
  std::vector<std::deque<PeerId>> peers_of_worker_;  // per worker id, oldest first (bounds registered_)
  std::deque<PeerId> readers_;                       // evaluator connections, oldest first
  std::unordered_map<PeerId, std::shared_ptr<SharedRegion>> regions_;
};

}  // namespace downpour
