// inproc_transport.h — Transport for threads in one process: no sockets, no copies (a frame
// crosses as the same bytes with its keepalive). Lets distributed logic (shards, client,
// coordinator) be tested as threads. Addresses are plain names; Bind of a taken name fails.
// Mailboxes are unbounded (the threads are the test's own): a server's Send never blocks and
// no peer is ever dropped (dropped_peers() is 0).
//
// Thread-safety: InprocTransport is thread-safe; endpoints follow transport.h (one thread at a
// time each). The transport must outlive its endpoints.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "common/transport.h"

namespace downpour {

namespace inproc_internal {
struct Mailbox;
}

class InprocTransport : public Transport {
 public:
  InprocTransport();
  ~InprocTransport() override;
  Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) override;
  Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) override;
  // Connect, with every message of the endpoint received as coming from `peer` (its user_id
  // stands for an authenticated key's role): how tests play a keyed admin, server or worker.
  Status ConnectAs(const std::string& address, PeerInfo peer, std::unique_ptr<ClientEndpoint>* out);

  // Shared routing table (internal to the endpoints).
  struct Registry;

 private:
  std::shared_ptr<Registry> registry_;
};

}  // namespace downpour
