// process_net.cc — see process_net.h.
#include "common/process_net.h"

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

std::string Unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
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

Status SetUpProcessNet(const RunConfig& c, const NetFlags& f, NetRole role, const std::string& run_dir,
                       ProcessNet* out) {
  *out = ProcessNet{};
  const bool binds = Binds(role);
  out->bind = Unbracketed(f.bind.empty() ? c.cluster.bind : f.bind);
  const std::string bind_where = f.bind.empty() ? "cluster.bind" : "--bind";

  out->coordinator = f.coordinator.empty() ? c.cluster.coordinator : f.coordinator;
  HostPort coordinator;
  DP_RETURN_IF_ERROR(
      ParseHostPort(out->coordinator, f.coordinator.empty() ? "cluster.coordinator" : "--coordinator", &coordinator));

  out->zmq.connect_source = ConnectSource(c, f);
  if (!c.security.keys.empty()) {
    DP_RETURN_IF_ERROR(LoadCurveKeys(c.security.keys, ClientKeyRole(role), binds, &out->zmq.curve));
    out->keyed = true;
  } else {
    if (binds) DP_RETURN_IF_ERROR(CheckBindAllowed(out->bind, c.security, bind_where));
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
