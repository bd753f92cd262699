// run_setup.cc — see run_setup.h.
#include "client/worker/run_setup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "client/worker/loader_sources.h"
#include "client/worker/worker_app.h"
#include "common/process_net.h"

namespace downpour::worker {

Status OpenTestSource(const RunConfig& c, int batch, int num_classes, std::unique_ptr<TestSource>* out) {
  std::string labels;
  if (IsIdxImagePath(c.data.test, &labels)) {
    IdxSourceOptions o;
    o.images_path = c.data.test;
    o.labels_path = labels;
    o.batch_size = batch;
    o.scale = c.data.scale;
    return OpenIdxTestSource(o, out);
  }
  return OpenLoaderTestSource(c, batch, num_classes, out);
}

engine::NetOptions NetOptionsFor(const RunConfig& c, int batch) {
  engine::NetOptions o;
  o.worker = c.worker;
  o.batch = batch;
  return o;
}

std::vector<std::string> ServerAddresses(const ClusterConfig& c, const std::string& run_dir) {
  const std::string dir = std::filesystem::absolute(run_dir).lexically_normal().string();
  std::vector<std::string> out;
  for (int i = 0; i < c.servers; ++i) out.push_back(ServerAddress(c, dir, i));
  return out;
}

std::chrono::milliseconds PullWait(const ClusterConfig& c) {
  return std::chrono::milliseconds(std::max(120000, 4 * c.heartbeat_timeout_ms));
}

std::chrono::milliseconds RequestWait(const ClusterConfig& c) {
  return PullWait(c) + std::chrono::milliseconds(c.server_wait_ms) + std::chrono::seconds(10);
}

PsClientOptions WorkerClientOptions(const RunConfig& c, const std::string& run_dir, const RendezvousInfo& info,
                                    int32_t worker_id, const std::string& token) {
  PsClientOptions po;
  po.server_addresses = info.server_addresses.empty() ? ServerAddresses(c.cluster, run_dir) : info.server_addresses;
  po.worker_id = worker_id;
  po.token = token;
  // Same-host payloads through shared memory (cluster.shared_memory); a server that offers none
  // is used over the socket.
  po.shared_memory = SharedMemoryOn(c);
  // Several connections per server (cluster.connections_per_server), but one when a push's
  // sufficient factors would send each layer's input once per connection.
  po.connections_per_server = c.compression.factors ? 1 : c.cluster.connections_per_server;
  po.max_inflight_bytes = static_cast<uint64_t>(c.cluster.inflight_mb) << 20;
  po.send_order = c.cluster.send_order;
  // Sync/ssp servers hold a pull until it is servable, up to PullWait: a reply must not time out
  // earlier than that. A server that answers nothing (restarting) is waited for up to
  // cluster.server_wait_ms, then the request fails naming it.
  po.reply_timeout = PullWait(c.cluster);
  po.server_wait = std::chrono::milliseconds(c.cluster.server_wait_ms);
  // Gradient pushes and weight pulls (a multi-model worker's moves of activations stay f32).
  po.compression = c.compression;
  return po;
}

ServerMoveFollower::ServerMoveFollower(RendezvousClient* link, PsClient* client, std::string who)
    : ServerMoveFollower(link, std::vector<PsClient*>{client}, std::move(who)) {}

ServerMoveFollower::ServerMoveFollower(RendezvousClient* link, std::vector<PsClient*> clients, std::string who)
    : slot_(std::make_shared<Slot>()) {
  slot_->clients = std::move(clients);
  link->OnServerMoved([slot = slot_, who = std::move(who)](int32_t server, const std::string& address) {
    std::lock_guard<std::mutex> lock(slot->mu);
    if (slot->clients.empty()) return;
    spdlog::info("{}: server {} is now at {}", who, server, address);
    for (PsClient* client : slot->clients) {
      const Status s = client->SetServerAddress(server, address);
      if (!s.ok()) spdlog::warn("{}: cannot follow server {} to {}: {}", who, server, address, s.ToString());
    }
  });
}

ServerMoveFollower::~ServerMoveFollower() {
  std::lock_guard<std::mutex> lock(slot_->mu);
  slot_->clients.clear();
}

}  // namespace downpour::worker
