// run_config.h — RunConfig, the typed form of the TOML file that describes a training run, and
// its loader. Each field's default is its initializer; its meaning is the comment beside it, and
// docs/config.md describes every key in full. Loading rejects unknown tables and keys, wrong
// types and out-of-range values with one error naming the file, the table.key and the value.
//
// Thread-safety: plain value types; the free functions are reentrant.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/device.h"
#include "common/status.h"

namespace downpour {

// [run] — naming and reproducibility.
struct RunSection {
  std::string name = "run";     // run name; the launcher's default run dir is <out_dir>/<name>-<time>
  std::string out_dir = "runs"; // root of run directories (relative to the launcher's cwd)
  int64_t seed = 1;             // base RNG seed (>= 0); process k derives its own from it
  bool operator==(const RunSection&) const = default;
};

// [model] — which net to train.
struct ModelSection {
  std::string config = "configs/models/fmnist_small.toml";  // model TOML (client/engine NetSpec)
  // Initial weights (tensor file or .caffemodel) for the tensors it holds, instead of fillers; "" = none.
  std::string weights;
  bool operator==(const ModelSection&) const = default;
};

// How a job's servers are reached (cluster.transport).
enum class ClusterTransport {
  kTcp,  // tcp://<bind>:<base_port + i> (the coordinator always uses tcp)
  kIpc,  // ipc://<ipc_dir>/server-<i>.sock: Unix domain sockets, every process on one host
};
const char* ClusterTransportName(ClusterTransport transport);  // "tcp" | "ipc"

// In what order a server's replies take its emulated link (cluster.reply_order).
enum class ReplyOrder {
  kArrival,  // as the server made them: workers asking at once get theirs interleaved
  kStep,     // a worker's pull replies for one step together, the step asked for first ahead
};
const char* ReplyOrderName(ReplyOrder order);  // "arrival" | "step"

// [cluster] — processes and endpoints of one job.
struct ClusterConfig {
  int servers = 1;                          // S parameter-server shards (>= 1)
  int workers = 1;                          // W workers (>= 1)
  std::string coordinator = "127.0.0.1:5555";  // host:port of the coordinator's endpoint
  int base_port = 5600;                     // server i listens on base_port + i
  std::string bind = "127.0.0.1";           // address servers and coordinator bind; loopback unless told otherwise
  std::string advertise = "";  // address others reach this host's endpoints at; "" = derived (docs/config.md)
  int heartbeat_ms = 500;                   // interval between heartbeats (> 0)
  int heartbeat_timeout_ms = 5000;          // peer declared dead after this silence (> heartbeat_ms)
  int64_t chunk_elems = int64_t{1} << 20;   // floats per layout chunk, one payload frame (docs/config.md)
  // Restarts of a dead server / coordinator over the job (>= 0); one more death fails the job
  // (docs/operations.md "When a process dies").
  int server_restarts = 3;
  int coordinator_restarts = 3;
  // Restarts (--resume) of a dead worker (>= 0); 0 = the job goes on without it.
  int restart_workers = 0;
  // How long a worker waits for a server that answers nothing before it fails (> heartbeat_timeout_ms).
  int server_wait_ms = 120000;
  // Worker ids accepted: 0..max_workers-1, ids >= workers joining a running job; 0 = workers.
  int max_workers = 0;
  // MiB of replies a server queues for a peer that does not read; past it the peer is dropped.
  int peer_queue_mb = 256;
  // Apply lanes of each server shard (1..kMaxServerThreads): threads owning its chunks' updates.
  int server_threads = 1;
  // ZeroMQ I/O threads of each process's transport (1..kMaxIoThreads): TCP framing in parallel.
  int io_threads = 2;
  // Connections each worker opens to each server (1..kMaxConnectionsPerServer), its chunks dealt
  // over them, so one TCP stream is not the cap; 1 with shared memory or sufficient factors.
  int connections_per_server = 1;
  // How workers reach the servers: "tcp" or "ipc" (one host only; docs/operations.md "One host: ipc").
  ClusterTransport transport = ClusterTransport::kTcp;
  // ipc: directory of the servers' sockets; "" = the run directory, relative = inside it.
  std::string ipc_dir = "";
  // Same-host payloads through shared memory instead of the socket (off with link_gbps).
  bool shared_memory = true;
  // Emulated link (experiments): every process's egress paced to this many Gbit/s; 0 = off.
  double link_gbps = 0;
  // Order of a server's replies on an emulated link ("step" needs link_gbps; docs/emulated_links.md).
  ReplyOrder reply_order = ReplyOrder::kArrival;
  // Trace events each server and worker keeps (docs/operations.md "Timelines"); 0 = off, <= kMaxTraceEvents.
  int64_t trace_events = 0;
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
const char* LrPolicyName(LrPolicy policy);
// Parses "fixed" | "step" | "multistep" | "poly" | "inv" | "exp"; false if unknown.
bool ParseLrPolicy(std::string_view text, LrPolicy* out);

// solver.update: the rule a gradient changes the weights by (common/solver/update_rule.h).
enum class UpdateRuleKind {
  kMomentum,  // "momentum": SGD with momentum and L2 weight decay (Caffe's SGDSolver)
  kAdaGrad,   // "adagrad": lr / sqrt(Σ g² + epsilon) per element (Duchi et al.; DistBelief's servers)
};
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

// [solver] — the server-side optimizer: SGD with momentum, Caffe's semantics.
struct SolverConfig {
  float base_lr = 0.01f;             // > 0
  LrPolicy lr_policy = LrPolicy::kFixed;
  float gamma = 0.1f;                // decay factor for step/multistep/exp; rate for inv (> 0)
  float power = 1.0f;                // exponent for poly and inv (>= 0)
  int64_t stepsize = 1000;           // iterations per step for "step" (> 0)
  std::vector<int64_t> stepvalues;   // strictly increasing iterations for "multistep" (non-empty then)
  int64_t max_iter = 10000;          // horizon of "poly": lr reaches 0 at iter = max_iter (>= 0;
                                     // 0 = the run's planned worker batches, RunSolver)
  float momentum = 0.9f;             // in [0, 1)
  float weight_decay = 0.0005f;      // L2 coefficient (>= 0), times each tensor's decay_mult
  float clip_gradients = -1.0f;      // global L2-norm threshold, applied by each worker to its
                                     // gradient before pushing (Caffe's); <= 0 turns it off
  UpdateRuleKind update = UpdateRuleKind::kMomentum;
  float adagrad_epsilon = 1e-10f;    // AdaGrad: lr / sqrt(acc + epsilon) (> 0)
  float adagrad_initial = 0.1f;      // AdaGrad: each accumulator's start (>= 0)
  bool operator==(const SolverConfig&) const = default;
};

enum class ConsistencyMode {
  kAsync,  // Downpour: apply every gradient on arrival
  kSync,   // BSP: average all live workers' gradients for clock t, apply once
  kSsp,    // bounded staleness: a pull at clock c waits for the slowest worker to reach c - s
};

// [consistency]
// How a server turns a pushed gradient into its update (TOML consistency.algorithm).
enum class Algorithm {
  kSgd,     // "sgd": the gradient as pushed (Downpour / BSP / SSP, by mode)
  kDcAsgd,  // "dc-asgd": delay compensation, Zheng et al. 2017 (async / ssp), constant λ
  kDcAsgdAdaptive,  // "dc-asgd-a": the same with λ / sqrt(mean square of g), per element
  kEasgd,   // "easgd": elastic averaging, Zhang, Choromanska, LeCun 2015 (async)
};

struct ConsistencyConfig {
  ConsistencyMode mode = ConsistencyMode::kAsync;  // TOML: mode = "async" | "sync" | "ssp:<s>"
  int staleness_bound = 0;          // s of "ssp:<s>" (>= 0); 0 for async and sync
  int backup_workers = 0;           // sync only: apply after W - b arrivals (0 <= b < W)
  bool staleness_aware_lr = false;  // async/ssp: divide lr by the measured staleness (>= 1)
  Algorithm algorithm = Algorithm::kSgd;  // TOML: algorithm = "sgd" | "dc-asgd" | "dc-asgd-a" | "easgd"
  float dc_lambda = 0.04f;            // DC-ASGD: g + λ·g⊙g⊙(w − w_pulled) (>= 0; 0 = none)
  // DC-ASGD-a: λ = dc_lambda0 / sqrt(ms) per element, ms ← m·ms + (1 − m)·g⊙g (docs/algorithms.md).
  float dc_lambda0 = 2.0f;            // >= 0
  float dc_mean_square_decay = 0.95f; // m, in [0, 1)
  int easgd_tau = 4;                  // EASGD: steps between a worker's exchanges with the center (>= 1)
  float easgd_alpha = 0.0f;           // EASGD: moving rate α in (0, 1); 0 = 0.9 / workers
  bool operator==(const ConsistencyConfig&) const = default;
};
// "async", "sync" or "ssp:<s>".
std::string ConsistencyModeString(const ConsistencyConfig& c);
std::string AlgorithmString(Algorithm a);  // "sgd" | "dc-asgd" | "dc-asgd-a" | "easgd"
bool ParseAlgorithm(std::string_view text, Algorithm* out);  // AlgorithmString's inverse; false for other text
inline bool DelayCompensated(Algorithm a) { return a == Algorithm::kDcAsgd || a == Algorithm::kDcAsgdAdaptive; }
float EasgdAlpha(const ConsistencyConfig& c, int workers);  // easgd_alpha, or 0.9 / workers when it is 0

// [worker] — the training loop of one worker.
struct WorkerConfig {
  int batch_size = 64;          // images per step (>= 1)
  int64_t steps = 1000;         // steps per worker (>= 1); epochs > 0 takes precedence
  int epochs = 0;               // passes over this worker's shard; 0 = use steps
  int pull_every = 1;           // n_fetch: pull weights every n steps (>= 1)
  int push_every = 1;           // n_push: push accumulated gradients every n steps (>= 1)
  // Steps of this worker's pushes that may be outstanding when a step starts (1..16): 1 = the
  // last step's, whose pulls its forward waits for layer by layer; in async runs k > 1 lets a
  // step's weights lack its own pushes of the k - 1 steps before (client/worker/pull_ahead.h).
  // Sync and ssp keep their servers' guarantees.
  int outstanding_steps = 1;
  DeviceKind device = DeviceKind::kCpu;  // TOML: device = "cpu" | "gpu:N"
  int gpu_index = 0;            // N of "gpu:N" (>= 0)
  int threads = 0;              // CPU compute threads; 0 = all cores
  int straggler = -1;           // emulated straggler (experiments): this worker sleeps after each step; -1 = none
  int straggler_delay_ms = 0;   // the straggler's sleep per step
  // Emulated compute (docs/scaling.md): forward and backward ms per layer, in net order (2 ×
  // layers values); the worker sleeps instead of computing (zero gradients). Empty = off.
  std::vector<float> emulate_ms;
  bool tf32 = true;             // GPU: TF32 tensor cores for fp32 convolutions/GEMMs (off = exact fp32)
  std::string conv_algo = "search";  // GPU: how cuDNN picks convolution algorithms (kConvAlgoNames)
  bool operator==(const WorkerConfig&) const = default;
};
std::string DeviceString(const WorkerConfig& w);  // "cpu" or "gpu:N"
// worker.conv_algo's values: "search" (timed per layer), "heuristic", or one forced algorithm.
inline const std::vector<std::string> kConvAlgoNames = {"search", "heuristic", "gemm",
                                                        "implicit_gemm", "fft", "winograd"};

enum class DataSharding {
  kSlice,  // worker j of W reads slice j of the shared train set (data/shard.h)
  kOwn,    // worker j reads its own LMDB under <train> (OwnShardPath)
};

// [data]
struct DataConfig {
  std::string train = "data-sets/fashion-mnist/train_lmdb";  // train LMDB path
  std::string test = "data-sets/fashion-mnist/test_lmdb";    // test LMDB path; "" = no test set
  DataSharding sharding = DataSharding::kSlice;  // TOML: sharding = "slice" | "own"
  int crop = 0;              // random crop side (center crop at test); 0 = no crop
  int pad = 0;               // training: crop from the record padded this much each side (0 in the input); 0..64
  bool mirror = false;       // random horizontal flips during training
  std::string mean_file;     // mean image to subtract (tensor file or .binaryproto); "" = none
  std::vector<float> mean_values;  // per-channel means instead: 1 value or one per channel (BGR); [] = none
  float scale = 0.00390625f; // multiply pixels after mean subtraction (1/256, Caffe's MNIST)
  int prefetch = 4;          // batches the loader keeps ready (>= 1)
  bool operator==(const DataConfig&) const = default;
};

// With data.sharding = "own": <train>/shard_<worker>_of_<workers> if it exists, else <train>/<worker>.
std::string OwnShardPath(const DataConfig& data, int worker, int workers);

// [eval] — periodic test-set evaluation (by the evaluator process, or worker 0).
struct EvalConfig {
  // true = a distributed run evaluates in downpour-evaluator (docs/operations.md "The
  // evaluator"); false = worker 0 evaluates between its steps.
  bool evaluator = true;
  int64_t every_steps = 500;   // evaluate every n steps (worker 0; the evaluator: every_updates); 0 = off
  // The evaluator: every n worker batches the servers applied; 0 = every_steps × cluster.workers.
  int64_t every_updates = 0;
  double every_seconds = 0.0;  // and/or every t seconds of wall time; 0 = off
  int test_batches = 0;        // batches per evaluation; 0 = the whole test set
  bool at_start = false;       // also evaluate the starting weights before the first step
  bool operator==(const EvalConfig&) const = default;
};

// [checkpoint] — server shard checkpoints (common/tensor_file.h format).
struct CheckpointConfig {
  int64_t every_updates = 1000;     // a shard checkpoints every n rounds of updates of its chunks; 0 = off
  std::string dir = "checkpoints";  // relative paths are inside the run directory
  // Write-ahead log per shard (server/wal.h): acknowledged updates survive a server's death.
  // Off = checkpoints only: the updates since the last one die with the server.
  bool wal = true;
  int wal_fsync_ms = 200;  // fsync the log at least this often (>= 0); 0 = before every ack
  // A shard whose log reaches this many MiB checkpoints, which empties it (>= 1); its disk needs
  // room for that and two checkpoints at the server's start.
  int64_t wal_max_mb = 2048;
  bool operator==(const CheckpointConfig&) const = default;
};

// [compression] — fewer bytes on the wire (common/grad_codec.h, docs/compression.md).
enum class WireCodec {
  kFp32,    // dense f32 (lossless)
  kFp16,    // dense IEEE half (gradients / pulled weights; masters stay f32 on the server)
  kBf16,    // dense bfloat16
  kTopK,    // the top_k_fraction largest |g| per chunk, with error feedback (push only)
  kOneBit,  // sign × per-chunk scale (mean |g|), with error feedback (push only)
};
const char* WireCodecName(WireCodec codec);  // "fp32" | "fp16" | "bf16" | "topk" | "onebit"
bool ParseWireCodec(std::string_view text, WireCodec* out);  // false if unknown

// Largest accepted values: a typo is refused rather than started.
inline constexpr int kMaxServerThreads = 64;            // cluster.server_threads
inline constexpr int kMaxIoThreads = 16;                // cluster.io_threads
inline constexpr int kMaxConnectionsPerServer = 8;      // cluster.connections_per_server
inline constexpr int64_t kMaxTraceEvents = 10'000'000;  // cluster.trace_events
inline constexpr int kMaxFactorThreads = 64;            // compression.factor_threads

struct CompressionConfig {
  bool factors = false;  // inner-product layers push sufficient factors when fewer floats (docs/factors.md)
  WireCodec push = WireCodec::kFp32;  // codec of the gradient chunks sent dense
  WireCodec pull = WireCodec::kFp32;  // codec of pulled weights: fp32 | fp16 | bf16
  double top_k_fraction = 0.01;       // push = "topk": fraction of each chunk sent, in (0, 1]
  int64_t top_k_warmup_pushes = 0;    // push = "topk": pushes per chunk of decaying warm-up fraction; 0 = none
  bool error_feedback = true;         // topk / onebit: add what was not sent to the next gradient
  int factor_threads = 1;             // factors: threads per server shard forming δᵀ·a (1..kMaxFactorThreads)
  bool operator==(const CompressionConfig&) const = default;
};

// [security] — CurveZMQ keys and the loopback run secret (common/security.h).
struct SecurityConfig {
  std::string keys = "";  // directory made by downpour-keys; "" = no CurveZMQ (loopback only)
  bool insecure = false;  // allow binding off-host without keys (trusted networks only)
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
const char* RotationSchemeName(RotationScheme scheme);  // "pipeline" | "sequential" | "independent"

// How a pipeline's holders of one model in one stage train it when K < W ([rotation] groups).
enum class RotationGroups {
  kDataParallel,  // together through the servers, per step, in the run's consistency mode
  kAverage,       // local SGD on each holder's copy; the model moves on as the copies' average
};
const char* RotationGroupsName(RotationGroups groups);  // "data_parallel" | "average"

// [rotation] — the schedule of a multi-model run (ignored without [[models]]).
struct RotationConfig {
  RotationScheme scheme = RotationScheme::kPipeline;
  int passes = 1;          // epochs each model is trained (pipeline: passes × K stages)
  int64_t stage_steps = 0;  // each worker's batches on one model per stage; 0 = one pass over its partition
  RotationGroups groups = RotationGroups::kDataParallel;  // pipeline with K < W: how holders train
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
  bool operator==(const RunConfig&) const = default;
};

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
