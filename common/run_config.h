// run_config.h — the typed run configuration: one TOML file describes a whole training run
// (cluster shape, solver, consistency model, worker loop, data, evaluation, checkpoints).
//
// It is loaded once, by the launcher and by every process it starts (they all read the
// config.toml the launcher stored in the run directory), and then passed around as a value.
// Every field's default is documented where it is declared. Loading rejects unknown tables,
// unknown keys, wrong types and out-of-range values with one error that names the file,
// the table.key and the offending value, e.g.
//   configs/runs/x.toml: solver.lr_policy = "cosine": expected "fixed", "step", ...
//
// Policies (lr policy, consistency mode, sharding, device) are enums parsed here, once, so
// nothing downstream compares strings.
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
  // Initial weights instead of the model's fillers ("" = fillers): a downpour tensor file
  // (a run's model_final.dpt, downpour-caffe import-weights) or a Caffe .caffemodel. Every
  // worker loads it before its first push, so the servers start from it (fine-tuning);
  // tensors the file lacks keep their fillers (e.g. a renamed last layer for new classes).
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
  int64_t chunk_elems = int64_t{1} << 20;   // layout chunk size in floats (4 MiB frames; DESIGN.md)
  // Faults (docs/operations.md "When a process dies"). The launcher restarts a dead server from
  // its latest checkpoint and write-ahead log, and a dead coordinator, at most this many times
  // each over the job (>= 0); one more death fails the job.
  int server_restarts = 3;
  int coordinator_restarts = 3;
  // A dead worker is restarted (--resume, from its saved progress) at most this many times per
  // worker (>= 0); 0 = the job goes on without it (launcher --restart-workers N overrides).
  int restart_workers = 0;
  // How long a worker waits for a server it cannot reach (dead, restarting) before it fails,
  // saying "waiting for server i (restarting)" every few seconds meanwhile (> heartbeat_timeout_ms).
  int server_wait_ms = 120000;
  // Worker ids the coordinator accepts: 0..max_workers-1. Ids >= workers are workers that join a
  // running job (elastic). 0 = workers (no joiners). Bounds the coordinator's tables.
  int max_workers = 0;
  // Replies a server queues for one peer whose connection is full (it does not read), in MiB;
  // past it the peer is dropped and counted (a client that never reads cannot stall a server).
  int peer_queue_mb = 256;
  // Threads each server shard spreads its element-wise work over (1..kMaxServerThreads): the
  // update of a pushed chunk, the finite check of a pushed gradient, the fp16/bf16 conversion of
  // pulled weights. Element-wise, so every float is the same whatever the count. 1 = the shard's
  // message loop does it all; give a server host's spare cores (docs/config.md).
  int server_threads = 1;
  // How workers reach the servers: "tcp" or "ipc" (one host only: refused with a non-loopback
  // cluster.bind here, and by the launcher for a job whose tasks span hosts).
  ClusterTransport transport = ClusterTransport::kTcp;
  // With transport = "ipc": the directory of the servers' socket files server-<i>.sock; "" = the
  // run directory; a relative path is taken inside the run directory. A socket path must fit in
  // 107 bytes (sun_path): the launcher refuses a longer one naming this key (no silent fallback).
  std::string ipc_dir = "";
  // Same-host payloads through shared memory instead of the socket (ShardOptions::shared_memory
  // on the servers, PsClientOptions::shared_memory on the workers); servers on another host are
  // used over the socket whatever this says.
  bool shared_memory = true;
  // Emulated link (experiments only): every process's egress is paced to this many Gbit/s in
  // the transport (common/zmq_transport.h), so one machine can show a job at 1, 10 or 25 Gbit/s
  // per host. 0 = off (the default). Setting it turns shared memory off (it would bypass the link).
  double link_gbps = 0;
  // With an emulated link: the order in which each server's replies take it. "step" hands the
  // link to one worker's pull replies of a step before the next worker's (the step whose first
  // pull arrived first goes first), and the server's loop handles waiting messages in the same
  // order, so workers that ask at once do not all wait for the last byte; it needs link_gbps (a
  // real network's NIC interleaves flows; not implemented there).
  ReplyOrder reply_order = ReplyOrder::kArrival;
  // Timelines (docs/operations.md "Timelines"): each server and worker keeps its first this many
  // trace events (what its loop or training thread did, each message's wait for the link and
  // for its reply) and writes them as <run_dir>/trace/<role>-<id>.json when it exits. 0 = off
  // (the default); at most kMaxTraceEvents (about 130 bytes of memory per event).
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

// The socket file of server `server` with cluster.transport = "ipc": <ipc_dir>/server-<i>.sock,
// ipc_dir "" = `run_dir`, a relative ipc_dir inside `run_dir`.
std::string ServerIpcPath(const ClusterConfig& cluster, const std::string& run_dir, int server);
// The address server `server` binds and workers reach it at without a coordinator's list:
// ipc://ServerIpcPath(...) for ipc; tcp://<bind>:<base_port + server> (a wildcard bind as
// 127.0.0.1) for tcp.
std::string ServerAddress(const ClusterConfig& cluster, const std::string& run_dir, int server);
// The longest ipc socket path of the job's servers fits in sun_path; else InvalidArgument naming
// cluster.ipc_dir, the path and its length, suggesting a shorter directory. OK for tcp.
Status CheckIpcPathLengths(const ClusterConfig& cluster, const std::string& run_dir);

// [solver] — the server-side optimizer (SGD with momentum, Caffe's semantics). The server
// takes this struct alone.
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
  // DC-ASGD: g + dc_lambda × g ⊙ g ⊙ (w − w_pulled), w_pulled the weights the pushing worker
  // last pulled (>= 0, finite; 0 = no compensation). The paper's constant-λ variant.
  float dc_lambda = 0.04f;
  // DC-ASGD-a, the paper's adaptive variant: λ = dc_lambda0 / sqrt(ms) per element, ms the
  // server's running mean of g ⊙ g (ms ← m·ms + (1 − m)·g ⊙ g, m = dc_mean_square_decay).
  // dc_lambda0 >= 0 and finite; 0 <= m < 1. Defaults: the paper's CIFAR-10 setting.
  float dc_lambda0 = 2.0f;
  float dc_mean_square_decay = 0.95f;
  // EASGD: each worker trains its own copy x_i with the solver and every easgd_tau steps moves it
  // and the servers' center x~ towards each other by easgd_alpha × (x_i − x~) (>= 1; 0 < α < 1;
  // 0 = the paper's β / W with β = 0.9).
  int easgd_tau = 4;
  float easgd_alpha = 0.0f;
  bool operator==(const ConsistencyConfig&) const = default;
};
// "async", "sync" or "ssp:<s>".
std::string ConsistencyModeString(const ConsistencyConfig& c);
// "sgd", "dc-asgd", "dc-asgd-a" or "easgd"; DelayCompensated: either DC-ASGD; EasgdAlpha: easgd_alpha, or 0.9 / workers when it is 0.
std::string AlgorithmString(Algorithm a);
bool ParseAlgorithm(std::string_view text, Algorithm* out);  // AlgorithmString's inverse; false for other text
inline bool DelayCompensated(Algorithm a) { return a == Algorithm::kDcAsgd || a == Algorithm::kDcAsgdAdaptive; }
float EasgdAlpha(const ConsistencyConfig& c, int workers);

// [worker] — the training loop of one worker.
struct WorkerConfig {
  int batch_size = 64;          // images per step (>= 1)
  int64_t steps = 1000;         // steps per worker (>= 1); epochs > 0 takes precedence
  int epochs = 0;               // passes over this worker's shard; 0 = use steps
  int pull_every = 1;           // n_fetch: pull weights every n steps (>= 1)
  int push_every = 1;           // n_push: push accumulated gradients every n steps (>= 1)
  DeviceKind device = DeviceKind::kCpu;  // TOML: device = "cpu" | "gpu:N"
  int gpu_index = 0;            // N of "gpu:N" (>= 0)
  int threads = 0;              // CPU compute threads; 0 = all cores
  // An emulated straggler for experiments: worker `straggler` (-1 = none) sleeps
  // straggler_delay_ms after every step (downpour-worker --step-delay-ms does it for one process).
  int straggler = -1;
  int straggler_delay_ms = 0;
  // Emulated compute, for the scaling model's validation only (docs/scaling.md): a forward and
  // a backward milliseconds per layer of the model, in net order (2 × layers values). The worker
  // then computes nothing: each layer's forward and backward sleeps its time, with the pull waits
  // and pushes at the same points as a real step (gradients are zero). Empty = off.
  std::vector<float> emulate_ms;
  bool tf32 = true;             // GPU: TF32 tensor cores for fp32 convolutions/GEMMs (off = exact fp32)
  // GPU: how cuDNN convolution algorithms are chosen: "search" (measured per layer, as
  // torch.backends.cudnn.benchmark), "heuristic", or forced "gemm", "implicit_gemm", "fft",
  // "winograd" (for comparing them).
  std::string conv_algo = "search";
  bool operator==(const WorkerConfig&) const = default;
};
// "cpu" or "gpu:N".
std::string DeviceString(const WorkerConfig& w);
// The accepted worker.conv_algo values (also downpour-time --conv-algo); the CUDA backend maps
// each to its cuDNN algorithm choice (client/engine/gpu/cuda_backend.h ConvAlgoMode).
inline const std::vector<std::string> kConvAlgoNames = {"search", "heuristic", "gemm",
                                                        "implicit_gemm", "fft", "winograd"};

enum class DataSharding {
  kSlice,  // worker j of W reads its slice of the shared train LMDB: the contiguous records
           // [n·j/W, n·(j+1)/W) in key order (data/shard.h); an IDX file: records j, j+W, ...
  kOwn,    // worker j reads its own LMDB in the folder <train>: <train>/shard_<j>_of_<W> (what
           // downpour-data convert-* --shards W writes) or <train>/<j>
};

// [data]
struct DataConfig {
  std::string train = "data-sets/fashion-mnist/train_lmdb";  // train LMDB path
  std::string test = "data-sets/fashion-mnist/test_lmdb";    // test LMDB path; "" = no test set
  DataSharding sharding = DataSharding::kSlice;  // TOML: sharding = "slice" | "own"
  int crop = 0;              // random crop side (center crop at test); 0 = no crop
  int pad = 0;               // training: the random crop is taken from the record padded by
                             // this many pixels each side (0 in the input); 0..64, LMDB only
  bool mirror = false;       // random horizontal flips during training
  std::string mean_file;     // mean image to subtract: a downpour tensor file or a Caffe
                             // .binaryproto (downpour-data mean); "" = none
  std::vector<float> mean_values;  // per-channel means to subtract instead (Caffe's mean_value):
                                   // 1 value, or one per channel in BGR order; [] = none
  float scale = 0.00390625f; // multiply pixels after mean subtraction (1/256, Caffe's MNIST)
  int prefetch = 4;          // batches the loader keeps ready (>= 1)
  bool operator==(const DataConfig&) const = default;
};

// The LMDB worker `worker` of `workers` reads with data.sharding = "own":
// <train>/shard_<worker>_of_<workers> when that directory exists (downpour-data --shards), else
// <train>/<worker>.
std::string OwnShardPath(const DataConfig& data, int worker, int workers);

// [eval] — periodic test-set evaluation (by worker 0).
struct EvalConfig {
  // Who evaluates a distributed run (docs/operations.md "The evaluator"): true = a process of
  // its own, downpour-evaluator (one per run, started by the launcher), which pulls snapshots on
  // the schedule below and, once every worker has finished, evaluates and saves the final
  // weights, so every worker trains at the same pace; false = worker 0 evaluates between its
  // steps. A --local run always evaluates in its one process.
  bool evaluator = true;
  int64_t every_steps = 500;   // evaluate every n steps (worker 0; the evaluator: every_updates); 0 = off
  // The evaluator: every n worker batches the servers applied (the lr schedule's iteration,
  // docs/config.md#solver); 0 = every_steps × cluster.workers (as often, in images, as worker
  // 0's every_steps). An evaluation that takes longer than the interval skips the points it
  // missed and evaluates the newest snapshot: it never falls behind.
  int64_t every_updates = 0;
  double every_seconds = 0.0;  // and/or every t seconds of wall time; 0 = off
  int test_batches = 0;        // batches per evaluation; 0 = the whole test set
  bool at_start = false;       // also evaluate the starting weights before the first step
                               // (the accuracy a fine-tune starts from)
  bool operator==(const EvalConfig&) const = default;
};

// [checkpoint] — server shard checkpoints (common/tensor_file.h format).
struct CheckpointConfig {
  int64_t every_updates = 1000;     // a shard checkpoints after every n applied updates; 0 = off
  std::string dir = "checkpoints";  // relative paths are inside the run directory
  // Write-ahead log of taken pushes, per shard, beside its checkpoint (server/wal.h): a push is
  // written to the log before it is acknowledged, so an acknowledged update survives the death
  // of the server process; a restart replays the log after the checkpoint. Off = only
  // checkpoints (updates since the last one are lost with a server).
  bool wal = true;
  // fsync the log at least this often (ms), so a machine crash loses at most this much;
  // 0 = fsync before every acknowledgement (a machine crash loses nothing). >= 0.
  int wal_fsync_ms = 200;
  bool operator==(const CheckpointConfig&) const = default;
};

// [compression] — fewer bytes on the wire (common/grad_codec.h). The default is lossless fp32.
enum class WireCodec {
  kFp32,    // dense f32 (lossless)
  kFp16,    // dense IEEE half (gradients / pulled weights; masters stay f32 on the server)
  kBf16,    // dense bfloat16
  kTopK,    // the top_k_fraction largest |g| per chunk, with error feedback (push only)
  kOneBit,  // sign × per-chunk scale (mean |g|), with error feedback (push only)
};
const char* WireCodecName(WireCodec codec);  // "fp32" | "fp16" | "bf16" | "topk" | "onebit"
// Parses a codec name; false if unknown.
bool ParseWireCodec(std::string_view text, WireCodec* out);

// cluster.server_threads' largest value (a typo's 1000 threads is refused, not started).
inline constexpr int kMaxServerThreads = 64;
// cluster.trace_events' largest value (about 1.3 GB of memory per process).
inline constexpr int64_t kMaxTraceEvents = 10'000'000;
// compression.factor_threads' largest value (a typo's 1000 threads is refused, not started).
inline constexpr int kMaxFactorThreads = 64;

struct CompressionConfig {
  // Sufficient factors for inner-product weights (Project Adam / Poseidon): the worker sends
  // delta (B×out) and the layer input (B×in) instead of dW (out×in) wherever that is fewer
  // floats; the server forms deltaᵀ·input before its usual update. Lossless (to fp32 rounding).
  bool factors = false;
  WireCodec push = WireCodec::kFp32;  // codec of the gradient chunks sent dense
  WireCodec pull = WireCodec::kFp32;  // codec of pulled weights: fp32 | fp16 | bf16
  double top_k_fraction = 0.01;       // push = "topk": fraction of each chunk sent, in (0, 1]
  // push = "topk": the first top_k_warmup_pushes pushes of each chunk keep a fraction decaying
  // exponentially from 0.25 to top_k_fraction (DGC's warm-up); 0 = none (>= 0).
  int64_t top_k_warmup_pushes = 0;
  // push = "topk" / "onebit": keep what was not sent in a per-chunk residual added to the next
  // gradient (error feedback, EF-SGD). Off only for ablations.
  bool error_feedback = true;
  // factors: the threads of each server shard that form its factor chunks' gradients (δᵀ·a),
  // chunks side by side; 1 leaves the host's other cores to workers beside the servers.
  int factor_threads = 1;
  bool operator==(const CompressionConfig&) const = default;
};

// [security] — CurveZMQ keys and the loopback run secret (common/security.h).
struct SecurityConfig {
  std::string keys = "";  // directory made by downpour-keys; "" = no CurveZMQ (loopback only)
  bool insecure = false;  // allow binding off-host without keys (trusted networks only)
  bool operator==(const SecurityConfig&) const = default;
};

// [[models]] — several models trained on one set of servers (docs/multi_model.md). Each entry
// is one model: a name, a model TOML and a solver; everything else (cluster, data, worker loop,
// consistency) is the run's. A [sweep] table is shorthand that expands to one entry per point
// of the cross product of its lists, e.g.
//   [sweep]
//   solver.base_lr = [0.01, 0.02]
//   solver.weight_decay = [0.0005, 0.001]
// gives 4 models named "base_lr=0.01+weight_decay=0.0005", ... Sweepable keys: kSweepKeys.
// Model id k (the wire's header.model_id) is the entry's index.
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
  // Models move, data stays: every worker reads only its own partition (data.sharding = "own");
  // in stage t worker i trains model (i + t) mod K (rotation.h), then the model moves on.
  kPipeline,
  // Baseline (a): the K models one after another, each data-parallel over all W workers.
  kSequential,
  // Baseline (b): K independent one-worker jobs, each reading the whole training set; job k
  // runs on worker k mod W (a worker runs its jobs one after another).
  kIndependent,
};
const char* RotationSchemeName(RotationScheme scheme);  // "pipeline" | "sequential" | "independent"

// How a pipeline's holders of one model in one stage train it when K < W ([rotation] groups).
enum class RotationGroups {
  // Together, through the servers, per step, in the run's consistency mode (async: every
  // holder's gradient applied on arrival; sync: a round averages the holders' gradients).
  kDataParallel,
  // Each holder trains its own copy with local SGD on its own partition and pushes its change
  // divided by the group's size: the model moves on as the copies' average (fewer bytes: one
  // model per holder per stage instead of one per step).
  kAverage,
};
const char* RotationGroupsName(RotationGroups groups);  // "data_parallel" | "average"

// [rotation] — the schedule of a multi-model run (ignored without [[models]]).
struct RotationConfig {
  RotationScheme scheme = RotationScheme::kPipeline;
  // Pipeline: each model's visit to one partition in one stage is one pass over it (epochs = 1
  // per stage); the run has passes × K stages, so every model visits every partition `passes`
  // times and is trained `passes` epochs in every scheme.
  int passes = 1;
  // Steps per stage (each worker's batches on one model before it moves on); 0 = one pass over
  // the worker's own partition. Sequential and independent runs give every model the same
  // images: passes × W × stage_steps batches (or passes epochs).
  int64_t stage_steps = 0;
  // Pipeline with fewer models than workers: how a stage's holders of a model train it.
  RotationGroups groups = RotationGroups::kDataParallel;
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
// Same, with command-line overrides applied to the file before it is read: each entry is
// "section.key=value" (--set), the value TOML (7, 0.5, true, "text", [1, 2]) or, when it is not
// valid TOML, a bare string (gpu:0, /data/train_lmdb). Overridden keys are validated like the
// file's, and an error about one names the flag: "--set worker.steps=0: worker.steps = 0: ...".
Status LoadRunConfig(const std::string& path, const std::vector<std::string>& sets, RunConfig* out);
// Same, from text; `source_name` names the text in errors (usually the file path).
Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, RunConfig* out);
Status ParseRunConfig(std::string_view toml_text, const std::string& source_name,
                      const std::vector<std::string>& sets, RunConfig* out);
// Checks cross-field rules (e.g. backup_workers < workers) of a config built or modified in
// code, such as after the launcher's --servers/--workers overrides. `overridden` maps
// "table.key" to the --set text that gave it (errors then name the flag).
Status ValidateRunConfig(const RunConfig& config, const std::string& source_name);
Status ValidateRunConfig(const RunConfig& config, const std::string& source_name,
                         const std::map<std::string, std::string>& overridden);
// Settings that work but are probably a mistake, one line each, naming the key and why (the
// launcher prints them before it starts anything):
//   * cluster.chunk_elems × 4 bytes >= 32 MiB: payload frames that large fall past glibc's mmap
//     threshold and page-fault on every receive (measured 10× slower than 4 MiB frames).
std::vector<std::string> RunConfigWarnings(const RunConfig& config);
// The frame size (bytes) at and above which RunConfigWarnings warns about cluster.chunk_elems.
inline constexpr int64_t kLargeFrameBytes = int64_t{32} << 20;

// Every field, as TOML that ParseRunConfig reads back to an equal RunConfig (the run
// directory stores the config used this way).
std::string ToToml(const RunConfig& config);

// The solver a run's processes use: config.solver, with a poly max_iter of 0 resolved to the
// run's planned worker batches (worker.steps × cluster.workers; `local`: worker.steps, the one
// process's own), so the rate reaches 0 at the last step however many workers the run has.
SolverConfig RunSolver(const RunConfig& config, bool local = false);

// Whether a distributed run of `config` has an evaluator process: eval.evaluator and a test set
// (data.test), in a one-model run (a multi-model run's worker 0 evaluates every model at the
// end). The launcher starts downpour-evaluator then, and worker 0 does not evaluate.
bool RunHasEvaluator(const RunConfig& config);
// Model `model`'s solver in a multi-model run (config.models): its entry's, with a poly max_iter
// of 0 resolved to the model's planned batches, rotation.passes × cluster.workers ×
// rotation.stage_steps (the same in every rotation scheme).
SolverConfig ModelSolver(const RunConfig& config, int model);
// The run config as model `model` of a multi-model run sees it: [model].config set to the
// entry's, no [[models]] (what its net, and the check of the data against its input, read).
RunConfig ModelRunConfig(const RunConfig& config, int model);
// The evaluator's update interval: eval.every_updates, or every_steps × cluster.workers when it
// is 0 (0 when both are 0: no update-driven evaluations).
int64_t EvaluatorEveryUpdates(const RunConfig& config);

}  // namespace downpour
