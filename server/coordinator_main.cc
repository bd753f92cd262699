// coordinator_main.cc — downpour-coordinator: the run's rendezvous / membership / shutdown
// endpoint as a process (thin main over Coordinator and ZmqTransport).
//
//   downpour-coordinator --config run.toml --run-dir D (--tensors list.txt | --model alexnet-shapes)
//                        [--port P]
//
// Binds tcp://<cluster.bind>:<port of cluster.coordinator> (or --port; 0 = the OS picks), writes
// the bound address to D/coordinator.addr, and exits 0 after a shutdown has been heard by every
// registered process (or its grace period ran out), or on SIGINT/SIGTERM. Membership events
// (registrations, dead workers, shutdown) go to D/metrics/coordinator.jsonl.
#include <filesystem>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/cli.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/run_config.h"
#include "common/zmq_transport.h"
#include "server/coordinator.h"
#include "server/process_util.h"

namespace downpour {
namespace {

struct Flags {
  std::string config, run_dir, tensors, model;
  int port = -1;
};

// `*serving` turns true once setup (config, tensor list, layout, bind) is done: an error before
// that is a usage or config error (exit 2 for bad input), after it a runtime failure (exit 1).
Status Run(const Flags& f, bool* serving) {
  RunConfig cfg;
  DP_RETURN_IF_ERROR(LoadRunConfig(f.config, &cfg));
  std::vector<TensorSpec> specs;
  DP_RETURN_IF_ERROR(ResolveTensorList(f.tensors, f.model, &specs));
  ParamLayout layout;
  DP_RETURN_IF_ERROR(ParamLayout::Build(specs, cfg.cluster.servers, cfg.cluster.chunk_elems, &layout));
  int port = f.port;
  if (port < 0) DP_RETURN_IF_ERROR(ParsePort(cfg.cluster.coordinator, "cluster.coordinator", &port, nullptr));

  CoordinatorOptions o;
  o.servers = cfg.cluster.servers;
  o.workers = cfg.cluster.workers;
  o.layout_hash = layout.hash();
  o.heartbeat_timeout = std::chrono::milliseconds(cfg.cluster.heartbeat_timeout_ms);
  o.shutdown_grace = std::chrono::milliseconds(4 * cfg.cluster.heartbeat_ms + 1000);
  // Membership events go to <run-dir>/metrics/coordinator.jsonl, next to every other process's.
  const std::filesystem::path metrics_dir = std::filesystem::path(f.run_dir) / "metrics";
  std::filesystem::create_directories(metrics_dir);
  std::unique_ptr<MetricsWriter> metrics;
  DP_RETURN_IF_ERROR(MetricsWriter::Open((metrics_dir / "coordinator.jsonl").string(), "coordinator", 0, &metrics));
  o.on_event = [m = metrics.get()](const CoordinatorEvent& e) {
    (void)m->Write(e.kind, {{"who", e.id}, {"detail", e.detail}});
  };
  (void)metrics->Write("coordinator_start", {{"servers", o.servers},
                                             {"workers", o.workers},
                                             {"heartbeat_timeout_ms", static_cast<int64_t>(o.heartbeat_timeout.count())}});
  Coordinator coordinator(o);

  ZmqTransport transport;
  std::unique_ptr<ServerEndpoint> endpoint;
  DP_RETURN_IF_ERROR(transport.Bind(fmt::format("tcp://{}:{}", cfg.cluster.bind, port), &endpoint));
  const std::string address = endpoint->address();
  const std::string addr_file = (std::filesystem::path(f.run_dir) / "coordinator.addr").string();
  DP_RETURN_IF_ERROR(WriteFileAtomic(addr_file, address + "\n"));
  spdlog::info("coordinator: {} servers, {} workers, layout hash {:#018x}, listening on {}", o.servers,
               o.workers, o.layout_hash, address);

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
  (void)metrics->Write("coordinator_end", {{"dead_workers", static_cast<int64_t>(dead.size())}, {"ok", serve_status.ok()}});
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
  app.add_option("--port", f.port, "port to bind (default: cluster.coordinator's; 0 = any free port)")
      ->check(cli::Between(0, 65535));
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  return cli::Main("downpour-coordinator", [&] {
    bool serving = false;
    const downpour::Status s = downpour::Run(f, &serving);
    if (s.ok()) return cli::kExitOk;
    spdlog::error("downpour-coordinator: {}", s.ToString());
    return serving ? cli::kExitFailure : cli::SetupExitCode(s);
  });
}
