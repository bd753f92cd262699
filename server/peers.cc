#include "server/peers.h"

#include <algorithm>

namespace downpour {

bool PeerTable::RegisterWorker(const PeerId& peer, int32_t worker) {
  auto old = registered_.find(peer);
  if (old != registered_.end() && old->second == worker) return false;
  if (old != registered_.end()) {  // this connection registered as another id before
    auto& q = peers_of_worker_[static_cast<size_t>(old->second)];
    q.erase(std::remove(q.begin(), q.end(), peer), q.end());
  }
  registered_[peer] = worker;
  auto& q = peers_of_worker_[static_cast<size_t>(worker)];
  q.push_back(peer);
  if (q.size() > static_cast<size_t>(kPeersPerWorker)) {  // bounded: the oldest connection goes
    Forget(q.front());
    q.pop_front();
  }
  return true;
}

bool PeerTable::IsWorker(const PeerId& peer, int32_t worker) const {
  auto it = registered_.find(peer);
  return it != registered_.end() && it->second == worker;
}

bool PeerTable::RegisterReader(const PeerId& peer) {
  if (IsReader(peer)) return false;
  readers_.push_back(peer);
  if (readers_.size() > static_cast<size_t>(kMaxReaders)) readers_.pop_front();  // bounded: the oldest goes
  return true;
}

bool PeerTable::IsReader(const PeerId& peer) const {
  return std::find(readers_.begin(), readers_.end(), peer) != readers_.end();
}

std::shared_ptr<SharedRegion> PeerTable::Region(const PeerId& peer) const {
  auto it = regions_.find(peer);
  return it == regions_.end() ? nullptr : it->second;
}

void PeerTable::SetRegion(const PeerId& peer, std::shared_ptr<SharedRegion> region) {
  regions_[peer] = std::move(region);
}

void PeerTable::DropRegion(const PeerId& peer) { regions_.erase(peer); }

void PeerTable::Forget(const PeerId& peer) {
  registered_.erase(peer);
  regions_.erase(peer);
}

}  // namespace downpour
