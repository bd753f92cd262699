// process_net.cc — see process_net.h.
#include "common/process_net.h"

#include <algorithm>

#include "common/net_address.h"
#include "common/run_secret.h"
#include "common/security.h"

namespace downpour {
namespace {

bool Binds(NetRole role) { return role == NetRole::kCoordinator || role == NetRole::kServer; }

KeyRole ClientKeyRole(NetRole role) {
  switch (role) {
    case NetRole::kServer:
      return KeyRole::kServer;
    case NetRole::kWorker:
      return KeyRole::kWorker;
    case NetRole::kCoordinator:
    case NetRole::kAdmin:
      return KeyRole::kAdmin;
  }
  return KeyRole::kWorker;
}

// Outgoing connections leave from one specific address when the operator named one: --bind
// (any specific address, loopback included: 127.0.0.5 on a one-machine test), or cluster.bind
// when it is one non-loopback address (a loopback source could not reach another host).
std::string ConnectSource(const RunConfig& c, const NetFlags& f) {
  if (!f.bind.empty()) return IsWildcardAddress(f.bind) ? "" : f.bind;
  if (IsWildcardAddress(c.cluster.bind) || IsLoopbackLiteral(c.cluster.bind) || c.cluster.bind == "localhost") {
    return "";
  }
  return c.cluster.bind;
}

// Without keys, the coordinator must be on this host: a name is judged by what it resolves to
// (a Slurm node name may be an alias of 127.0.0.1, as on a one-machine test cluster); a name
// that does not resolve is left to the connection, which says it is waiting for it.
Status CheckCoordinatorAllowed(const std::string& host, const SecurityConfig& security, const std::string& where) {
  if (IsLoopbackHost(host) || !security.keys.empty() || security.insecure) return Status::Ok();
  std::vector<std::string> addresses;
  if (!ThisHost().resolve(host, &addresses).ok()) return Status::Ok();
  if (std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) { return IsLoopbackLiteral(a); })) {
    return Status::Ok();
  }
  return CheckBindAllowed(host, security, where);
}

}  // namespace

const char* NetRoleName(NetRole role) {
  switch (role) {
    case NetRole::kCoordinator:
      return "coordinator";
    case NetRole::kServer:
      return "server";
    case NetRole::kWorker:
      return "worker";
    case NetRole::kAdmin:
      return "admin";
  }
  return "?";
}

std::string ProcessNet::BindUrl(int port) const { return TcpUrl(bind, port); }

std::string ProcessNet::AdvertisedUrl(const std::string& bound_address) const {
  HostPort bound;
  if (!ParseTcpUrl(bound_address, &bound).ok()) return bound_address;
  return TcpUrl(advertise, bound.port);
}

std::string ProcessNet::Describe(const std::string& bound_address) const {
  std::string text;
  if (!bound_address.empty()) {
    text = fmt::format("listening on {}, advertised as {}, ", bound_address, AdvertisedUrl(bound_address));
  } else if (!zmq.connect_source.empty()) {
    text = fmt::format("connecting from {}, ", zmq.connect_source);
  }
  return text +
         fmt::format("coordinator {}, {}", coordinator,
                     keyed ? "CurveZMQ on"
                           : (token.empty() ? "CurveZMQ off, no run secret" : "CurveZMQ off (loopback, run secret)"));
}

ProcessTransport::ProcessTransport(const ProcessNet& net) : zmq_(net.zmq) {
  if (net.link.gbps > 0) {
    EmulatedLinkOptions o = net.link;
    o.trace = net.zmq.trace;
    o.linger_ms = net.zmq.linger_ms;
    link_ = std::make_unique<EmulatedLinkTransport>(&zmq_, o);
  }
}

Status ProcessTransport::Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) {
  return link_ ? link_->Bind(address, out) : zmq_.Bind(address, out);
}

Status ProcessTransport::Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) {
  return link_ ? link_->Connect(address, out) : zmq_.Connect(address, out);
}

bool SharedMemoryOn(const RunConfig& c) { return c.cluster.shared_memory && !(c.cluster.link_gbps > 0); }

std::string EmulatedLinkNote(const RunConfig& c) {
  if (!(c.cluster.link_gbps > 0)) return "";
  return fmt::format(
      "emulated link: cluster.link_gbps = {:g} Gbit/s of egress per process (experiments only){}", c.cluster.link_gbps,
      c.cluster.shared_memory ? "; shared memory off (cluster.shared_memory would bypass the link)" : "");
}

Status SetUpProcessNet(const RunConfig& c, const NetFlags& f, NetRole role, const std::string& run_dir,
                       ProcessNet* out) {
  *out = ProcessNet{};
  const bool binds = Binds(role);
  out->bind = std::string(StripBrackets(f.bind.empty() ? c.cluster.bind : f.bind));
  const std::string bind_where = f.bind.empty() ? "cluster.bind" : "--bind";

  out->coordinator = f.coordinator.empty() ? c.cluster.coordinator : f.coordinator;
  HostPort coordinator;
  DP_RETURN_IF_ERROR(
      ParseHostPort(out->coordinator, f.coordinator.empty() ? "cluster.coordinator" : "--coordinator", &coordinator));

  out->zmq.connect_source = ConnectSource(c, f);
  // A bound socket's per-peer queue of replies a peer does not read (common/zmq_transport.h).
  out->zmq.peer_queue_bytes = static_cast<size_t>(c.cluster.peer_queue_mb) << 20;
  out->zmq.io_threads = c.cluster.io_threads;
  out->link.gbps = c.cluster.link_gbps;  // 0 = no emulated link
  out->link.order_by_key = c.cluster.reply_order == ReplyOrder::kStep;
  out->link.peer_queue_bytes = out->zmq.peer_queue_bytes;
  if (!c.security.keys.empty()) {
    DP_RETURN_IF_ERROR(LoadCurveKeys(c.security.keys, ClientKeyRole(role), binds, &out->zmq.curve));
    out->keyed = true;
  } else {
    // The loopback rule is the job's, so every task checks it, not only the ones that bind: a
    // worker of a job whose servers listen off-host (cluster.bind), or whose coordinator is on
    // another host, would otherwise start and talk in plaintext before the binders refuse.
    DP_RETURN_IF_ERROR(CheckBindAllowed(c.cluster.bind, c.security, "cluster.bind"));
    if (binds) DP_RETURN_IF_ERROR(CheckBindAllowed(out->bind, c.security, bind_where));
    DP_RETURN_IF_ERROR(CheckCoordinatorAllowed(coordinator.host, c.security,
                                               f.coordinator.empty() ? "cluster.coordinator" : "--coordinator"));
    if (!run_dir.empty()) DP_RETURN_IF_ERROR(EnsureRunSecret(run_dir, &out->token));
  }

  if (binds) {
    const std::string given = f.advertise.empty() ? c.cluster.advertise : f.advertise;
    const std::string from = f.advertise.empty() ? "cluster.advertise" : "--advertise";
    DP_RETURN_IF_ERROR(ResolveAdvertise(out->bind, given, from, ThisHost(), &out->advertise));
  }
  return Status::Ok();
}

}  // namespace downpour
