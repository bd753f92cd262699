// config/cluster.h — [cluster]: the processes and endpoints of one job, and the largest accepted values.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/config/table.h"
#include "common/status.h"

namespace downpour {

// Largest accepted values: a typo is refused rather than started.
inline constexpr int kMaxServerThreads = 64;            // cluster.server_threads
inline constexpr int kMaxIoThreads = 16;                // cluster.io_threads
inline constexpr int kMaxConnectionsPerServer = 8;      // cluster.connections_per_server
inline constexpr int kMaxInflightMb = 4096;             // cluster.inflight_mb
inline constexpr int64_t kMaxTraceEvents = 10'000'000;  // cluster.trace_events

// host:port with a non-empty host and a port in 1..65535.
bool IsHostPort(const std::string& s);

// How a job's servers are reached (cluster.transport).
enum class ClusterTransport {
  kTcp,  // tcp://<bind>:<base_port + i> (the coordinator always uses tcp)
  kIpc,  // ipc://<ipc_dir>/server-<i>.sock: Unix domain sockets, every process on one host
};
inline constexpr std::string_view kClusterTransportNames[] = {"tcp", "ipc"};
const char* ClusterTransportName(ClusterTransport transport);  // "tcp" | "ipc"

// In what order a server's replies take its emulated link (cluster.reply_order).
enum class ReplyOrder {
  kArrival,  // as the server made them: workers asking at once get theirs interleaved
  kStep,     // a worker's pull replies for one step together, the step asked for first ahead
};
inline constexpr std::string_view kReplyOrderNames[] = {"arrival", "step"};
const char* ReplyOrderName(ReplyOrder order);  // "arrival" | "step"

// In what order a worker's waiting request parts leave for a server (cluster.send_order).
enum class SendOrder {
  kCall,   // as the requests were made
  kLayer,  // the lowest layout position first (the order a forward reads them), each chunk's own
           // requests still in call order
};
inline constexpr std::string_view kSendOrderNames[] = {"call", "layer"};
const char* SendOrderName(SendOrder order);  // "call" | "layer"

// [cluster] — processes and endpoints of one job. Restarts: docs/operations.md "When a process
// dies"; chunk_elems and advertise: docs/config.md; ipc: docs/operations.md "One host: ipc".
struct ClusterConfig {
  int servers = 1;
  int workers = 1;
  std::string coordinator = "127.0.0.1:5555";
  int base_port = 5600;
  std::string bind = "127.0.0.1";
  std::string advertise = "";
  int heartbeat_ms = 500;
  int heartbeat_timeout_ms = 5000;
  int64_t chunk_elems = int64_t{1} << 20;
  int server_restarts = 3;
  int coordinator_restarts = 3;
  int restart_workers = 0;
  int server_wait_ms = 120000;
  int max_workers = 0;
  int peer_queue_mb = 256;
  int server_threads = 1;
  int io_threads = 2;
  int connections_per_server = 1;
  ClusterTransport transport = ClusterTransport::kTcp;
  std::string ipc_dir = "";
  bool shared_memory = true;
  double link_gbps = 0;
  ReplyOrder reply_order = ReplyOrder::kArrival;
  SendOrder send_order = SendOrder::kCall;
  int inflight_mb = 128;
  int64_t trace_events = 0;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("servers", s.servers, AtLeast(1), "S parameter-server shards");
    v.Key("workers", s.workers, AtLeast(1), "W workers");
    v.Key("coordinator", s.coordinator, Must<std::string>(IsHostPort, "expected host:port with port in 1..65535"),
          "host:port of the coordinator's endpoint");
    v.Key("base_port", s.base_port, "server i listens on base_port + i");
    v.Key("bind", s.bind, NonEmpty("must name an interface address"),
          "address servers and coordinator bind; loopback unless told otherwise");
    v.Key("advertise", s.advertise, "address others reach this host's endpoints at; \"\" = derived");
    v.Key("heartbeat_ms", s.heartbeat_ms, Must<int>([](int x) { return x > 0; }, "must be > 0"),
          "interval between heartbeats");
    v.Key("heartbeat_timeout_ms", s.heartbeat_timeout_ms, "a peer silent this long is declared dead");
    v.Key("chunk_elems", s.chunk_elems, AtLeast<int64_t>(1), "floats per layout chunk, one payload frame");
    v.Key("server_restarts", s.server_restarts, AtLeast(0),
          "restarts of a dead server over the job; one more death fails it");
    v.Key("coordinator_restarts", s.coordinator_restarts, AtLeast(0),
          "restarts of a dead coordinator over the job; one more death fails it");
    v.Key("restart_workers", s.restart_workers, AtLeast(0),
          "restarts (--resume) of a dead worker; 0 = the job goes on without it");
    v.Key("server_wait_ms", s.server_wait_ms, "how long a worker waits for a server that answers nothing");
    v.Key("max_workers", s.max_workers, Must<int>([](int x) { return x <= 65536; }, "must be <= 65536"),
          "worker ids accepted: 0..max_workers-1, ids >= workers joining a running job; 0 = workers");
    v.Key("peer_queue_mb", s.peer_queue_mb, AtLeast(1),
          "MiB of replies a server queues for a peer that does not read; past it the peer is dropped");
    v.Key("server_threads", s.server_threads, InRange(1, kMaxServerThreads),
          "apply lanes of each server shard: threads owning its chunks' updates");
    v.Key("io_threads", s.io_threads, InRange(1, kMaxIoThreads), "ZeroMQ I/O threads of each process's transport");
    v.Key("connections_per_server", s.connections_per_server, InRange(1, kMaxConnectionsPerServer),
          "connections each worker opens to each server, its chunks dealt over them");
    v.Key("inflight_mb", s.inflight_mb, InRange(1, kMaxInflightMb),
          "MiB of payload a worker keeps sent and unanswered on each connection to a server, each way");
    v.Named("send_order", s.send_order, Names{kSendOrderNames},
            "order in which a worker's waiting request parts leave: as made, or by layer");
    v.Key("trace_events", s.trace_events, InRange<int64_t>(0, kMaxTraceEvents, "0 = off"),
          "trace events each server and worker keeps (docs/operations.md \"Timelines\"); 0 = off");
    v.Named("transport", s.transport, Names{kClusterTransportNames}, "how workers reach the servers");
    v.Key("ipc_dir", s.ipc_dir, "ipc: directory of the servers' sockets; \"\" = the run directory");
    v.Key("shared_memory", s.shared_memory, "same-host payloads through shared memory instead of the socket");
    v.Named("reply_order", s.reply_order, Names{kReplyOrderNames},
            "order of a server's replies on an emulated link (docs/emulated_links.md)");
    v.Optional("link_gbps", s.link_gbps,
               Must<double>([](double x) { return std::isfinite(x) && x > 0; },
                            "must be a finite link speed > 0 in Gbit/s (leave it out for no emulated link)"),
               "emulated link: every process's egress paced to this many Gbit/s; absent = off");
  }
  bool operator==(const ClusterConfig&) const = default;
};

// Server `server`'s ipc socket file: <ipc_dir>/server-<i>.sock, resolved against `run_dir`.
std::string ServerIpcPath(const ClusterConfig& cluster, const std::string& run_dir, int server);
// The address server `server` binds: ipc://ServerIpcPath(...), or tcp://<bind>:<base_port +
// server> (a wildcard bind as 127.0.0.1).
std::string ServerAddress(const ClusterConfig& cluster, const std::string& run_dir, int server);
// Ok if every server's ipc socket path fits in sun_path (and for tcp); else InvalidArgument
// naming cluster.ipc_dir, the path and its length.
Status CheckIpcPathLengths(const ClusterConfig& cluster, const std::string& run_dir);

}  // namespace downpour
