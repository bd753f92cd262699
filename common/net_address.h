// net_address.h — host:port text and the address a process advertises to its peers.
//
//   * "host:port" and "[v6]:port" split and formatted (an IPv6 literal is always bracketed when
//     a port follows it), and tcp:// URLs as ZeroMQ takes them ("tcp://[::1]:5601").
//   * Which host others reach this process at (cluster.advertise / --advertise, docs/cluster.md):
//     a bind to one specific address advertises that address; a wildcard bind ("0.0.0.0", "*",
//     "::") advertises this host's name when it resolves to a non-loopback address, else the
//     first non-loopback interface address, else it is an error that says to set
//     cluster.advertise / --advertise. A name given explicitly must resolve; it is used as given
//     (an operator may advertise a loopback name on purpose, as a one-machine Slurm does).
//
//   * ipc:// addresses (Unix domain sockets, processes on one host): "ipc://PATH" made and
//     recognised, and the checks a PATH must pass before a bind (CheckIpcBindPath).
//
// The host's view (its name, name resolution, interface addresses) is a HostNetwork, so tests
// inject their own; ThisHost() is the real one.
//
// Thread-safety: reentrant free functions; HostNetwork is a value (its functions must be
// reentrant, as getaddrinfo and getifaddrs are).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;      // 0..65535
};

// Parses "host:port" or "[v6addr]:port" (or either behind "tcp://", as a coordinator address may
// be written: common/rendezvous.h). An unbracketed IPv6 address is refused (its last
// colon is ambiguous). `what` names the flag or field in errors ("--coordinator",
// "cluster.coordinator"), which quote the text.
Status ParseHostPort(std::string_view text, std::string_view what, HostPort* out);
// "n1:5555", "[::1]:5555".
std::string FormatHostPort(const std::string& host, int port);
// "tcp://n1:5555", "tcp://[::1]:5555", "tcp://*:5555" (a host of "*" or "" = every interface).
std::string TcpUrl(const std::string& host, int port);
// "tcp://host:port" (or a bare "host:port") → host and port.
Status ParseTcpUrl(std::string_view url, HostPort* out);

// ---- ipc:// (Unix domain sockets; ZeroMQ's ipc transport) ----
// The longest socket path a Unix domain socket takes: sizeof(sockaddr_un::sun_path) - 1 on
// Linux (107 bytes; the last byte is the terminating NUL).
inline constexpr size_t kIpcPathMax = 107;
// True for "ipc://...".
bool IsIpcAddress(std::string_view address);
// "ipc://" + path.
std::string IpcUrl(const std::string& path);
// The PATH of "ipc://PATH" ("" for any other address).
std::string IpcPath(std::string_view address);
// What a bind at "ipc://PATH" needs, checked before ZeroMQ sees it (ZeroMQ would unlink
// whatever is at PATH, and its own errors do not say which of these went wrong). Errors
// (InvalidArgument, "ipc path PATH: ..." with `what` — the flag or key that gave the path, ""
// for none — named after it):
//   * PATH empty, or longer than kIpcPathMax bytes (it would not fit in sun_path);
//   * PATH's directory missing, not a directory, or not writable: tested by creating and
//     removing a probe file in it, so it is exact for root too (root passes permission checks
//     but cannot create files on a read-only mount or in /proc);
//   * something at PATH that is not a socket (a regular file ZeroMQ would delete);
// and FailedPrecondition when a live process listens at PATH (a connect succeeds): a second server
// must not silently steal a running server's path. A socket file nobody listens on (left by a
// process that was killed) passes: ZeroMQ replaces it on bind. (The probe connect is seen by the
// live server as a peer that closed at once: with CurveZMQ it counts one refused connection.)
// Check-then-bind is not atomic: two binds racing for one fresh path can both pass; the launcher
// gives each server its own path.
Status CheckIpcBindPath(const std::string& path, std::string_view what);

// ---- tcp:// ----
// Whether a listener could bind `host`:`port` now (host as cluster.bind takes it: an address, a
// name, or a wildcard), checked before a job starts so a port in use is one clear error instead of
// a child that fails to bind. Binds and closes a socket with SO_REUSEADDR, as ZeroMQ's listener
// does, so a port held only by TIME_WAIT connections passes. FailedPrecondition naming `what`
// (the key or flag that gave the port) when the port is in use; InvalidArgument when `host` does
// not resolve or is not this host's. Check-then-bind is not atomic: a process may take the port
// after the check.
Status CheckTcpBindPort(const std::string& host, int port, std::string_view what);

// "[::1]" -> "::1"; anything else unchanged.
std::string_view StripBrackets(std::string_view host);
// True for an IPv6 literal ("::1", "fe80::1", "[::1]").
bool IsIpv6Literal(std::string_view host);
// True for the addresses that mean every interface: "0.0.0.0", "*", "::", "[::]", "".
bool IsWildcardAddress(std::string_view host);
// True for a numeric loopback address: 127.0.0.0/8 and ::1 (names are not resolved here).
bool IsLoopbackLiteral(std::string_view host);

// What a process knows about the machine it runs on.
struct HostNetwork {
  std::string hostname;  // gethostname()
  // Every address `name` resolves to (numeric text); an error names `name` and why.
  std::function<Status(const std::string& name, std::vector<std::string>* addresses)> resolve;
  std::vector<std::string> interface_addresses;  // every address of every interface that is up
};
// The real host: gethostname, getaddrinfo, getifaddrs.
HostNetwork ThisHost();

// The host this process advertises. `given` is an explicit choice ("" = none) and
// `given_from` names where it came from for errors ("--advertise", "cluster.advertise",
// "SLURMD_NODENAME"). Errors: a given name that does not resolve, or a wildcard bind where
// nothing non-loopback can be found.
Status ResolveAdvertise(const std::string& bind, const std::string& given, const std::string& given_from,
                        const HostNetwork& host, std::string* advertise);

}  // namespace downpour
