// run_config.h — RunConfig, the typed form of the TOML file that describes a training run, and
// its loader. Each section is a struct whose members' initializers are the defaults and whose
// `Rows` lists every key once: name, member, rule and a one-line doc (common/config_table.h).
// Reading, --set, the per-key checks, ToToml and RunConfigKeys are made from the rows;
// docs/config.md describes every key in full and is checked against them. Loading rejects unknown
// tables and keys, wrong types and out-of-range values with one error naming the file, the
// table.key and the value. A module's options embed the section it reads (ShardOptions holds the
// CheckpointConfig) rather than copy its keys with defaults of their own.
//
// Thread-safety: plain value types; the free functions are reentrant.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/config_table.h"
#include "common/device.h"
#include "common/status.h"

namespace downpour {

// Largest accepted values: a typo is refused rather than started.
inline constexpr int kMaxServerThreads = 64;            // cluster.server_threads
inline constexpr int kMaxIoThreads = 16;                // cluster.io_threads
inline constexpr int kMaxConnectionsPerServer = 8;      // cluster.connections_per_server
inline constexpr int64_t kMaxTraceEvents = 10'000'000;  // cluster.trace_events
inline constexpr int kMaxFactorThreads = 64;            // compression.factor_threads
inline constexpr int kMaxOutstandingSteps = 16;         // worker.outstanding_steps

// host:port with a non-empty host and a port in 1..65535.
bool IsHostPort(const std::string& s);

// [run] — naming and reproducibility.
struct RunSection {
  std::string name = "run";
  std::string out_dir = "runs";
  int64_t seed = 1;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("name", s.name,
          Must<std::string>([](const std::string& n) { return !n.empty() && n.find('/') == std::string::npos; },
                            "must be non-empty and contain no '/'"),
          "run name; the launcher's default run dir is <out_dir>/<name>-<time>");
    v.Key("out_dir", s.out_dir, NonEmpty(), "root of run directories (relative to the launcher's cwd)");
    v.Key("seed", s.seed, AtLeast<int64_t>(0), "base RNG seed; process k derives its own from it");
  }
  bool operator==(const RunSection&) const = default;
};

// [model] — which net to train.
struct ModelSection {
  std::string config = "configs/models/fmnist_small.toml";
  std::string weights;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    v.Key("config", s.config, config::NonEmpty("must name a model TOML"), "model TOML (client/engine NetSpec)");
    v.Key("weights", s.weights, "initial weights (tensor file or .caffemodel) instead of fillers; \"\" = none");
  }
  bool operator==(const ModelSection&) const = default;
};

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

// Learning-rate policies, exactly as Caffe's SGDSolver::GetLearningRate defines them
// (common/solver/lr_policy.h computes them).
enum class LrPolicy {
  kFixed,      // base_lr
  kStep,       // base_lr * gamma ^ floor(iter / stepsize)
  kMultistep,  // base_lr * gamma ^ (number of stepvalues <= iter)
  kPoly,       // base_lr * (1 - iter / max_iter) ^ power
  kInv,        // base_lr * (1 + gamma * iter) ^ (-power)
  kExp,        // base_lr * gamma ^ iter
};
inline constexpr std::string_view kLrPolicyNames[] = {"fixed", "step", "multistep", "poly", "inv", "exp"};
const char* LrPolicyName(LrPolicy policy);
// Parses "fixed" | "step" | "multistep" | "poly" | "inv" | "exp"; false if unknown.
bool ParseLrPolicy(std::string_view text, LrPolicy* out);

// solver.update: the rule a gradient changes the weights by (common/solver/update_rule.h).
enum class UpdateRuleKind {
  kMomentum,  // "momentum": SGD with momentum and L2 weight decay (Caffe's SGDSolver)
  kAdaGrad,   // "adagrad": lr / sqrt(Σ g² + epsilon) per element (Duchi et al.; DistBelief's servers)
};
inline constexpr std::string_view kUpdateRuleNames[] = {"momentum", "adagrad"};
const char* UpdateRuleName(UpdateRuleKind kind);
bool ParseUpdateRule(std::string_view text, UpdateRuleKind* out);  // false if unknown

// Server `server`'s ipc socket file: <ipc_dir>/server-<i>.sock, resolved against `run_dir`.
std::string ServerIpcPath(const ClusterConfig& cluster, const std::string& run_dir, int server);
// The address server `server` binds: ipc://ServerIpcPath(...), or tcp://<bind>:<base_port +
// server> (a wildcard bind as 127.0.0.1).
std::string ServerAddress(const ClusterConfig& cluster, const std::string& run_dir, int server);
// Ok if every server's ipc socket path fits in sun_path (and for tcp); else InvalidArgument
// naming cluster.ipc_dir, the path and its length.
Status CheckIpcPathLengths(const ClusterConfig& cluster, const std::string& run_dir);

// [solver] — the update rule and its learning-rate schedule, Caffe's semantics. The same rows
// read [[models]] entries' [models.solver].
struct SolverConfig {
  float base_lr = 0.01f;
  LrPolicy lr_policy = LrPolicy::kFixed;
  float gamma = 0.1f;
  float power = 1.0f;
  int64_t stepsize = 1000;
  std::vector<int64_t> stepvalues;
  int64_t max_iter = 10000;  // 0 = the run's planned worker batches (RunSolver)
  float momentum = 0.9f;
  float weight_decay = 0.0005f;
  float clip_gradients = -1.0f;
  UpdateRuleKind update = UpdateRuleKind::kMomentum;
  float adagrad_epsilon = 1e-10f;
  float adagrad_initial = 0.1f;
  int64_t warmup_iters = 0;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("base_lr", s.base_lr, FinitePositive<float>(), "learning rate at iteration 0");
    v.Named("lr_policy", s.lr_policy, Names{kLrPolicyNames}, "learning-rate schedule (Caffe's lr_policy)");
    v.Key("gamma", s.gamma, FinitePositive<float>(), "decay factor for step/multistep/exp; rate for inv");
    v.Key("power", s.power, FiniteNonNegative<float>(), "exponent for poly and inv");
    v.Key("stepsize", s.stepsize, Must<int64_t>([](int64_t x) { return x > 0; }, "must be > 0"),
          "iterations per step for \"step\"");
    v.Key("stepvalues", s.stepvalues,
          Must<std::vector<int64_t>>(
              [](const std::vector<int64_t>& x) {
                for (size_t i = 0; i < x.size(); ++i) {
                  if (x[i] <= 0 || (i > 0 && x[i] <= x[i - 1])) return false;
                }
                return true;
              },
              "must be positive and strictly increasing"),
          "iterations at which \"multistep\" decays");
    v.Key("max_iter", s.max_iter, AtLeast<int64_t>(0, "0 = the run's planned worker batches"),
          "horizon of \"poly\": lr reaches 0 at iter = max_iter; 0 = the run's planned worker batches");
    v.Key("momentum", s.momentum, Must<float>([](float x) { return x >= 0 && x < 1; }, "must be in [0, 1)"),
          "momentum of the update");
    v.Key("weight_decay", s.weight_decay, FiniteNonNegative<float>(), "L2 coefficient, times each tensor's decay_mult");
    v.Key("clip_gradients", s.clip_gradients,
          Must<float>([](float x) { return !std::isnan(x); }, "must be a number (<= 0 turns clipping off)"),
          "global L2-norm threshold each worker clips its gradient to before pushing; <= 0 = off");
    v.Named("update", s.update, Names{kUpdateRuleNames}, "the rule a gradient changes the weights by");
    v.Key("adagrad_epsilon", s.adagrad_epsilon, FinitePositive<float>("AdaGrad divides by sqrt(acc + epsilon)"),
          "AdaGrad: lr / sqrt(acc + epsilon)");
    v.Key("adagrad_initial", s.adagrad_initial, FiniteNonNegative<float>("an accumulator of squares"),
          "AdaGrad: each accumulator's start");
    v.Key("warmup_iters", s.warmup_iters, AtLeast<int64_t>(0, "0 = no warm-up"),
          "linear warm-up: the rate at iter < n is the schedule's times (iter + 1) / n; 0 = off");
  }
  bool operator==(const SolverConfig&) const = default;
};

enum class ConsistencyMode {
  kAsync,  // Downpour: apply every gradient on arrival
  kSync,   // BSP: average all live workers' gradients for clock t, apply once
  kSsp,    // bounded staleness: a pull at clock c waits for the slowest worker to reach c - s
};

// How a server turns a pushed gradient into its update (consistency.algorithm).
enum class Algorithm {
  kSgd,     // "sgd": the gradient as pushed (Downpour / BSP / SSP, by mode)
  kDcAsgd,  // "dc-asgd": delay compensation, Zheng et al. 2017 (async / ssp), constant λ
  kDcAsgdAdaptive,  // "dc-asgd-a": the same with λ / sqrt(mean square of g), per element
  kEasgd,   // "easgd": elastic averaging, Zhang, Choromanska, LeCun 2015 (async)
};
inline constexpr std::string_view kAlgorithmNames[] = {"sgd", "dc-asgd", "dc-asgd-a", "easgd"};

struct ConsistencyConfig;
// "async", "sync" or "ssp:<s>".
std::string ConsistencyModeString(const ConsistencyConfig& c);
// "async" | "sync" | "ssp:<s>" with s a non-negative integer into mode and staleness_bound.
bool ParseConsistencyMode(std::string_view text, ConsistencyConfig* c);

// [consistency] — how the servers combine the workers' gradients (docs/algorithms.md).
struct ConsistencyConfig {
  ConsistencyMode mode = ConsistencyMode::kAsync;
  int staleness_bound = 0;  // s of "ssp:<s>"; 0 for async and sync
  int backup_workers = 0;
  bool staleness_aware_lr = false;
  Algorithm algorithm = Algorithm::kSgd;
  float dc_lambda = 0.04f;
  float dc_lambda0 = 2.0f;
  float dc_mean_square_decay = 0.95f;
  int easgd_tau = 4;
  float easgd_alpha = 0.0f;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    const auto in_unit = [](float x) { return x >= 0.0f && x < 1.0f; };
    const auto compensation = [](float x) { return std::isfinite(x) && x >= 0.0f; };
    v.Text("mode", s, ConsistencyModeString, ParseConsistencyMode,
           "expected \"async\", \"sync\" or \"ssp:<s>\" with s >= 0", "\"async\" | \"sync\" | \"ssp:<s>\"",
           "async (Downpour), sync (BSP) or ssp:<s> (a pull waits for the slowest worker within s clocks)");
    v.Key("backup_workers", s.backup_workers, AtLeast(0), "sync only: apply after W - b arrivals");
    v.Key("staleness_aware_lr", s.staleness_aware_lr, "async/ssp: divide lr by the measured staleness (>= 1)");
    v.Named("algorithm", s.algorithm, Names{kAlgorithmNames},
            "sgd (as pushed), dc-asgd / dc-asgd-a (delay compensation), easgd (elastic averaging)");
    v.Key("dc_lambda", s.dc_lambda, Must<float>(compensation, "must be >= 0 and finite (0 = no compensation)"),
          "DC-ASGD: g + λ·g⊙g⊙(w − w_pulled)");
    v.Key("dc_lambda0", s.dc_lambda0, Must<float>(compensation, "must be >= 0 and finite (0 = no compensation)"),
          "DC-ASGD-a: λ = dc_lambda0 / sqrt(ms) per element");
    v.Key("dc_mean_square_decay", s.dc_mean_square_decay, Must<float>(in_unit, "must be in [0, 1)"),
          "DC-ASGD-a: m of ms ← m·ms + (1 − m)·g⊙g");
    v.Key("easgd_tau", s.easgd_tau, AtLeast(1, "steps between exchanges"),
          "EASGD: steps between a worker's exchanges with the center");
    v.Key("easgd_alpha", s.easgd_alpha,
          Must<float>([](float x) { return std::isfinite(x) && x >= 0.0f && x < 1.0f; },
                      "must be in [0, 1) (0 = 0.9 / cluster.workers)"),
          "EASGD: moving rate α; 0 = 0.9 / workers");
  }
  bool operator==(const ConsistencyConfig&) const = default;
};
std::string AlgorithmString(Algorithm a);  // "sgd" | "dc-asgd" | "dc-asgd-a" | "easgd"
bool ParseAlgorithm(std::string_view text, Algorithm* out);  // AlgorithmString's inverse; false for other text
inline bool DelayCompensated(Algorithm a) { return a == Algorithm::kDcAsgd || a == Algorithm::kDcAsgdAdaptive; }
float EasgdAlpha(const ConsistencyConfig& c, int workers);  // easgd_alpha, or 0.9 / workers when it is 0

// worker.conv_algo's values: "search" (timed per layer), "heuristic", or one forced algorithm.
inline const std::vector<std::string> kConvAlgoNames = {"search", "heuristic", "gemm",
                                                        "implicit_gemm", "fft", "winograd"};

struct WorkerConfig;
std::string DeviceString(const WorkerConfig& w);  // "cpu" or "gpu:N"
bool ParseDevice(std::string_view text, WorkerConfig* w);  // "cpu" | "gpu:N" into device and gpu_index

// [worker] — the training loop of one worker.
struct WorkerConfig {
  int batch_size = 64;
  int64_t steps = 1000;
  int epochs = 0;
  int pull_every = 1;
  int push_every = 1;
  int outstanding_steps = 1;
  DeviceKind device = DeviceKind::kCpu;
  int gpu_index = 0;  // N of "gpu:N"
  int threads = 0;
  int straggler = -1;
  int straggler_delay_ms = 0;
  std::vector<float> emulate_ms;
  bool tf32 = true;
  std::string conv_algo = "search";

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("batch_size", s.batch_size, AtLeast(1), "images per step");
    v.Key("steps", s.steps, AtLeast<int64_t>(1), "steps per worker; epochs > 0 takes precedence");
    v.Key("epochs", s.epochs, AtLeast(0, "0 = use steps"), "passes over this worker's shard; 0 = use steps");
    v.Key("pull_every", s.pull_every, AtLeast(1), "n_fetch: pull weights every n steps");
    v.Key("push_every", s.push_every, AtLeast(1), "n_push: push accumulated gradients every n steps");
    // 1 = the last step's, whose pulls its forward waits for layer by layer; in async runs k > 1
    // lets a step's weights lack its own pushes of the k - 1 steps before
    // (client/worker/pull_ahead.h). Sync and ssp keep their servers' guarantees.
    v.Key("outstanding_steps", s.outstanding_steps,
          InRange(1, kMaxOutstandingSteps, "steps of pushes a step may start with unacknowledged"),
          "steps of this worker's pushes that may be outstanding when a step starts");
    v.Text("device", s, DeviceString, ParseDevice, "expected \"cpu\" or \"gpu:N\"", "\"cpu\" | \"gpu:N\"",
           "where the worker computes");
    v.Key("threads", s.threads, AtLeast(0, "0 = all cores"), "CPU compute threads; 0 = all cores");
    v.Key("straggler", s.straggler, "emulated straggler: this worker sleeps after each step; -1 = none");
    v.Key("straggler_delay_ms", s.straggler_delay_ms, InRange(0, 60000), "the straggler's sleep per step");
    v.Key("emulate_ms", s.emulate_ms,
          Must<std::vector<float>>(
              [](const std::vector<float>& ms) {
                for (float m : ms) {
                  if (!(std::isfinite(m) && m >= 0 && m <= 60000)) return false;
                }
                return true;
              },
              "every value must be in 0..60000 ms"),
          "emulated compute (docs/scaling.md): forward and backward ms per layer; empty = off");
    v.Key("tf32", s.tf32, "GPU: TF32 tensor cores for fp32 convolutions/GEMMs (off = exact fp32)");
    v.Key("conv_algo", s.conv_algo,
          Must<std::string>(
              [](const std::string& a) {
                return std::find(kConvAlgoNames.begin(), kConvAlgoNames.end(), a) != kConvAlgoNames.end();
              },
              "expected search, heuristic, gemm, implicit_gemm, fft or winograd"),
          "GPU: how cuDNN picks convolution algorithms");
  }
  bool operator==(const WorkerConfig&) const = default;
};

enum class DataSharding {
  kSlice,  // worker j of W reads slice j of the shared train set (data/shard.h)
  kOwn,    // worker j reads its own LMDB under <train> (OwnShardPath)
};
inline constexpr std::string_view kDataShardingNames[] = {"slice", "own"};

// [data] — the training and test sets and their augmentation.
struct DataConfig {
  std::string train = "data-sets/fashion-mnist/train_lmdb";
  std::string test = "data-sets/fashion-mnist/test_lmdb";
  DataSharding sharding = DataSharding::kSlice;
  int crop = 0;
  int pad = 0;
  bool mirror = false;
  std::string mean_file;
  std::vector<float> mean_values;
  float scale = 0.00390625f;
  int prefetch = 4;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("train", s.train, "train LMDB path");
    v.Key("test", s.test, "test LMDB path; \"\" = no test set");
    v.Named("sharding", s.sharding, Names{kDataShardingNames}, "slice of the shared set, or each worker's own LMDB");
    v.Key("crop", s.crop, AtLeast(0, "0 = no crop"), "random crop side (center crop at test); 0 = no crop");
    v.Key("pad", s.pad, InRange(0, 64, "0 = no padding"), "training: crop from the record padded this much each side");
    v.Key("mirror", s.mirror, "random horizontal flips during training");
    v.Key("mean_file", s.mean_file, "mean image to subtract (tensor file or .binaryproto); \"\" = none");
    v.Key("mean_values", s.mean_values,
          Must<std::vector<float>>(
              [](const std::vector<float>& m) { return std::all_of(m.begin(), m.end(), [](float x) { return std::isfinite(x); }); },
              "must be finite"),
          "per-channel means instead: 1 value or one per channel (BGR); [] = none");
    v.Key("scale", s.scale, FinitePositive<float>(), "multiply pixels after mean subtraction");
    v.Key("prefetch", s.prefetch, AtLeast(1), "batches the loader keeps ready");
  }
  bool operator==(const DataConfig&) const = default;
};

// With data.sharding = "own": <train>/shard_<worker>_of_<workers> if it exists, else <train>/<worker>.
std::string OwnShardPath(const DataConfig& data, int worker, int workers);

// [eval] — periodic test-set evaluation (by the evaluator process, or worker 0; docs/operations.md
// "The evaluator").
struct EvalConfig {
  bool evaluator = true;
  int64_t every_steps = 500;
  int64_t every_updates = 0;
  double every_seconds = 0.0;
  int test_batches = 0;
  bool at_start = false;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("evaluator", s.evaluator, "a distributed run evaluates in downpour-evaluator; false = worker 0 does");
    v.Key("every_steps", s.every_steps, AtLeast<int64_t>(0, "0 = off"), "evaluate every n steps; 0 = off");
    v.Key("every_updates", s.every_updates, AtLeast<int64_t>(0, "0 = every_steps x cluster.workers"),
          "the evaluator: every n worker batches the servers applied; 0 = every_steps x workers");
    v.Key("every_seconds", s.every_seconds, FiniteNonNegative<double>("0 = off"),
          "and/or every t seconds of wall time; 0 = off");
    v.Key("test_batches", s.test_batches, AtLeast(0, "0 = whole test set"), "batches per evaluation; 0 = all");
    v.Key("at_start", s.at_start, "also evaluate the starting weights before the first step");
  }
  bool operator==(const EvalConfig&) const = default;
};

// How a write-ahead log's bytes reach the disk (server/wal.h).
enum class WalIo {
  kAuto,      // O_DIRECT where the filesystem takes it (tried at Open), else buffered
  kBuffered,  // write(2) through the page cache
  kDirect,    // O_DIRECT, or an error at Open naming the log
};
inline constexpr std::string_view kWalIoNames[] = {"auto", "buffered", "direct"};

// [checkpoint] — a server shard's durability: checkpoints (common/tensor_file.h format) and the
// write-ahead log (server/wal.h). ShardOptions embeds it.
struct CheckpointConfig {
  int64_t every_updates = 1000;
  std::string dir = "checkpoints";
  bool wal = true;
  int wal_fsync_ms = 200;
  int64_t wal_max_mb = 2048;
  WalIo wal_io = WalIo::kAuto;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("every_updates", s.every_updates, AtLeast<int64_t>(0, "0 = off"),
          "a shard checkpoints every n rounds of updates of its chunks; 0 = off");
    v.Key("dir", s.dir, NonEmpty(), "where checkpoints go; relative paths are inside the run directory");
    v.Key("wal", s.wal, "write-ahead log per shard: acknowledged updates survive a server's death");
    v.Key("wal_fsync_ms", s.wal_fsync_ms, AtLeast(0, "0 = fsync before every acknowledgement"),
          "fsync the log at least this often; 0 = before every ack");
    v.Key("wal_max_mb", s.wal_max_mb,
          Must<int64_t>([](int64_t x) { return x >= 1 && x <= (int64_t{1} << 30); },
                        "must be between 1 and 2^30 MiB"),
          "a log reaching this many MiB checkpoints its shard, which empties it");
    v.Named("wal_io", s.wal_io, Names{kWalIoNames}, "how the log writes: O_DIRECT where the filesystem takes it");
  }
  bool operator==(const CheckpointConfig&) const = default;
};
// checkpoint.wal_max_mb in bytes.
inline uint64_t WalMaxBytes(const CheckpointConfig& c) { return static_cast<uint64_t>(c.wal_max_mb) << 20; }

// [compression] — fewer bytes on the wire (common/grad_codec.h, docs/compression.md).
enum class WireCodec {
  kFp32,    // dense f32 (lossless)
  kFp16,    // dense IEEE half (gradients / pulled weights; masters stay f32 on the server)
  kBf16,    // dense bfloat16
  kTopK,    // the top_k_fraction largest |g| per chunk, with error feedback (push only)
  kOneBit,  // sign × per-chunk scale (mean |g|), with error feedback (push only)
};
// The wire codecs, in WireCodec's order; the first kDenseWireCodecs (fp32, fp16, bf16) are dense.
inline constexpr std::string_view kWireCodecNames[] = {"fp32", "fp16", "bf16", "topk", "onebit"};
inline constexpr size_t kDenseWireCodecs = 3;
const char* WireCodecName(WireCodec codec);  // "fp32" | "fp16" | "bf16" | "topk" | "onebit"
bool ParseWireCodec(std::string_view text, WireCodec* out);  // false if unknown

struct CompressionConfig {
  bool factors = false;
  WireCodec push = WireCodec::kFp32;
  WireCodec pull = WireCodec::kFp32;
  double top_k_fraction = 0.01;
  int64_t top_k_warmup_pushes = 0;
  bool error_feedback = true;
  int factor_threads = 1;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("factors", s.factors, "inner-product layers push sufficient factors when fewer floats (docs/factors.md)");
    v.Named("push", s.push, Names{kWireCodecNames}, "codec of the gradient chunks sent dense");
    v.Named("pull", s.pull, Names{kWireCodecNames, kDenseWireCodecs}, "codec of pulled weights: fp32 | fp16 | bf16");
    v.Key("top_k_fraction", s.top_k_fraction,
          Must<double>([](double x) { return x > 0 && x <= 1; }, "must be in (0, 1]"),
          "push = \"topk\": fraction of each chunk sent");
    v.Key("top_k_warmup_pushes", s.top_k_warmup_pushes, AtLeast<int64_t>(0, "0 = no warm-up"),
          "push = \"topk\": pushes per chunk of decaying warm-up fraction; 0 = none");
    v.Key("error_feedback", s.error_feedback, "topk / onebit: add what was not sent to the next gradient");
    v.Key("factor_threads", s.factor_threads, InRange(1, kMaxFactorThreads),
          "factors: threads per server shard forming δᵀ·a");
  }
  bool operator==(const CompressionConfig&) const = default;
};

// [security] — CurveZMQ keys and the loopback run secret (common/security.h).
struct SecurityConfig {
  std::string keys = "";
  bool insecure = false;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    v.Key("keys", s.keys, "directory made by downpour-keys; \"\" = no CurveZMQ (loopback only)");
    v.Key("insecure", s.insecure, "allow binding off-host without keys (trusted networks only)");
  }
  bool operator==(const SecurityConfig&) const = default;
};

// [[models]] — one entry per model trained on one set of servers (docs/multi_model.md); a
// [sweep] of kSweepKeys expands to one entry per point of its lists' cross product. Model id k
// (the wire's header.model_id) is the entry's index; everything but model and solver is the run's.
struct ModelEntry {
  std::string name;     // unique; letters, digits and _ . = + - only (used in file names)
  std::string config;   // model TOML; TOML default: [model].config
  SolverConfig solver;  // [solver], with the entry's own [models.solver] keys over it
  bool operator==(const ModelEntry&) const = default;
};
inline constexpr std::string_view kSweepKeys[] = {"solver.base_lr",      "solver.weight_decay", "solver.momentum",
                                                  "solver.gamma",        "solver.power",        "solver.clip_gradients",
                                                  "solver.max_iter",     "model.config"};

// How the workers of a multi-model run share the K models ([rotation] scheme).
enum class RotationScheme {
  kPipeline,     // models move, data stays: in stage t worker i trains model (i + t) mod K
  kSequential,   // the K models one after another, each data-parallel over all W workers
  kIndependent,  // K one-worker jobs on the whole training set; job k runs on worker k mod W
};
inline constexpr std::string_view kRotationSchemeNames[] = {"pipeline", "sequential", "independent"};
const char* RotationSchemeName(RotationScheme scheme);  // "pipeline" | "sequential" | "independent"

// How a pipeline's holders of one model in one stage train it when K < W ([rotation] groups).
enum class RotationGroups {
  kDataParallel,  // together through the servers, per step, in the run's consistency mode
  kAverage,       // local SGD on each holder's copy; the model moves on as the copies' average
};
inline constexpr std::string_view kRotationGroupsNames[] = {"data_parallel", "average"};
const char* RotationGroupsName(RotationGroups groups);  // "data_parallel" | "average"

// [rotation] — the schedule of a multi-model run (ignored without [[models]]).
struct RotationConfig {
  RotationScheme scheme = RotationScheme::kPipeline;
  int passes = 1;
  int64_t stage_steps = 0;
  RotationGroups groups = RotationGroups::kDataParallel;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Named("scheme", s.scheme, Names{kRotationSchemeNames}, "how the workers share the K models");
    v.Key("passes", s.passes, AtLeast(1), "epochs each model is trained (pipeline: passes x K stages)");
    v.Key("stage_steps", s.stage_steps, AtLeast<int64_t>(0, "0 = one pass over the partition"),
          "each worker's batches on one model per stage; 0 = one pass over its partition");
    v.Named("groups", s.groups, Names{kRotationGroupsNames}, "pipeline with K < W: how a model's holders train it");
  }
  bool operator==(const RotationConfig&) const = default;
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  ClusterConfig cluster;
  SolverConfig solver;
  ConsistencyConfig consistency;
  WorkerConfig worker;
  DataConfig data;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  SecurityConfig security;
  CompressionConfig compression;
  std::vector<ModelEntry> models;  // [[models]] / [sweep]; empty = one model ([model], [solver])
  RotationConfig rotation;

  // The tables that have rows, in the order ToToml writes them: v.Section("run", c.run), ...
  template <typename Self, typename V>
  static void Sections(Self& c, V& v) {
    v.Section("run", c.run);
    v.Section("model", c.model);
    v.Section("cluster", c.cluster);
    v.Section("solver", c.solver);
    v.Section("consistency", c.consistency);
    v.Section("worker", c.worker);
    v.Section("data", c.data);
    v.Section("eval", c.eval);
    v.Section("checkpoint", c.checkpoint);
    v.Section("security", c.security);
    v.Section("compression", c.compression);
    v.Section("rotation", c.rotation);
  }
  bool operator==(const RunConfig&) const = default;
};

// One key of the run config as its row describes it, for references and listings.
struct ConfigKey {
  std::string key;            // "cluster.servers"
  std::string type;           // TOML type: "integer", "float", "boolean", "string", "array of integers", ...
  std::string default_value;  // the default as TOML ("1", "\"tcp\""); "" for an optional key (absent = off)
  std::string doc;            // the row's one-line doc
  std::string choices;        // an enum's or a text key's accepted values, e.g. "\"tcp\" | \"ipc\""; else ""
};
// Every key of every table, in ToToml's order.
std::vector<ConfigKey> RunConfigKeys();

// Reads and validates the TOML file at `path`. On error `out` is unspecified.
Status LoadRunConfig(const std::string& path, RunConfig* out);
// Same, with --set overrides "section.key=value" applied first (a value that is not valid TOML
// is a bare string); an error about an overridden key names its flag.
Status LoadRunConfig(const std::string& path, const std::vector<std::string>& sets, RunConfig* out);
// Same, from text; `source_name` names the text in errors (usually the file path).
Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, RunConfig* out);
Status ParseRunConfig(std::string_view toml_text, const std::string& source_name,
                      const std::vector<std::string>& sets, RunConfig* out);
// Checks the cross-field rules of a config built or changed in code. `overridden` maps
// "table.key" to the --set text that gave it (errors then name the flag).
Status ValidateRunConfig(const RunConfig& config, const std::string& source_name);
Status ValidateRunConfig(const RunConfig& config, const std::string& source_name,
                         const std::map<std::string, std::string>& overridden);
// Settings that work but are probably a mistake, one line each naming the key and why: for now
// cluster.chunk_elems frames of kLargeFrameBytes or more (docs/config.md, cluster.chunk_elems).
std::vector<std::string> RunConfigWarnings(const RunConfig& config);
inline constexpr int64_t kLargeFrameBytes = int64_t{32} << 20;  // see RunConfigWarnings

// Every field, as TOML that ParseRunConfig reads back to an equal RunConfig.
std::string ToToml(const RunConfig& config);

// config.solver with a poly max_iter of 0 resolved to the run's planned worker batches
// (worker.steps × cluster.workers; `local`: worker.steps).
SolverConfig RunSolver(const RunConfig& config, bool local = false);

// Whether a distributed run has an evaluator process (then worker 0 does not evaluate):
// eval.evaluator, a test set, and one model.
bool RunHasEvaluator(const RunConfig& config);
// Model `model`'s solver in a multi-model run, a poly max_iter of 0 resolved to its planned
// batches (rotation.passes × cluster.workers × rotation.stage_steps).
SolverConfig ModelSolver(const RunConfig& config, int model);
// The run config as model `model` of a multi-model run sees it: its [model].config, no [[models]].
RunConfig ModelRunConfig(const RunConfig& config, int model);
// eval.every_updates, or every_steps × cluster.workers when it is 0 (0: none update-driven).
int64_t EvaluatorEveryUpdates(const RunConfig& config);

}  // namespace downpour
