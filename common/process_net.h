// process_net.h — one function every downpour program calls to set up its network and its
// security: from the run config and the program's own --bind / --advertise / --coordinator it
// decides what this process binds, the address it advertises, where the coordinator is, the
// ZeroMQ options (CurveZMQ keys, the source address of outgoing connections) and how its
// privileged messages are authorised (keys, or the run's secret).
//
//   bind         --bind, else cluster.bind (processes that bind: coordinator and servers).
//   advertise    --advertise, else cluster.advertise, else derived from the bind
//                (common/net_address.h: never loopback for a wildcard bind); an explicit name
//                must resolve.
//   coordinator  --coordinator, else cluster.coordinator (host:port, "[v6]:port").
//   source       outgoing connections (servers to the coordinator, workers to everyone) leave
//                from --bind when it names one address, or from cluster.bind when that names
//                one non-loopback address; else the OS picks.
//   link         cluster.link_gbps > 0: ProcessTransport puts the emulated link
//                (common/emulated_link.h) in front of ZeroMQ, pacing this process's egress to it
//                (cluster.reply_order = "step": replies by order key), and same-host shared memory
//                is off (SharedMemoryOn), since it would bypass the link.
//   security     security.keys set: CurveZMQ with that key directory (common/security.h
//                LoadCurveKeys: this role's client key; binders also the endpoint key and the
//                allow-list), keyed = true. No keys: the bind must be loopback unless
//                security.insecure (CheckBindAllowed), and the run's secret
//                (common/run_secret.h, <run_dir>/secret, made if missing) is the token of
//                register and admin messages.
// Every error names the flag or config key and the value, and happens before anything binds.
//
// Thread-safety: reentrant; ProcessNet is a value.
#pragma once

#include <memory>
#include <string>

#include "common/emulated_link.h"
#include "common/run_config.h"
#include "common/status.h"
#include "common/zmq_transport.h"

namespace downpour {

enum class NetRole {
  kCoordinator,  // binds; its client key is admin's (it sends nothing, but may)
  kServer,       // binds, and connects to the coordinator with the server key
  kWorker,       // connects only, with the worker key
  kAdmin,        // connects only, with the admin key (operator tools, the launcher)
};
const char* NetRoleName(NetRole role);

// A program's own network flags; "" = take it from the run config.
struct NetFlags {
  std::string bind;         // --bind: address to bind (servers, coordinator) or source address (workers)
  std::string advertise;    // --advertise: host others reach this process at
  std::string coordinator;  // --coordinator: host:port of the coordinator
};

struct ProcessNet {
  ZmqOptions zmq;           // curve, connect_source, peer_queue_bytes (and ZeroMQ's defaults)
  EmulatedLinkOptions link;  // gbps 0 = no emulated link (cluster.link_gbps)
  std::string bind;         // binders: the address to bind ("0.0.0.0", "127.0.0.3", "::")
  std::string advertise;    // binders: the host others reach it at
  std::string coordinator;  // host:port
  bool keyed = false;       // CurveZMQ keys authenticate every peer
  std::string token;        // unkeyed: the run's secret ("" without a run directory)

  // "tcp://<bind>:<port>".
  std::string BindUrl(int port) const;
  // The advertised URL for an endpoint bound at `bound_address` (its port: the real one when
  // bound to port 0).
  std::string AdvertisedUrl(const std::string& bound_address) const;
  // "listening on tcp://0.0.0.0:5601, advertised as tcp://n2:5601, coordinator n1:5555,
  // CurveZMQ on" (the bound parts only for binders; `bound_address` "" for a worker).
  std::string Describe(const std::string& bound_address) const;
};

// A program's transport: ZeroMQ with net.zmq, behind the emulated link (net.link.gbps > 0) whose
// timeline is net.zmq.trace. Without a link, Bind and Connect are ZeroMQ's own. Thread-safety as
// ZmqTransport's.
class ProcessTransport : public Transport {
 public:
  explicit ProcessTransport(const ProcessNet& net);
  TrafficCounts traffic() const override { return zmq_.traffic(); }
  Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) override;
  Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) override;
  uint64_t refused_connections() const { return zmq_.refused_connections(); }

 private:
  ZmqTransport zmq_;
  std::unique_ptr<EmulatedLinkTransport> link_;  // null: no emulated link
};

// Whether same-host payloads may go through shared memory: cluster.shared_memory, unless an
// emulated link (cluster.link_gbps) is on, whose bytes shared memory would bypass.
bool SharedMemoryOn(const RunConfig& config);
// "" without an emulated link; else the one line a program logs about it ("emulated link
// cluster.link_gbps = 10 Gbit/s per process (egress, experiments only); shared memory off: ...").
std::string EmulatedLinkNote(const RunConfig& config);

// Sets up `out` for a process of `role` in the run whose directory is `run_dir` ("" = no run
// directory: no run secret, e.g. a standalone server in a benchmark).
Status SetUpProcessNet(const RunConfig& config, const NetFlags& flags, NetRole role, const std::string& run_dir,
                       ProcessNet* out);

}  // namespace downpour
