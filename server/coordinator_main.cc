// coordinator_main.cc — downpour-coordinator: the run's rendezvous / membership / shutdown
// endpoint as a process (thin main over Coordinator and ZmqTransport).
//
//   downpour-coordinator --config run.toml --run-dir D (--tensors list.txt | --model alexnet-shapes)
//                        [--port P] [--bind ADDR] [--advertise HOST] [--coordinator HOST:PORT]
//                        [--rejoin]
//
// --rejoin: this coordinator replaces one that died (the launcher passes it when it restarts
// the coordinator). The living servers and workers re-register by themselves within a
// heartbeat or two and membership is rebuilt from them; a worker of 0..W-1 not heard from
// within cluster.heartbeat_timeout_ms counts as dead for the end of the run (server/coordinator.h).
// Worker ids are bounded by cluster.max_workers (0 = cluster.workers); ids >= workers join.
//
// Binds tcp://<--bind or cluster.bind>:<port of --coordinator or cluster.coordinator> (or
// --port; 0 = the OS picks), writes the bound address to D/coordinator.addr, and exits 0 after a
// shutdown has been heard by every registered process (or its grace period ran out), or on
// SIGINT/SIGTERM. Keys, the loopback rule and the run secret: common/process_net.h; who may
// register and shut the run down: server/access.h. Membership events
// (registrations, dead workers, shutdown) go to D/metrics/coordinator.jsonl.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <thread>

#include "common/cli.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "common/log_limit.h"
#include "common/metrics.h"
#include "common/net_address.h"
#include "common/process_net.h"
#include "common/run_config.h"
#include "common/zmq_transport.h"
#include "server/coordinator.h"
#include "server/model_host.h"
#include "server/process_util.h"

namespace downpour {
namespace {

struct Flags {
  std::string config, run_dir, tensors, model;
  NetFlags net;  // --bind, --advertise, --coordinator (its port is the one to bind)
  int port = -1;
  bool rejoin = false;
};

// `*serving` turns true once setup (config, tensor list, layout, bind) is done: an error before
// that is a usage or config error (exit 2 for bad input), after it a runtime failure (exit 1).
Status Run(const Flags& f, bool* serving) {
  RunConfig cfg;
  DP_RETURN_IF_ERROR(LoadRunConfig(f.config, &cfg));
  // The layout hash every process is checked against: the model's, or a multi-model run's
  // combined hash of every model's.
  std::vector<ParamLayout> layouts;
  DP_RETURN_IF_ERROR(LoadRunLayouts(cfg, f.config, f.tensors, f.model, f.run_dir, &layouts));
  // Addresses, keys and the run secret, checked before anything binds.
  ProcessNet net;
  DP_RETURN_IF_ERROR(SetUpProcessNet(cfg, f.net, NetRole::kCoordinator, f.run_dir, &net));
  HostPort self;
  DP_RETURN_IF_ERROR(ParseHostPort(net.coordinator, "coordinator", &self));
  const int port = f.port >= 0 ? f.port : self.port;

  CoordinatorOptions o;
  o.cluster = cfg.cluster;
  o.rejoin = f.rejoin;
  o.evaluator = RunHasEvaluator(cfg);
  o.layout_hash = CombinedLayoutHash(layouts);
  o.shutdown_grace = std::chrono::milliseconds(4 * cfg.cluster.heartbeat_ms + 1000);
  o.cut_off_limit = std::chrono::milliseconds(cfg.cluster.server_wait_ms);  // as long as workers wait for servers
  // A gone joiner stays in the gone list this long (every process hears of it well before).
  o.gone_retention =
      std::max(std::chrono::milliseconds(60000), 10 * std::chrono::milliseconds(cfg.cluster.heartbeat_timeout_ms));
  o.access.keyed = net.keyed;
  o.access.run_secret = net.token;
  o.access.run_dir = f.run_dir;
  // Membership events go to <run-dir>/metrics/coordinator.jsonl, next to every other process's.
  const std::filesystem::path metrics_dir = std::filesystem::path(f.run_dir) / "metrics";
  std::filesystem::create_directories(metrics_dir);
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(MetricsWriter::Open((metrics_dir / "coordinator.jsonl").string(), "coordinator", 0, &metrics));
  o.on_event = [m = metrics.get()](const CoordinatorEvent& e) {
    (void)m->Write(e.kind, {{"who", e.id}, {"detail", e.detail}});
  };
  (void)metrics->Write("coordinator_start",
                       {{"servers", o.cluster.servers},
                        {"workers", o.cluster.workers},
                        {"max_workers", std::max(o.cluster.max_workers, o.cluster.workers)},
                        {"rejoin", o.rejoin},
                        {"heartbeat_timeout_ms", static_cast<int64_t>(o.cluster.heartbeat_timeout_ms)}});
  Coordinator coordinator(o);

  // A stranger can provoke these at will: logged at a bounded rate, all counted.
  auto refusals = std::make_shared<RateLimitedLog>("coordinator", "refused connections");
  net.zmq.on_refused = [refusals](const std::string& what) {
    refusals->Log(fmt::format("coordinator: refused connection: {}", what));
  };
  ProcessTransport transport(net);
  std::unique_ptr<ServerEndpoint> endpoint;
  DP_RETURN_IF_ERROR(transport.Bind(net.BindUrl(port), &endpoint));
  const std::string address = endpoint->address();
  const std::string addr_file = (std::filesystem::path(f.run_dir) / "coordinator.addr").string();
  DP_RETURN_IF_ERROR(WriteFileAtomic(addr_file, address + "\n"));
  spdlog::info("coordinator: {} servers, {} workers (ids up to {}), layout hash {:#018x}, incarnation {:#x}{}",
               o.cluster.servers, o.cluster.workers, std::max(o.cluster.max_workers, o.cluster.workers) - 1,
               o.layout_hash, coordinator.incarnation(),
               o.rejoin ? " (rejoin: rebuilding membership from the living)" : "");
  spdlog::info("coordinator: {}", net.Describe(address));

  *serving = true;
  Status serve_status;
  std::thread loop([&] { serve_status = coordinator.Serve(endpoint.get()); });
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (StopSignalArrived(std::chrono::milliseconds(100))) {
        spdlog::info("coordinator: signal, stopping");
        coordinator.Stop();
        return;
      }
    }
  });
  loop.join();
  done.store(true);
  watcher.join();
  const std::vector<int32_t> dead = coordinator.dead_workers();
  refusals->Flush();
  (void)metrics->Write("coordinator_end",
                       {{"dead_workers", static_cast<int64_t>(dead.size())},
                        {"refused_connections", static_cast<int64_t>(transport.refused_connections())},
                        {"refused_messages", static_cast<int64_t>(coordinator.refused())},
                        {"ok", serve_status.ok()}});
  return serve_status;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  downpour::BlockStopSignals();
  downpour::Flags f;
  CLI::App app{"downpour-coordinator: rendezvous, heartbeats, shutdown"};
  cli::AddStandardFlags(&app, "downpour-coordinator");
  app.add_option("-c,--config", f.config, "run config (TOML)")->required();
  app.add_option("--run-dir", f.run_dir, "run directory (address file)")->required();
  app.add_option("--tensors", f.tensors, "tensor list file: '<name> <d0>x<d1>.. [lr_mult [decay_mult]]' per line");
  app.add_option("--model", f.model, "built-in tensor list: alexnet-shapes");
  app.add_option("--port", f.port, "port to bind (default: the coordinator address's; 0 = any free port)")
      ->check(cli::Between(0, 65535));
  app.add_option("--bind", f.net.bind, "address to bind: an interface address, 0.0.0.0 or :: (default cluster.bind)");
  app.add_option("--advertise", f.net.advertise,
                 "host the others reach the coordinator at (default cluster.advertise)");
  app.add_option("--coordinator", f.net.coordinator,
                 "this coordinator's address as the others use it, host:port (default cluster.coordinator); its port "
                 "is bound");
  app.add_flag("--rejoin", f.rejoin,
               "replace a coordinator that died: rebuild membership from the processes that re-register");
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  return cli::ServeMain("downpour-coordinator", [&](bool* serving) { return downpour::Run(f, serving); });
}
