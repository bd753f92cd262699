// run_config.h — RunConfig, the typed form of the TOML file that describes a training run, and
// its loader. Each section is a struct whose members' initializers are the defaults and whose
// `Rows` lists every key once: name, member, rule and a one-line doc (common/config/table.h).
// The sections a lower module needs alone have headers of their own (common/config/*.h), so that
// the write-ahead log, the codecs and the solver include only theirs.
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

#include "common/config/checkpoint.h"
#include "common/config/cluster.h"
#include "common/config/compression.h"
#include "common/config/consistency.h"
#include "common/config/security.h"
#include "common/config/solver.h"
#include "common/config/table.h"
#include "common/config/worker.h"
#include "common/device.h"
#include "common/status.h"

namespace downpour {

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
