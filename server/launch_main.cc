// launch_main.cc — downpour-launch: runs one training job, on this machine or as one task of a
// job spread over a cluster.
//
//   downpour-launch --config configs/runs/default.toml [--set section.key=value]...
//                   [--servers S] [--workers W] [--run-dir D] [--weights FILE]
//                   [--tensors FILE | --model NAME]
//                   [--worker-cmd CMD] [--server-cmd CMD] [--coordinator-cmd CMD]
//                   [--restart-workers N] [--grace-ms 5000] [--timeout-s 0] [--bin-dir DIR] [--dry-run]
//   downpour-launch --resume D [--restart-workers N] [--timeout-s 0] [--grace-ms 5000] [--bin-dir DIR]
//   downpour-launch --config X (--slurm | --mpi | --role R [--id I] --coordinator HOST:PORT)
//                   [--bind ADDR] [--advertise HOST] [--run-dir D] [the options above]
//
// Cluster mode (--slurm, --mpi, --role; docs/cluster.md): each task runs exactly one role as its
// single child, chosen from the resource manager's environment or the flags
// (server/cluster_env.h: rank 0 the coordinator, 1..S the servers, then the workers; the task
// count must be S+W+1), and says first where its role came from (the coordinator's task also
// runs the run's evaluator, downpour-evaluator, as a second child when the run has one):
//   [launch] slurm task 3/6 (SLURM_PROCID=3 of SLURM_NTASKS=6) on n2: server 2
// The child gets --coordinator HOST:PORT (and --bind / --advertise) on top of the usual
// arguments. Every task checks before it starts anything — the task count, the node list, the
// key files, that the bind is allowed, that the advertise host resolves — and exits 2 with one
// line naming what is wrong. All tasks use one run directory name: --run-dir, else
// <run.out_dir>/<run.name>-<job id> from SLURM_JOB_ID.SLURM_STEP_ID or the MPI job's id; each
// writes its own part of it (on a shared file system or not):
//   D/config.toml               identical in every task (a task whose config differs is refused)
//   D/logs/<role>[-<i>].log     its child's output
//   D/launch-<role>[-<i>].jsonl its own launcher metrics (with its child's died/restart lines)
//   D/tensors-<role>[-<i>].txt  the tensor list it made for its coordinator or server
// and refuses to start only when its own files are already there. The run ends when every
// worker is done and the evaluator has made the final evaluation: the coordinator then tells the
// servers, and every task's child exits. A
// task's child is supervised as its role is on one machine (below); a worker task whose worker
// the job goes on without exits 0, so the resource manager does not stop the job for it.
//
// Reads the run config, applies the overrides, checks before starting anything that the run
// directory is new (a directory holding a run is refused: --resume it) and that every input
// the config names exists (server/run_dir.h), creates the run directory
//   D/config.toml            the config used (every field explicit; children read this one)
//   D/logs/<role>-<i>.log    each child's stdout+stderr (appended to on resume)
//   D/launch.jsonl           the launcher's metrics: "start", "died" / "restart" / "given_up"
//                            per supervision event, one "exit" line per child, "end"
// and starts downpour-coordinator, S × downpour-server --id i, W × downpour-worker --id j and,
// when the run has one (eval.evaluator and a data.test; common/run_config.h RunHasEvaluator),
// downpour-evaluator, each with --config D/config.toml --run-dir D (servers and the
// coordinator also get --tensors/--model). A --worker-cmd stand-in run has no evaluator. With neither (and no --worker-cmd), the tensor list comes from the model
// config itself: `downpour-worker --config D/config.toml --write-tensors D/tensors.txt` runs
// first (servers never parse a net; the worker owns that) and D/tensors.txt is passed on.
// --weights FILE starts from saved weights (model.weights, a tensor file or a .caffemodel) and
// evaluates them before the first step (eval.at_start).
//
// --resume D continues a stopped or crashed run with D's own config.toml: servers restart with
// --recover (their latest checkpoint D/<checkpoint.dir>/server-<i>.dpt, then their write-ahead
// log), workers with --resume (their progress in D/state/), and logs and metrics are appended
// to. A finished run, or one in which a server saved neither a checkpoint nor a log, is refused
// (server/run_dir.h PlanResume).
//
// Binaries are found in --bin-dir, else next to this executable, else in the build tree
// (build/server/, build/client/worker/).
// A --*-cmd override replaces a role's program with a shell command that receives the same
// arguments: /bin/sh -c 'exec CMD "$@"' ... (the load benchmark's synthetic workers).
//
// cluster.transport = "ipc" (one host): the servers bind ipc://<cluster.ipc_dir, default D>/server-<i>.sock.
// Checked before any child starts: every socket path fits in 107 bytes (else one error naming
// cluster.ipc_dir), the directory takes files, no live server listens at a path, and in cluster
// mode the job runs on one host (server/cluster_env.h CheckOneHost). RunConfigWarnings
// (common/run_config.h, e.g. a cluster.chunk_elems that makes frames >= 32 MiB) are printed to
// stderr as "[launch] warning: ..." lines; they do not stop the job.
//
// Before any child starts, the launcher checks the network setup every child will make
// (common/process_net.h: keys, the loopback rule, advertise hosts) and, without keys, creates
// the run's secret D/secret (mode 0600) that its children put on register and admin messages.
//
// Supervision (docs/operations.md "When a process dies"; common/process_group.h): a dead server
// is restarted with --recover up to cluster.server_restarts times, a dead coordinator with
// --rejoin up to cluster.coordinator_restarts times (one more death of either fails the job
// with its exit code); a dead worker is restarted with --resume up to --restart-workers /
// cluster.restart_workers times, then the job goes on without it — except worker 0 in a run
// without an evaluator process, which makes the final evaluation: it is restarted at least
// once, and its death with no restart left fails the job. A dead evaluator is restarted as
// often as a worker, at least once; one more death fails the job. Each death and restart is
// one "[launch] ..." line and one launch.jsonl record. The job ends when no worker (nor the
// evaluator) runs or waits for a restart: exit 0 if at least one exited 0 (then coordinator
// and servers get SIGTERM); or on a death that fails it, on
// SIGINT/SIGTERM, or at --timeout-s. Errors before any process starts exit 2 (usage, config or
// input) — common/cli.h.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/file_io.h"
#include "common/metrics.h"
#include "common/net_address.h"
#include "common/process_group.h"
#include "common/process_net.h"
#include "common/run_config.h"
#include "common/rotation.h"
#include "common/run_secret.h"
#include "common/status.h"
#include "data/input_check.h"
#include "server/cluster_env.h"
#include "server/run_dir.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
namespace cli = downpour::cli;

struct LaunchFlags {
  std::string config;
  std::vector<std::string> sets;  // --set section.key=value
  int servers = 0;  // 0 = from the config
  int workers = 0;  // 0 = from the config
  std::string run_dir;
  std::string resume;   // run directory to continue
  std::string weights;  // initial weights (model.weights) + eval.at_start
  std::string tensors, model;
  std::string worker_cmd, server_cmd, coordinator_cmd;
  std::string bin_dir;
  int grace_ms = 5000;
  double timeout_s = 0;
  int restart_workers = -1;  // --restart-workers; -1 = cluster.restart_workers
  bool dry_run = false;
  // Cluster mode: one task of a job spread over hosts.
  bool slurm = false;
  bool mpi = false;
  std::string role;  // by hand: coordinator | server | worker
  int id = -1;       // by hand: server or worker id
  NetFlags net;      // --bind, --advertise, --coordinator (passed on to the child)
  bool cluster() const { return slurm || mpi || !role.empty(); }
};

// <out_dir>/<name>-<YYYYmmdd-HHMMSS>, local time.
std::string DefaultRunDir(const RunConfig& cfg) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return (fs::path(cfg.run.out_dir) / fmt::format("{}-{}", cfg.run.name, stamp)).string();
}

std::string ExecutableDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// Where `program` is: in --bin-dir when given; else next to this executable (an install or a
// folder of links), else where the build tree puts it (this is build/server/downpour-launch,
// the worker is build/client/worker/downpour-worker). Returns the first candidate if none exists.
fs::path FindProgram(const LaunchFlags& f, const std::string& program) {
  if (!f.bin_dir.empty()) return fs::path(f.bin_dir) / program;
  const fs::path here = ExecutableDir();
  const fs::path candidates[] = {here / program, here.parent_path() / "server" / program,
                                 here.parent_path() / "client" / "worker" / program};
  for (const fs::path& p : candidates) {
    if (fs::exists(p)) return p;
  }
  return candidates[0];
}

// argv for one role: the built program, or the shell override with the same arguments.
Status RoleArgv(const LaunchFlags& f, const std::string& program, const std::string& override_cmd,
                const std::string& override_flag, const std::vector<std::string>& args,
                std::vector<std::string>* argv) {
  argv->clear();
  if (!override_cmd.empty()) {
    *argv = {"/bin/sh", "-c", fmt::format("exec {} \"$@\"", override_cmd), program};
  } else {
    const fs::path bin = FindProgram(f, program);
    if (!fs::exists(bin)) {
      return NotFound("{} not found (looked in {}); build target {} or pass {}",
                      program, bin.parent_path().string(), program, override_flag);
    }
    argv->push_back(bin.string());
  }
  argv->insert(argv->end(), args.begin(), args.end());
  return Status::Ok();
}

// ---- supervision: what happens when a process dies (docs/operations.md "When a process dies") ----

// `argv` with `flag` appended unless it is there already (a resumed run's children have it).
std::vector<std::string> WithFlag(std::vector<std::string> argv, const std::string& flag) {
  if (std::find(argv.begin(), argv.end(), flag) == argv.end()) argv.push_back(flag);
  return argv;
}

// A dead server is restarted with --recover (its latest checkpoint, then its write-ahead log;
// never the --restore file of the first start, which would lose what came after it), at most
// cluster.server_restarts times; one more death fails the job.
void SuperviseServer(const RunConfig& cfg, ChildSpec* c) {
  std::vector<std::string> argv;
  for (size_t k = 0; k < c->argv.size(); ++k) {
    if (c->argv[k] == "--restore" && k + 1 < c->argv.size()) {
      ++k;
      continue;
    }
    argv.push_back(c->argv[k]);
  }
  c->restart_argv = WithFlag(std::move(argv), "--recover");
  c->max_restarts = cfg.cluster.server_restarts;
  c->on_death = OnDeath::kFail;
  c->restart_note = "with --recover";
  c->limit = fmt::format("cluster.server_restarts = {}", cfg.cluster.server_restarts);
}

// A dead coordinator is restarted with --rejoin (it rebuilds membership from the heartbeats of
// the living), at most cluster.coordinator_restarts times; one more death fails the job.
void SuperviseCoordinator(const RunConfig& cfg, ChildSpec* c) {
  c->restart_argv = WithFlag(c->argv, "--rejoin");
  c->max_restarts = cfg.cluster.coordinator_restarts;
  c->on_death = OnDeath::kFail;
  c->restart_note = "with --rejoin";
  c->limit = fmt::format("cluster.coordinator_restarts = {}", cfg.cluster.coordinator_restarts);
  c->ends_run = true;  // it exits 0 only once it has ended the run
}

// A dead worker is restarted with --resume (from its saved progress) up to --restart-workers /
// cluster.restart_workers times, then the job goes on without it. Worker 0 evaluates and saves
// the model, so it is restarted at least once whatever that setting says, and when it dies with
// no restart left the job fails (continue it later with downpour-launch --resume).
void SuperviseWorker(const LaunchFlags& f, const RunConfig& cfg, int id, ChildSpec* c) {
  const bool evaluates = id == 0 && !RunHasEvaluator(cfg);
  const int allowed = f.restart_workers >= 0 ? f.restart_workers : cfg.cluster.restart_workers;
  const std::string setting = f.restart_workers >= 0 ? fmt::format("--restart-workers {}", allowed)
                                                     : fmt::format("cluster.restart_workers = {}", allowed);
  c->restart_argv = WithFlag(c->argv, "--resume");
  c->restart_note = "with --resume";
  c->max_restarts = allowed;
  c->on_death = OnDeath::kContinue;
  c->limit = setting;
  if (evaluates) {
    c->on_death = OnDeath::kFail;
    if (allowed < 1) {
      c->max_restarts = 1;
      c->restart_note = "with --resume, as worker 0 makes the final evaluation";
      c->limit = fmt::format("1 for worker 0, which makes the final evaluation; {}", setting);
    }
  }
}

// The evaluator makes the run's final evaluation and saves its model: a dead one is restarted (it
// starts over: evaluations are of the servers' weights, so nothing of it is lost) as often as a
// worker would be, at least once; one more death fails the job.
void SuperviseEvaluator(const LaunchFlags& f, const RunConfig& cfg, ChildSpec* c) {
  const int allowed = f.restart_workers >= 0 ? f.restart_workers : cfg.cluster.restart_workers;
  c->restart_argv = c->argv;
  c->restart_note = "";
  c->max_restarts = std::max(1, allowed);
  c->on_death = OnDeath::kFail;
  c->limit = fmt::format("at least 1 for the evaluator, which makes the final evaluation; {}",
                         f.restart_workers >= 0 ? fmt::format("--restart-workers {}", allowed)
                                                : fmt::format("cluster.restart_workers = {}", allowed));
}

// The evaluator's child, with `extra` arguments (cluster mode: --coordinator, --bind).
Status BuildEvaluatorChild(const LaunchFlags& f, const RunConfig& cfg, const std::string& run_dir,
                           const std::vector<std::string>& extra, ChildSpec* e) {
  std::vector<std::string> args = {"--config", (fs::path(run_dir) / "config.toml").string(), "--run-dir", run_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-evaluator", "", "--set eval.evaluator=false", args, &e->argv));
  e->name = "evaluator";
  e->log_path = (fs::path(run_dir) / "logs" / "evaluator.log").string();
  e->primary = true;  // the job is done when the workers and the final evaluation are
  e->follower = true;  // ... and cannot finish once every worker is given up with none done
  SuperviseEvaluator(f, cfg, e);
  return Status::Ok();
}

// `resume` (may be null): servers recover from their checkpoints and logs, workers continue.
Status BuildChildren(const LaunchFlags& f, const RunConfig& cfg, const std::string& run_dir, const ResumePlan* resume,
                     std::vector<ChildSpec>* children) {
  const std::string config_path = (fs::path(run_dir) / "config.toml").string();
  const std::string logs = (fs::path(run_dir) / "logs").string();
  std::vector<std::string> model_args;  // none for a multi-model run: D/tensors-model-<k>.txt
  if (!f.tensors.empty() && cfg.models.empty()) model_args = {"--tensors", fs::absolute(f.tensors).string()};
  if (!f.model.empty()) model_args = {"--model", f.model};

  ChildSpec c;
  std::vector<std::string> args = {"--config", config_path, "--run-dir", run_dir};
  args.insert(args.end(), model_args.begin(), model_args.end());
  DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-coordinator", f.coordinator_cmd, "--coordinator-cmd",
                              args, &c.argv));
  c.name = "coordinator";
  c.log_path = logs + "/coordinator.log";
  SuperviseCoordinator(cfg, &c);
  children->push_back(c);

  for (int i = 0; i < cfg.cluster.servers; ++i) {
    ChildSpec s;
    args = {"--id", std::to_string(i), "--config", config_path, "--run-dir", run_dir};
    args.insert(args.end(), model_args.begin(), model_args.end());
    if (resume != nullptr) args.push_back("--recover");
    DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-server", f.server_cmd, "--server-cmd", args, &s.argv));
    s.name = fmt::format("server {}", i);
    s.log_path = fmt::format("{}/server-{}.log", logs, i);
    SuperviseServer(cfg, &s);
    children->push_back(s);
  }
  for (int j = 0; j < cfg.cluster.workers; ++j) {
    ChildSpec w;
    args = {"--id", std::to_string(j), "--config", config_path, "--run-dir", run_dir};
    if (resume != nullptr) args.push_back("--resume");
    DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-worker", f.worker_cmd, "--worker-cmd", args, &w.argv));
    w.name = fmt::format("worker {}", j);
    w.log_path = fmt::format("{}/worker-{}.log", logs, j);
    w.primary = true;
    SuperviseWorker(f, cfg, j, &w);
    children->push_back(w);
  }
  if (RunHasEvaluator(cfg)) {
    ChildSpec e;
    DP_RETURN_IF_ERROR(BuildEvaluatorChild(f, cfg, run_dir, {}, &e));
    children->push_back(e);
  }
  return Status::Ok();
}

// Runs `downpour-worker --config <config> --write-tensors <out>` (the model's tensor list from
// its net config) as a one-child job and waits for it; its output goes to <log>, and to stderr
// prefixed "[tensors] " (where its error, naming the bad file, is seen).
Status WriteTensorListWithWorker(const LaunchFlags& f, const std::string& config, const std::string& out,
                                 const std::string& log, int* stop_code) {
  const fs::path bin = FindProgram(f, "downpour-worker");
  if (!fs::exists(bin)) {
    return NotFound("downpour-worker not found (looked in {}); it writes the model's tensor list when "
                    "neither --tensors nor --model is given", bin.parent_path().string());
  }
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  options.output = [](std::string_view line) { std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data()); };
  ProcessGroup group(options);
  ChildSpec child;
  child.name = "tensors";
  child.argv = {bin.string(), "--config", config, "--write-tensors", out};
  child.log_path = log;
  child.primary = true;
  DP_RETURN_IF_ERROR(group.Start(child));
  const int code = group.Run();
  if (code != 0 && group.reason().starts_with("received signal")) {
    // Stopped from outside (Ctrl-C, srun tearing the job down): not a problem of the config.
    *stop_code = code;
    return Unavailable("stopped while getting the model's tensor list: {}", group.reason());
  }
  if (code != 0) {
    return InvalidArgument("cannot get the model's tensor list from {} (downpour-worker --write-tensors exited {}; "
                           "its output is above and in {})", config, code, log);
  }
  return Status::Ok();
}

// A run named after its consistency mode ("fmnist-async") whose mode --set changed, and not its
// name, is named after the mode it runs ("fmnist-sync"), so its directory and reports do not say
// the other one. Returns whether it renamed.
bool NameAfterSetMode(const LaunchFlags& f, RunConfig* cfg) {
  auto set = [&](std::string_view key) {
    return std::any_of(f.sets.begin(), f.sets.end(), [&](const std::string& s) { return s.rfind(key, 0) == 0; });
  };
  if (!set("consistency.mode=") || set("run.name=")) return false;
  std::string mode = ConsistencyModeString(cfg->consistency);  // "async", "sync", "ssp:2"
  mode = mode.substr(0, mode.find(':'));
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t dash = cfg->run.name.find('-', at);
    parts.push_back(cfg->run.name.substr(at, dash == std::string::npos ? std::string::npos : dash - at));
    if (dash == std::string::npos) break;
    at = dash + 1;
  }
  bool renamed = false;
  for (std::string& p : parts) {
    if ((p == "async" || p == "sync" || p == "ssp") && p != mode) {
      p = mode;
      renamed = true;
    }
  }
  if (renamed) cfg->run.name = fmt::format("{}", fmt::join(parts, "-"));
  return renamed;
}

// The config of a new run: the file, --set, --servers/--workers and --weights, validated.
Status NewRunConfig(const LaunchFlags& f, RunConfig* cfg) {
  DP_RETURN_IF_ERROR(LoadRunConfig(f.config, f.sets, cfg));
  const std::string file_name = cfg->run.name;
  if (NameAfterSetMode(f, cfg)) {
    std::printf("[launch] run.name \"%s\" names another mode than --set consistency.mode: this run is named \"%s\" "
                "(--set run.name=... to choose)\n",
                file_name.c_str(), cfg->run.name.c_str());
  }
  if (f.servers > 0) cfg->cluster.servers = f.servers;
  if (f.workers > 0) cfg->cluster.workers = f.workers;
  if (!f.weights.empty()) {
    // Absolute, so the stored config still finds it when the run is resumed from elsewhere.
    cfg->model.weights = fs::absolute(f.weights).lexically_normal().string();
    cfg->eval.at_start = true;
  }
  // Stand-in workers (the load benchmark's) train no model an evaluator could read.
  if (!f.worker_cmd.empty()) cfg->eval.evaluator = false;
  DP_RETURN_IF_ERROR(ValidateRunConfig(*cfg, fmt::format("{} with --servers/--workers", f.config)));
  if (!f.tensors.empty() && !f.model.empty()) {
    return InvalidArgument("give either --tensors ({}) or --model ({}), not both", f.tensors, f.model);
  }
  if (!cfg->models.empty() && (!f.tensors.empty() || !f.model.empty() || !f.worker_cmd.empty())) {
    return InvalidArgument("{} trains {} models ([[models]]): their tensor lists come from their model "
                           "configs, and the workers are downpour-worker's (--tensors, --model and --worker-cmd "
                           "are for one-model runs)",
                           f.config, cfg->models.size());
  }
  return Status::Ok();
}

// A resumed run takes its own stored config as it is: changing it half-way would make the two
// halves a different experiment.
Status ResumeRunConfig(const LaunchFlags& f, RunConfig* cfg, ResumePlan* plan) {
  if (!f.config.empty() || !f.sets.empty() || f.servers > 0 || f.workers > 0 || !f.run_dir.empty() ||
      !f.weights.empty()) {
    return InvalidArgument(
        "--resume {} continues the run with its own config.toml; --config, --set, --servers, "
        "--workers, --run-dir and --weights cannot be combined with it",
        f.resume);
  }
  const std::string config = (fs::path(f.resume) / "config.toml").string();
  std::error_code ec;
  if (!fs::exists(config, ec)) {
    return NotFound("--resume {}: not a run directory (no config.toml in it)", f.resume);
  }
  DP_RETURN_IF_ERROR(LoadRunConfig(config, cfg));
  const int K = static_cast<int>(cfg->models.size());
  if (K > 0 && !EveryStageHasOneHolder(cfg->rotation.scheme, K, cfg->cluster.workers)) {
    return FailedPrecondition(
        "--resume {}: this multi-model run's stages are shared by several workers (rotation.scheme = \"{}\", {} models "
        "on {} workers), whose own updates a restarted worker cannot tell apart; only runs whose stages each have one "
        "holder (a pipeline with K >= W, or \"independent\") can be resumed (docs/multi_model.md)",
        f.resume, RotationSchemeName(cfg->rotation.scheme), K, cfg->cluster.workers);
  }
  return PlanResume(f.resume, *cfg, plan);
}

// --dry-run: a child's command, and what it would be restarted as and how often.
void PrintDryRun(const ChildSpec& c) {
  std::printf("[launch] %s: %s\n", c.name.c_str(), fmt::format("{}", fmt::join(c.argv, " ")).c_str());
  std::printf("[launch] %s restarts: %d (%s), then %s: %s\n", c.name.c_str(), c.max_restarts, c.limit.c_str(),
              c.on_death == OnDeath::kFail ? "the job fails" : "the job goes on without it",
              fmt::format("{}", fmt::join(c.restart_argv, " ")).c_str());
}

// Errors found before anything starts are bad input (exit 2: a flag, the config, the
// environment, a key file), except a failure to write the run directory (exit 1).
int SetupExit(const Status& s) { return s.code() == StatusCode::kIoError ? cli::kExitFailure : cli::kExitUsage; }

// What a child of `role` will check when it sets up its network (keys, the loopback rule, the
// advertise host), checked here first so a mistake stops the job before anything starts.
// `*keyed` turns true when the run uses keys.
Status CheckNetwork(const RunConfig& cfg, const NetFlags& flags, NetRole role, bool* keyed) {
  ProcessNet net;
  DP_RETURN_IF_ERROR(SetUpProcessNet(cfg, flags, role, "", &net));
  *keyed = net.keyed;
  // A loopback bind cannot be reached at an advertised name that leads off this host (a
  // cluster job with the default cluster.bind): say so now rather than let the workers wait.
  if (role != NetRole::kWorker && IsLoopbackLiteral(net.bind) && !IsLoopbackLiteral(net.advertise)) {
    std::vector<std::string> addresses;
    if (ThisHost().resolve(net.advertise, &addresses).ok() &&
        std::none_of(addresses.begin(), addresses.end(), [](const std::string& a) { return IsLoopbackLiteral(a); })) {
      return InvalidArgument(
          "{} binds {} (loopback) but advertises {} ({}), which other hosts would use and cannot reach: set "
          "cluster.bind = \"0.0.0.0\" (with security.keys) or --bind",
          NetRoleName(role), net.bind, net.advertise, fmt::join(addresses, ", "));
    }
  }
  return Status::Ok();
}

int RunJob(const LaunchFlags& f, const RunConfig& cfg, const std::vector<ChildSpec>& children,
           const std::string& metrics_path, const std::function<void(MetricsWriter*)>& write_start,
           int min_succeeded = 1, bool* signalled = nullptr);

// One "[launch] warning: ..." line per setting that works but is probably a mistake.
void PrintWarnings(const RunConfig& cfg) {
  for (const std::string& w : RunConfigWarnings(cfg)) std::fprintf(stderr, "[launch] %s\n", w.c_str());
  // Not a warning: what an emulated link does to the job (every child says it too).
  if (const std::string link = EmulatedLinkNote(cfg); !link.empty()) std::printf("[launch] %s\n", link.c_str());
}

// With cluster.transport = "ipc", once the run directory exists (the socket paths' lengths are
// checked before: CheckIpcPathLengths): a relative cluster.ipc_dir is made inside it, and each
// socket path's directory must take files with no live server listening there (another run
// sharing cluster.ipc_dir). `first`..`last` are the servers this launcher starts.
Status CheckIpcPaths(const RunConfig& cfg, const std::string& run_dir, int first, int last) {
  if (cfg.cluster.transport != ClusterTransport::kIpc) return Status::Ok();
  if (!cfg.cluster.ipc_dir.empty() && fs::path(cfg.cluster.ipc_dir).is_relative()) {
    std::error_code ec;
    fs::create_directories(fs::path(run_dir) / cfg.cluster.ipc_dir, ec);  // a failure is reported below
  }
  for (int i = first; i <= last; ++i) {
    DP_RETURN_IF_ERROR(CheckIpcBindPath(ServerIpcPath(cfg.cluster, run_dir, i), "cluster.ipc_dir"));
  }
  return Status::Ok();
}

// A signal (Ctrl-C, SIGTERM) that arrives while a launch sets up, before its children run: it is
// noted, and the launch stops at the end of setup. A handler must reach a static; this one is
// written only by the handler and read by Launch.
volatile std::sig_atomic_t g_setup_signal = 0;
void NoteSetupSignal(int sig) { g_setup_signal = sig; }

// A new run's directory as it was before this launch, so that a launch that stops before its
// job starts (bad input, Ctrl-C) leaves nothing behind: a directory it created is removed, and
// an empty one it was given is emptied again. Disarmed once the job starts.
class NewRunDirUndo {
 public:
  NewRunDirUndo(std::string dir, bool created) : dir_(std::move(dir)), created_(created) {}
  ~NewRunDirUndo() {
    if (dir_.empty()) return;
    std::error_code ec;
    if (created_) {
      fs::remove_all(dir_, ec);
      return;
    }
    for (const auto& entry : fs::directory_iterator(dir_, ec)) fs::remove_all(entry.path(), ec);
  }
  void Disarm() { dir_.clear(); }

 private:
  std::string dir_;
  bool created_;
};

// <out_dir>/<name>-<YYYYmmdd-HHMMSS>, or with "-2", "-3", ... appended when a launch in the same
// second has it: created here with mkdir, which only one launch can win, so two launches never
// share a directory. `*dir` is absolute.
Status ClaimDefaultRunDir(const RunConfig& cfg, std::string* dir) {
  const fs::path base = fs::absolute(DefaultRunDir(cfg)).lexically_normal();
  std::error_code ec;
  fs::create_directories(base.parent_path(), ec);
  if (ec) return IoError("run.out_dir {}: cannot create: {}", base.parent_path().string(), ec.message());
  for (int n = 1; n <= 1000; ++n) {
    const std::string candidate = n == 1 ? base.string() : fmt::format("{}-{}", base.string(), n);
    if (::mkdir(candidate.c_str(), 0777) == 0) {
      *dir = candidate;
      return Status::Ok();
    }
    if (errno != EEXIST) return IoError("{}: cannot create run directory: {}", candidate, std::strerror(errno));
  }
  return IoError("{}: 1000 run directories of this name and second exist already; give --run-dir", base.string());
}

// The TCP ports a local job's coordinator and servers will bind, each free now (a stand-in
// command given for a role binds what it likes).
Status CheckJobPorts(const LaunchFlags& f, const RunConfig& cfg) {
  const std::string hint = "; or move the job with --set cluster.coordinator=HOST:PORT --set cluster.base_port=PORT";
  if (f.coordinator_cmd.empty()) {
    HostPort coordinator;
    DP_RETURN_IF_ERROR(ParseHostPort(cfg.cluster.coordinator, "cluster.coordinator", &coordinator));
    const Status s = CheckTcpBindPort(cfg.cluster.bind, coordinator.port,
                                      fmt::format("cluster.coordinator = \"{}\"", cfg.cluster.coordinator));
    if (!s.ok()) return Status(s.code(), s.message() + hint);
  }
  if (cfg.cluster.transport == ClusterTransport::kIpc || !f.server_cmd.empty()) return Status::Ok();
  for (int i = 0; i < cfg.cluster.servers; ++i) {
    const Status s = CheckTcpBindPort(cfg.cluster.bind, cfg.cluster.base_port + i,
                                      fmt::format("cluster.base_port = {} (server {})", cfg.cluster.base_port, i));
    if (!s.ok()) return Status(s.code(), s.message() + hint);
  }
  return Status::Ok();
}

// After a job that did not succeed: how to go on with it, or why it cannot be. A new run that
// was stopped (`stopped_new_run`: Ctrl-C, SIGTERM) before any server or worker saved anything
// holds nothing to resume, and its directory is removed, so that the same --run-dir can be
// launched again.
void EndStoppedRun(const std::string& run_dir, const RunConfig& cfg, bool stopped_new_run) {
  ResumePlan plan;
  const Status s = PlanResume(run_dir, cfg, &plan);
  std::error_code ec;
  if (s.ok()) {
    std::printf("[launch] continue it with: downpour-launch --resume %s\n", run_dir.c_str());
  } else if (stopped_new_run && RunSavedNothing(run_dir, cfg)) {
    fs::remove_all(run_dir, ec);
    std::printf("[launch] stopped before any server or worker saved anything: removed %s\n", run_dir.c_str());
  } else {
    std::printf("[launch] %s\n", s.message().c_str());
  }
  std::fflush(stdout);
}

// Returns the process exit code; errors before any child starts are printed and give 2, a signal
// before then 128 + its number, and either way a new run's directory is left as it was.
int Launch(const LaunchFlags& f) {
  for (int sig : {SIGINT, SIGTERM}) std::signal(sig, NoteSetupSignal);
  const bool resuming = !f.resume.empty();
  RunConfig cfg;
  ResumePlan plan;
  Status s = resuming ? ResumeRunConfig(f, &cfg, &plan) : NewRunConfig(f, &cfg);
  // A run that never started a process (a --dry-run's) starts from the beginning.
  const bool fresh = resuming && plan.never_started;
  std::string run_dir;
  bool created = false;
  if (s.ok() && !resuming && f.run_dir.empty()) {
    s = ClaimDefaultRunDir(cfg, &run_dir);
    created = s.ok();
  } else if (s.ok()) {
    run_dir = fs::absolute(resuming ? f.resume : f.run_dir).lexically_normal().string();
    std::error_code ec;
    created = !resuming && !fs::exists(run_dir, ec);
  }
  if (s.ok() && !resuming && !created) s = CheckRunDirIsNew(run_dir);
  // Armed only for a directory that was absent or empty: a refused one is never touched.
  NewRunDirUndo undo(resuming || !s.ok() ? std::string() : run_dir, created);
  if (s.ok()) s = CheckIpcPathLengths(cfg.cluster, run_dir);
  // Inputs are checked before anything starts (a stand-in worker command brings its own).
  if (s.ok() && f.worker_cmd.empty()) {
    s = CheckRunInputs(cfg, resuming ? ConfigSource(run_dir + "/config.toml") : ConfigSource(f.config, f.sets));
  }
  // So are the keys, the loopback rule and the advertise hosts every child will set up.
  bool keyed = false;
  for (NetRole role : {NetRole::kCoordinator, NetRole::kServer, NetRole::kWorker}) {
    if (s.ok()) s = CheckNetwork(cfg, NetFlags{}, role, &keyed);
  }
  if (s.ok() && !f.dry_run) s = CheckJobPorts(f, cfg);
  LaunchFlags flags = f;
  // Without --tensors/--model, downpour-worker supplies the tensor list from the model config
  // (a resumed run reuses the one it wrote); a job whose workers are a --worker-cmd stand-in
  // passes none (the stand-in decides).
  const bool auto_tensors = flags.tensors.empty() && flags.model.empty() && flags.worker_cmd.empty();
  if (auto_tensors) flags.tensors = (fs::path(run_dir) / "tensors.txt").string();
  std::vector<ChildSpec> children;
  if (s.ok()) s = BuildChildren(flags, cfg, run_dir, resuming && !fresh ? &plan : nullptr, &children);
  if (s.ok() && f.worker_cmd.empty()) s = data::CheckRunDataFitsModel(cfg);  // records vs the model's input
  for (size_t k = 0; s.ok() && k < cfg.models.size(); ++k) {  // and vs every model's of a multi-model run
    s = data::CheckRunDataFitsModel(ModelRunConfig(cfg, static_cast<int>(k)));
  }
  if (s.ok()) {
    std::error_code ec;
    fs::create_directories(fs::path(run_dir) / "logs", ec);
    if (ec) s = IoError("{}: cannot create run directory: {}", run_dir, ec.message());
  }
  if (s.ok()) s = CheckIpcPaths(cfg, run_dir, 0, cfg.cluster.servers - 1);
  if (s.ok() && !resuming) s = WriteFileAtomic((fs::path(run_dir) / "config.toml").string(), ToToml(cfg));
  // Without keys the children authorise register and admin messages with the run's secret;
  // made here, before any of them starts, so they all read this one.
  std::string secret;
  if (s.ok() && !keyed) s = EnsureRunSecret(run_dir, &secret);
  int stop_code = 0;
  if (s.ok() && auto_tensors && !(resuming && fs::exists(flags.tensors)) && !g_setup_signal) {
    s = WriteTensorListWithWorker(flags, (fs::path(run_dir) / "config.toml").string(), flags.tensors,
                                  (fs::path(run_dir) / "logs" / "tensors.log").string(), &stop_code);
  }
  if (g_setup_signal && stop_code == 0) stop_code = 128 + g_setup_signal;
  if (stop_code != 0) {
    std::fprintf(stderr, "downpour-launch: stopped by signal %d before the job started%s\n", stop_code - 128,
                 resuming ? "" : "; the run directory is left as it was");
    return stop_code;
  }
  if (!s.ok()) return cli::Fail("downpour-launch", s, SetupExit(s));
  PrintWarnings(cfg);
  if (fresh) {
    std::printf("[launch] run %s never started a process (a --dry-run made it): starting it from the beginning\n",
                cfg.run.name.c_str());
  } else if (resuming) {
    std::printf("[launch] resuming run %s from %s (servers recover their checkpoints and logs, workers their progress)\n",
                cfg.run.name.c_str(), run_dir.c_str());
  }
  std::printf("[launch] run %s: %d server(s), %d worker(s), %s; run dir %s\n", cfg.run.name.c_str(),
              cfg.cluster.servers, cfg.cluster.workers, ConsistencyModeString(cfg.consistency).c_str(),
              run_dir.c_str());
  undo.Disarm();
  if (f.dry_run) {
    for (const ChildSpec& c : children) PrintDryRun(c);
    return 0;
  }
  bool signalled = false;
  const int code = RunJob(
      f, cfg, children, (fs::path(run_dir) / "launch.jsonl").string(),
      [&](MetricsWriter* m) {
        (void)m->Write("start", {{"servers", cfg.cluster.servers},
                                 {"workers", cfg.cluster.workers},
                                 {"mode", ConsistencyModeString(cfg.consistency)},
                                 {"resumed", resuming && !fresh}});
      },
      /*min_succeeded=*/1, &signalled);
  if (code != 0) EndStoppedRun(run_dir, cfg, signalled && !resuming);
  return code;
}

// One launch.jsonl record per supervision event (docs/operations.md "launch.jsonl"): "died",
// "restart", "given_up", so the time a job loses per death can be measured from them.
void WriteEvent(MetricsWriter* m, const ChildEvent& e) {
  [[maybe_unused]] Status s;
  switch (e.kind) {
    case ChildEvent::Kind::kDied: {
      const char* action = e.action == ChildEvent::Action::kRestart    ? "restart"
                           : e.action == ChildEvent::Action::kContinue ? "continue"
                                                                       : "stop";
      s = m->Write("died", {{"child", e.child},
                            {"pid", static_cast<int>(e.pid)},
                            {"code", e.Code()},
                            {"signal", e.term_signal},
                            {"seconds", e.seconds},
                            {"uptime_s", e.uptime_s},
                            {"restarts", e.restart},
                            {"max_restarts", e.max_restarts},
                            {"action", action}});
      break;
    }
    case ChildEvent::Kind::kRestarted:
      s = m->Write("restart", {{"child", e.child},
                               {"attempt", e.restart},
                               {"max_restarts", e.max_restarts},
                               {"pid", static_cast<int>(e.pid)},
                               {"seconds", e.seconds},
                               {"down_s", e.down_s},
                               {"argv", fmt::format("{}", fmt::join(e.argv, " "))}});
      break;
    case ChildEvent::Kind::kGivenUp:
      s = m->Write("given_up", {{"child", e.child}, {"code", e.Code()}, {"seconds", e.seconds}, {"restarts", e.restart}});
      break;
  }
}

// Starts `children` as one job and runs it to its end, with the launcher's metrics in
// `metrics_path` ("start" by `write_start`, the supervision events, one "exit" per child,
// "end"); returns the exit code. `min_succeeded`: ProcessGroupOptions::min_succeeded.
// `*signalled` (when given) tells whether SIGINT/SIGTERM to the launcher stopped the job.
int RunJob(const LaunchFlags& f, const RunConfig& cfg, const std::vector<ChildSpec>& children,
           const std::string& metrics_path, const std::function<void(MetricsWriter*)>& write_start,
           int min_succeeded, bool* signalled) {
  std::fflush(stdout);
  std::unique_ptr<MetricsWriter> metrics;
  Status s = MetricsWriter::Open(metrics_path, "launcher", 0, &metrics);
  if (!s.ok()) return cli::Fail("downpour-launch", s, cli::kExitFailure);

  ProcessGroupOptions options;
  options.grace_period = std::chrono::milliseconds(f.grace_ms);
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  options.min_succeeded = min_succeeded;
  options.setup_error_code = cli::kExitUsage;
  // Once the coordinator has ended the run, a process that does not exit within two heartbeat
  // timeouts (it was stopped or cut off when the run ended) is stopped.
  options.run_over_grace =
      std::max(std::chrono::milliseconds(5000), 2 * std::chrono::milliseconds(cfg.cluster.heartbeat_timeout_ms));
  options.on_event = [m = metrics.get()](const ChildEvent& e) { WriteEvent(m, e); };
  ProcessGroup group(options);
  const auto t0 = std::chrono::steady_clock::now();
  for (const ChildSpec& c : children) {
    s = group.Start(c);
    if (!s.ok()) {
      std::fprintf(stderr, "downpour-launch: %s; stopping the ones already started\n", s.ToString().c_str());
      return cli::kExitFailure;  // ~ProcessGroup kills what was started
    }
  }
  write_start(metrics.get());
  const int code = group.Run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  [[maybe_unused]] Status ms;
  for (const ChildResult& r : group.results()) {
    ms = metrics->Write("exit", {{"child", r.name},
                                 {"code", r.Code()},
                                 {"stopped", r.stopped_by_us},
                                 {"restarts", r.restarts},
                                 {"given_up", r.given_up}});
  }
  ms = metrics->Write("end", {{"code", code}, {"reason", group.reason()}, {"seconds", seconds}});
  const bool stopped = group.reason().starts_with("received signal");
  if (signalled != nullptr) *signalled = stopped;
  std::printf("[launch] %s after %.1f s: %s (exit code %d)\n", code == 0 ? "done" : stopped ? "stopped" : "FAILED",
              seconds, group.reason().c_str(), code);
  return code;
}

// ---- cluster mode: one task of a job spread over hosts ----

Status PlanTask(const LaunchFlags& f, const RunConfig& cfg, TaskPlan* plan) {
  PlanInputs in;
  in.servers = cfg.cluster.servers;
  in.workers = cfg.cluster.workers;
  in.config_coordinator = cfg.cluster.coordinator;
  in.config_advertise = cfg.cluster.advertise;
  in.flag_coordinator = f.net.coordinator;
  in.flag_advertise = f.net.advertise;
  in.flag_role = f.role;
  in.flag_id = f.id;
  if (f.slurm) return PlanSlurmTask(ProcessEnvironment(), in, plan);
  if (f.mpi) return PlanMpiTask(ProcessEnvironment(), in, plan);
  return PlanByHandTask(in, plan);
}

// Every task of a job must name the same run directory without talking to the others: --run-dir,
// or one derived from the job's id, which every task sees in its environment.
Status TaskRunDir(const LaunchFlags& f, const RunConfig& cfg, const TaskPlan& plan, std::string* run_dir) {
  std::string dir = f.run_dir;
  if (dir.empty()) {
    if (plan.job_id.empty()) {
      return InvalidArgument(
          "{}: give --run-dir D, the same on every task of the job ({})",
          plan.mode == LaunchMode::kByHand ? "started by hand" : "no job id in the environment to name the run after",
          plan.origin);
    }
    std::string job = plan.job_id;
    std::replace(job.begin(), job.end(), '/', '_');
    dir = (fs::path(cfg.run.out_dir) / fmt::format("{}-{}", cfg.run.name, job)).string();
  }
  *run_dir = fs::absolute(dir).lexically_normal().string();
  return Status::Ok();
}

// The child's arguments: the usual ones plus where the coordinator is and this task's
// --bind / --advertise.
Status BuildTaskChild(const LaunchFlags& f, const TaskPlan& plan, const std::string& run_dir,
                      const std::vector<std::string>& model_args, ChildSpec* child) {
  const std::string config_path = (fs::path(run_dir) / "config.toml").string();
  std::vector<std::string> args;
  if (plan.role != TaskRole::kCoordinator) args = {"--id", std::to_string(plan.id)};
  args.insert(args.end(), {"--config", config_path, "--run-dir", run_dir});
  if (plan.role != TaskRole::kWorker) args.insert(args.end(), model_args.begin(), model_args.end());
  args.insert(args.end(), {"--coordinator", plan.coordinator});
  if (!f.net.bind.empty()) args.insert(args.end(), {"--bind", f.net.bind});
  if (plan.role != TaskRole::kWorker && !plan.advertise.empty())
    args.insert(args.end(), {"--advertise", plan.advertise});
  switch (plan.role) {
    case TaskRole::kCoordinator:
      DP_RETURN_IF_ERROR(
          RoleArgv(f, "downpour-coordinator", f.coordinator_cmd, "--coordinator-cmd", args, &child->argv));
      break;
    case TaskRole::kServer:
      DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-server", f.server_cmd, "--server-cmd", args, &child->argv));
      break;
    case TaskRole::kWorker:
      DP_RETURN_IF_ERROR(RoleArgv(f, "downpour-worker", f.worker_cmd, "--worker-cmd", args, &child->argv));
      break;
  }
  child->name = plan.Name();
  child->log_path = (fs::path(run_dir) / "logs" / (plan.FileStem() + ".log")).string();
  child->primary = true;  // the task is done when its one child is
  return Status::Ok();
}

// The same supervision as on one machine, for the task's one child.
void SuperviseTaskChild(const LaunchFlags& f, const RunConfig& cfg, const TaskPlan& plan, ChildSpec* child) {
  switch (plan.role) {
    case TaskRole::kCoordinator:
      SuperviseCoordinator(cfg, child);
      break;
    case TaskRole::kServer:
      SuperviseServer(cfg, child);
      break;
    case TaskRole::kWorker:
      SuperviseWorker(f, cfg, plan.id, child);
      break;
  }
}

// config.toml is the same in every task: written when it is not there yet (atomically, so
// tasks racing on a shared file system each rename a whole file), and compared when it is —
// a task with other settings would be a different job.
Status WriteSharedConfig(const std::string& run_dir, const std::string& text) {
  const std::string path = (fs::path(run_dir) / "config.toml").string();
  std::string existing;
  const Status read = ReadWholeFile(path, "run config", &existing);
  if (read.ok()) {
    if (existing == text) return Status::Ok();
    return InvalidArgument(
        "{} was written by another task of this job with different settings; every task must get the same --config, "
        "--set, --servers and --workers (or use another --run-dir)",
        path);
  }
  if (read.code() != StatusCode::kNotFound) return read;
  return WriteFileAtomic(path, text);
}

// Runs one task of a cluster job: its role, checks, its part of the run directory, its child.
int LaunchTask(const LaunchFlags& f) {
  RunConfig cfg;
  TaskPlan plan;
  Status s = NewRunConfig(f, &cfg);
  if (s.ok()) s = PlanTask(f, cfg, &plan);
  if (s.ok()) {
    std::printf("[launch] %s: %s\n", plan.origin.c_str(), plan.Name().c_str());
    std::fflush(stdout);
  }
  std::string run_dir;
  if (s.ok()) s = TaskRunDir(f, cfg, plan, &run_dir);
  if (s.ok() && cfg.cluster.transport == ClusterTransport::kIpc) {
    s = CheckOneHost(ProcessEnvironment(), plan, "cluster.transport = \"ipc\"");
    if (s.ok()) s = CheckIpcPathLengths(cfg.cluster, run_dir);
  }
  if (s.ok()) s = CheckTaskFilesAreNew(run_dir, plan.FileStem());
  // Inputs this role reads (a stand-in command brings its own).
  const bool worker = plan.role == TaskRole::kWorker;
  const bool auto_tensors = !worker && f.tensors.empty() && f.model.empty() && f.worker_cmd.empty();
  if (s.ok() && (worker ? f.worker_cmd.empty() : auto_tensors)) s = CheckTaskInputs(cfg, ConfigSource(f.config, f.sets), worker, plan.id);
  // The network this task's child will set up: keys, the loopback rule, the advertise host.
  bool keyed = false;
  const NetRole role =
      worker ? NetRole::kWorker : (plan.role == TaskRole::kServer ? NetRole::kServer : NetRole::kCoordinator);
  if (s.ok()) s = CheckNetwork(cfg, NetFlags{f.net.bind, plan.advertise, plan.coordinator}, role, &keyed);
  std::vector<std::string> model_args;
  const std::string tensors = (fs::path(run_dir) / fmt::format("tensors-{}.txt", plan.FileStem())).string();
  if (!f.tensors.empty()) model_args = {"--tensors", fs::absolute(f.tensors).string()};
  if (!f.model.empty()) model_args = {"--model", f.model};
  if (auto_tensors) model_args = {"--tensors", tensors};
  // A multi-model run's servers and coordinator read every model's list from the run directory
  // (tensors-model-<k>.txt, which this task's downpour-worker --write-tensors writes there).
  if (!cfg.models.empty()) model_args.clear();
  ChildSpec child;
  if (s.ok()) s = BuildTaskChild(f, plan, run_dir, model_args, &child);
  if (s.ok()) SuperviseTaskChild(f, cfg, plan, &child);
  // The coordinator's task runs the evaluator too (it connects as a worker does).
  std::vector<ChildSpec> children;
  const bool evaluator = plan.role == TaskRole::kCoordinator && RunHasEvaluator(cfg);
  if (s.ok() && evaluator) {
    bool evaluator_keyed = false;
    // Its connections leave from the task's --bind address when that names one (not a wildcard).
    const std::string source = IsWildcardAddress(f.net.bind) ? std::string() : f.net.bind;
    s = CheckNetwork(cfg, NetFlags{source, "", plan.coordinator}, NetRole::kWorker, &evaluator_keyed);
    std::vector<std::string> extra = {"--coordinator", plan.coordinator};
    if (!source.empty()) extra.insert(extra.end(), {"--bind", source});
    ChildSpec e;
    if (s.ok()) s = BuildEvaluatorChild(f, cfg, run_dir, extra, &e);
    if (s.ok()) children.push_back(e);
  }
  // Everything checked: now this task's part of the run directory.
  if (s.ok()) {
    std::error_code ec;
    fs::create_directories(fs::path(run_dir) / "logs", ec);
    if (ec) s = IoError("{}: cannot create run directory: {}", run_dir, ec.message());
  }
  if (s.ok() && plan.role == TaskRole::kServer) s = CheckIpcPaths(cfg, run_dir, plan.id, plan.id);
  if (s.ok()) s = WriteSharedConfig(run_dir, ToToml(cfg));
  std::string secret;
  if (s.ok() && !keyed) s = EnsureRunSecret(run_dir, &secret);
  int stop_code = 0;
  if (s.ok() && auto_tensors) {
    s = WriteTensorListWithWorker(
        f, (fs::path(run_dir) / "config.toml").string(), tensors,
        (fs::path(run_dir) / "logs" / fmt::format("tensors-{}.log", plan.FileStem())).string(), &stop_code);
  }
  if (stop_code != 0) {
    std::fprintf(stderr, "downpour-launch: stopped by signal %d before the task started\n", stop_code - 128);
    return stop_code;
  }
  if (!s.ok()) return cli::Fail("downpour-launch", s, SetupExit(s));
  PrintWarnings(cfg);
  std::printf("[launch] run %s: %d server(s), %d worker(s), %s; coordinator %s; run dir %s\n", cfg.run.name.c_str(),
              cfg.cluster.servers, cfg.cluster.workers, ConsistencyModeString(cfg.consistency).c_str(),
              plan.coordinator.c_str(), run_dir.c_str());
  children.insert(children.begin(), child);
  if (f.dry_run) {
    for (const ChildSpec& c : children) PrintDryRun(c);
    return 0;
  }
  const std::string metrics = (fs::path(run_dir) / fmt::format("launch-{}.jsonl", plan.FileStem())).string();
  return RunJob(f, cfg, children, metrics, [&](MetricsWriter* m) {
    (void)m->Write("start", {{"servers", cfg.cluster.servers},
                             {"workers", cfg.cluster.workers},
                             {"mode", ConsistencyModeString(cfg.consistency)},
                             {"resumed", false},
                             {"task", plan.Name()},
                             {"rank", plan.rank},
                             {"tasks", plan.size},
                             {"node", plan.node},
                             {"origin", plan.origin}});
  },
                // A worker task whose worker the job goes on without ends with 0, so that Slurm's
                // --kill-on-bad-exit or mpirun does not stop the job for it.
                plan.role == TaskRole::kWorker && child.on_death == OnDeath::kContinue ? 0 : 1);
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  downpour::LaunchFlags f;
  CLI::App app{"downpour-launch: start a coordinator, S servers and W workers as one job"};
  cli::AddStandardFlags(&app, "downpour-launch");
  auto* config = app.add_option("-c,--config", f.config, "run config (TOML)");
  auto* resume = app.add_option("--resume", f.resume,
                                "continue the stopped or crashed run in this run directory (its own config.toml; "
                                "servers from their checkpoints, workers from their saved progress)");
  config->excludes(resume);
  app.add_option("--weights", f.weights,
                 "start from these weights (a tensor file such as a run's model_final.dpt, or a .caffemodel) and "
                 "evaluate them before the first step");
  cli::AddSetOption(&app, &f.sets);
  app.add_option("-s,--servers", f.servers, "override cluster.servers")->check(cli::AtLeast(1));
  app.add_option("-w,--workers", f.workers, "override cluster.workers")->check(cli::AtLeast(1));
  app.add_option("-o,--run-dir", f.run_dir, "run directory (default <run.out_dir>/<run.name>-<time>)");
  app.add_option("--tensors", f.tensors, "tensor list file, passed to coordinator and servers");
  app.add_option("--model", f.model, "built-in tensor list (e.g. alexnet-shapes), passed to coordinator and servers");
  app.add_option("--worker-cmd", f.worker_cmd, "shell command instead of downpour-worker (gets the same args)");
  app.add_option("--server-cmd", f.server_cmd, "shell command instead of downpour-server (gets the same args)");
  app.add_option("--coordinator-cmd", f.coordinator_cmd, "shell command instead of downpour-coordinator");
  app.add_option("--bin-dir", f.bin_dir, "where the downpour binaries are (default: next to this one)");
  app.add_option("--grace-ms", f.grace_ms, "SIGTERM -> SIGKILL grace period when stopping (ms)")
      ->check(cli::Between(0, 3600000));
  app.add_option("--timeout-s", f.timeout_s, "stop everything after this many seconds (0 = never)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--restart-workers", f.restart_workers,
                 "restart a dead worker with --resume up to N times, then go on without it (default "
                 "cluster.restart_workers; worker 0 is restarted at least once)")
      ->check(cli::Between(0, 1000000));
  app.add_flag("--dry-run", f.dry_run, "create the run directory and print the commands only");
  auto* slurm = app.add_flag("--slurm", f.slurm,
                             "cluster mode: run the one role of this Slurm task (srun downpour-launch --slurm ...; "
                             "SLURM_PROCID 0 = coordinator, 1..S = servers, then workers)");
  auto* mpi = app.add_flag(
      "--mpi", f.mpi, "cluster mode: run the one role of this MPI rank (mpirun -np S+W+1 downpour-launch --mpi ...)");
  auto* role = app.add_option("--role", f.role, "cluster mode by hand: run this role only (coordinator|server|worker)");
  app.add_option("--id", f.id, "with --role server|worker: its id")->check(cli::AtLeast(0));
  app.add_option("--coordinator", f.net.coordinator,
                 "cluster mode: the coordinator's host:port (default: the first node of the job, or "
                 "cluster.coordinator)");
  app.add_option("--bind", f.net.bind,
                 "cluster mode: address this task's coordinator/server binds, or a worker's source address (default "
                 "cluster.bind)");
  app.add_option("--advertise", f.net.advertise,
                 "cluster mode: host the others reach this task at (default cluster.advertise, else the Slurm node "
                 "name, else derived)");
  slurm->excludes(mpi)->excludes(role)->excludes(resume);
  mpi->excludes(role)->excludes(resume);
  role->excludes(resume);
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  if (f.config.empty() && f.resume.empty()) {
    std::fprintf(
        stderr,
        "downpour-launch: give --config FILE (a new run) or --resume RUN_DIR\nRun with --help for the options.\n");
    return cli::kExitUsage;
  }
  if (!f.cluster() && (f.id >= 0 || !f.net.bind.empty() || !f.net.advertise.empty() || !f.net.coordinator.empty())) {
    std::fprintf(
        stderr,
        "downpour-launch: --id, --bind, --advertise and --coordinator belong to cluster mode (--slurm, --mpi or "
        "--role); a job on this machine takes them from [cluster] in the config\n");
    return cli::kExitUsage;
  }
  return cli::Main("downpour-launch", [&] { return f.cluster() ? downpour::LaunchTask(f) : downpour::Launch(f); });
}
