// net_address.cc — see net_address.h.
#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

namespace downpour {
std::string_view StripBrackets(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

namespace {

bool ParsePortText(std::string_view text, int* port) {
  if (text.empty() || text.size() > 5) return false;
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0 || value > 65535) return false;
  *port = value;
  return true;
}

// Numeric text of a resolved or interface address.
std::string AddressText(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

Status ResolveWithGetaddrinfo(const std::string& name, std::vector<std::string>* addresses) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(std::string(StripBrackets(name)).c_str(), nullptr, &hints, &result);
  if (rc != 0) return NotFound("'{}' does not resolve: {}", name, gai_strerror(rc));
  addresses->clear();
  for (const addrinfo* a = result; a != nullptr; a = a->ai_next) {
    std::string text = AddressText(a->ai_addr);
    if (!text.empty() && std::find(addresses->begin(), addresses->end(), text) == addresses->end()) {
      addresses->push_back(std::move(text));
    }
  }
  freeaddrinfo(result);
  return Status::Ok();
}

std::vector<std::string> InterfaceAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    // Link-local IPv6 addresses need a scope (an interface) to be reachable: not advertisable.
    if (i->ifa_addr->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
      continue;
    }
    std::string text = AddressText(i->ifa_addr);
    if (!text.empty()) out.push_back(std::move(text));
  }
  freeifaddrs(list);
  return out;
}

static_assert(kIpcPathMax + 1 == sizeof(sockaddr_un::sun_path), "kIpcPathMax is sun_path less its NUL");

// Creates and removes a probe file in `dir`: the one test of "can this process make a socket
// file here" that holds for root as for anyone (see CheckIpcBindPath).
Status ProbeWritable(const std::string& dir, const std::string& path, std::string_view named) {
  const std::string probe = (std::filesystem::path(dir) / fmt::format(".downpour-probe-{}", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return Status::Ok();  // a probe of this pid already there: the directory takes files
    return InvalidArgument("ipc path {}{}: directory {} is not writable ({})", path, named, dir, std::strerror(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

// True when a process accepts connections on the Unix socket at `path`.
bool SomeoneListens(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const bool connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return connected;
}

}  // namespace

bool IsIpcAddress(std::string_view address) { return address.substr(0, 6) == "ipc://"; }

std::string IpcUrl(const std::string& path) { return "ipc://" + path; }

std::string IpcPath(std::string_view address) {
  return IsIpcAddress(address) ? std::string(address.substr(6)) : std::string();
}

Status CheckIpcBindPath(const std::string& path, std::string_view what) {
  const std::string named = what.empty() ? std::string() : fmt::format(" (from {})", what);
  if (path.empty()) return InvalidArgument("ipc path{}: empty (expected ipc://PATH)", named);
  if (path.size() > kIpcPathMax) {
    return InvalidArgument(
        "ipc path {}{}: {} bytes, longer than the {} a Unix socket path can hold; use a shorter directory", path,
        named, path.size(), kIpcPathMax);
  }
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : std::string(".");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return InvalidArgument("ipc path {}{}: directory {} is not writable ({})", path, named, dir, std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument("ipc path {}{}: directory {} is not writable (not a directory)", path, named, dir);
  }
  DP_RETURN_IF_ERROR(ProbeWritable(dir, path, named));
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return InvalidArgument("ipc path {}{}: exists and is not a socket (binding would delete it)", path, named);
    }
    if (SomeoneListens(path)) {
      return FailedPrecondition(
          "ipc path {}{}: a live process listens there (another server of this or another run?); stop it or "
          "choose another path",
          path, named);
    }
  }
  return Status::Ok();
}

Status ParseHostPort(std::string_view text, std::string_view what, HostPort* out) {
  constexpr std::string_view kScheme = "tcp://";
  if (text.substr(0, kScheme.size()) == kScheme) {
    const Status s = ParseHostPort(text.substr(kScheme.size()), what, out);
    if (s.ok()) return s;
    return InvalidArgument("{} = '{}': expected tcp://host:port", what, text);
  }
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("{} = '{}': expected [ipv6-address]:port", what, text);
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return InvalidArgument("{} = '{}': expected host:port", what, text);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return InvalidArgument("{} = '{}': an IPv6 address needs brackets: [{}]:{}", what, text, host, port);
    }
  }
  if (host.empty()) return InvalidArgument("{} = '{}': the host is empty (expected host:port)", what, text);
  int value = 0;
  if (!ParsePortText(port, &value)) {
    return InvalidArgument("{} = '{}': bad port '{}' (expected 0..65535)", what, text, port);
  }
  out->host = std::string(host);
  out->port = value;
  return Status::Ok();
}

std::string FormatHostPort(const std::string& host, int port) {
  const std::string_view bare = StripBrackets(host);
  if (IsIpv6Literal(bare)) return fmt::format("[{}]:{}", bare, port);
  return fmt::format("{}:{}", bare, port);
}

std::string TcpUrl(const std::string& host, int port) {
  return "tcp://" + FormatHostPort(host.empty() ? std::string("*") : host, port);
}

Status ParseTcpUrl(std::string_view url, HostPort* out) { return ParseHostPort(url, "address", out); }

bool IsIpv6Literal(std::string_view host) {
  const std::string bare(StripBrackets(host));
  in6_addr addr{};
  return inet_pton(AF_INET6, bare.c_str(), &addr) == 1;
}

bool IsWildcardAddress(std::string_view host) {
  const std::string_view bare = StripBrackets(host);
  return bare.empty() || bare == "*" || bare == "0.0.0.0" || bare == "::";
}

bool IsLoopbackLiteral(std::string_view host) {
  const std::string bare(StripBrackets(host));
  in_addr v4{};
  if (inet_pton(AF_INET, bare.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, bare.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z, an IPv4 loopback address seen through an IPv6 socket.
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

HostNetwork ThisHost() {
  HostNetwork h;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) h.hostname = name;
  h.resolve = ResolveWithGetaddrinfo;
  h.interface_addresses = InterfaceAddresses();
  return h;
}

Status ResolveAdvertise(const std::string& bind, const std::string& given, const std::string& given_from,
                        const HostNetwork& host, std::string* advertise) {
  std::vector<std::string> addresses;
  if (!given.empty()) {
    // A numeric address needs no lookup; a name must resolve now, not when a peer first uses it.
    const Status s = host.resolve(given, &addresses);
    if (!s.ok()) {
      return InvalidArgument(
          "{} = '{}': this address does not resolve ({}); give a name or address the other "
          "hosts can reach",
          given_from, given, s.message());
    }
    *advertise = std::string(StripBrackets(given));
    return Status::Ok();
  }
  if (!IsWildcardAddress(bind)) {
    *advertise = std::string(StripBrackets(bind));
    return Status::Ok();
  }
  // A wildcard bind: the host's own name, when the other hosts can use it (it resolves to an
  // address that is not loopback, as it does on a cluster's nodes; Debian maps it to 127.0.1.1
  // on a laptop), else the first interface address that is not loopback.
  if (!host.hostname.empty() && host.resolve(host.hostname, &addresses).ok() &&
      std::any_of(addresses.begin(), addresses.end(), [](const std::string& a) { return !IsLoopbackLiteral(a); })) {
    *advertise = host.hostname;
    return Status::Ok();
  }
  for (const std::string& a : host.interface_addresses) {
    if (!IsLoopbackLiteral(a)) {
      *advertise = a;
      return Status::Ok();
    }
  }
  return InvalidArgument(
      "binding {} (every interface) but this host has no address other hosts could reach: its name '{}' does not "
      "resolve to a non-loopback address and no interface has one; set cluster.advertise or --advertise",
      bind, host.hostname);
}

Status CheckTcpBindPort(const std::string& host, int port, std::string_view what) {
  const std::string node(IsWildcardAddress(host) ? std::string_view() : StripBrackets(host));
  addrinfo hints{};
  // A wildcard binds one family, as ZeroMQ's listener does: "::" IPv6, the others IPv4.
  hints.ai_family = !node.empty() ? AF_UNSPEC : IsIpv6Literal(StripBrackets(host)) ? AF_INET6 : AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(node.empty() ? nullptr : node.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) return InvalidArgument("{}: cannot bind {}: {}", what, FormatHostPort(host, port), gai_strerror(gai));
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    err = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    ::close(fd);
    if (err == 0 || err == EADDRINUSE) break;
  }
  ::freeaddrinfo(res);
  if (err == EADDRINUSE) {
    return FailedPrecondition("{}: port {} on {} is in use (another job, or a process still running from an "
                              "earlier one); choose a free port",
                              what, port, IsWildcardAddress(host) ? "every interface" : host);
  }
  if (err == EADDRNOTAVAIL) {
    return InvalidArgument("{}: cannot bind {}: {} is not an address of this host", what, FormatHostPort(host, port),
                           host);
  }
  return Status::Ok();  // other errors (EACCES for a low port, ...) are the child's to report
}

}  // namespace downpour
