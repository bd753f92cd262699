// Tests for common/run_config.h: defaults, every section parsed, bad input rejected with the
// file, the table.key and the value, and ToToml round trips.
#include "common/run_config.h"
#include "common/solver/lr_policy.h"

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "downpour_config.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

RunConfig ParseOk(std::string_view text) {
  RunConfig c;
  Status s = ParseRunConfig(text, "test.toml", &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

std::string ParseError(std::string_view text) {
  RunConfig c;
  Status s = ParseRunConfig(text, "bad.toml", &c);
  EXPECT_FALSE(s.ok()) << "accepted:\n" << text;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  return s.message();
}

TEST(RunConfigTest, EmptyFileGivesDocumentedDefaults) {
  RunConfig c = ParseOk("");
  EXPECT_EQ(c, RunConfig{});
  EXPECT_EQ(c.run.out_dir, "runs");
  EXPECT_EQ(c.cluster.bind, "127.0.0.1");
  EXPECT_EQ(c.cluster.coordinator, "127.0.0.1:5555");
  EXPECT_EQ(c.cluster.chunk_elems, 1 << 20);
  EXPECT_EQ(c.solver.lr_policy, LrPolicy::kFixed);
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kAsync);
  EXPECT_EQ(c.worker.device, DeviceKind::kCpu);
  EXPECT_LE(c.solver.clip_gradients, 0.0f);
}

TEST(RunConfigTest, ParsesEverySection) {
  RunConfig c = ParseOk(R"(
[run]
name = "exp1"
out_dir = "/tmp/runs"
seed = 42
[model]
config = "configs/models/alexnet.toml"
[cluster]
servers = 4
workers = 8
coordinator = "10.0.0.1:6000"
base_port = 7000
bind = "0.0.0.0"
heartbeat_ms = 100
heartbeat_timeout_ms = 1000
chunk_elems = 4096
[solver]
base_lr = 0.02
lr_policy = "multistep"
gamma = 0.5
power = 2
stepsize = 10
stepvalues = [100, 200, 300]
max_iter = 400
momentum = 0.95
weight_decay = 0.001
clip_gradients = 35.0
[consistency]
mode = "ssp:4"
staleness_aware_lr = true
[worker]
batch_size = 128
steps = 50
pull_every = 2
push_every = 3
device = "gpu:1"
threads = 4
tf32 = false
conv_algo = "winograd"
[data]
train = "a_lmdb"
test = "b_lmdb"
sharding = "own"
crop = 227
mirror = true
mean_file = "mean.dpt"
scale = 1.0
prefetch = 8
[eval]
every_steps = 10
every_seconds = 30.5
test_batches = 5
[checkpoint]
every_updates = 77
dir = "/tmp/ck"
)");
  EXPECT_EQ(c.run.name, "exp1");
  EXPECT_EQ(c.run.seed, 42);
  EXPECT_EQ(c.model.config, "configs/models/alexnet.toml");
  EXPECT_EQ(c.cluster.servers, 4);
  EXPECT_EQ(c.cluster.workers, 8);
  EXPECT_EQ(c.cluster.base_port, 7000);
  EXPECT_EQ(c.cluster.bind, "0.0.0.0");
  EXPECT_EQ(c.cluster.chunk_elems, 4096);
  EXPECT_FLOAT_EQ(c.solver.base_lr, 0.02f);
  EXPECT_EQ(c.solver.lr_policy, LrPolicy::kMultistep);
  EXPECT_FLOAT_EQ(c.solver.power, 2.0f);  // an integer is accepted for a float field
  EXPECT_EQ(c.solver.stepvalues, (std::vector<int64_t>{100, 200, 300}));
  EXPECT_FLOAT_EQ(c.solver.clip_gradients, 35.0f);
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kSsp);
  EXPECT_EQ(c.consistency.staleness_bound, 4);
  EXPECT_TRUE(c.consistency.staleness_aware_lr);
  EXPECT_EQ(c.worker.batch_size, 128);
  EXPECT_EQ(c.worker.steps, 50);
  EXPECT_EQ(c.worker.pull_every, 2);
  EXPECT_EQ(c.worker.push_every, 3);
  EXPECT_EQ(c.worker.device, DeviceKind::kGpu);
  EXPECT_EQ(c.worker.gpu_index, 1);
  EXPECT_FALSE(c.worker.tf32);
  EXPECT_EQ(c.worker.conv_algo, "winograd");
  EXPECT_EQ(c.data.sharding, DataSharding::kOwn);
  EXPECT_EQ(c.data.crop, 227);
  EXPECT_TRUE(c.data.mirror);
  EXPECT_EQ(c.data.prefetch, 8);
  EXPECT_DOUBLE_EQ(c.eval.every_seconds, 30.5);
  EXPECT_EQ(c.eval.test_batches, 5);
  EXPECT_EQ(c.checkpoint.every_updates, 77);
  EXPECT_EQ(c.checkpoint.dir, "/tmp/ck");
}

TEST(RunConfigTest, ConsistencyModes) {
  EXPECT_EQ(ParseOk("[consistency]\nmode = \"sync\"\n").consistency.mode, ConsistencyMode::kSync);
  RunConfig c = ParseOk("[consistency]\nmode = \"ssp:0\"\n");
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kSsp);
  EXPECT_EQ(c.consistency.staleness_bound, 0);
  EXPECT_EQ(ConsistencyModeString(c.consistency), "ssp:0");
  c = ParseOk("[cluster]\nworkers = 4\n[consistency]\nmode = \"sync\"\nbackup_workers = 1\n");
  EXPECT_EQ(c.consistency.backup_workers, 1);
  for (const char* bad : {"ssp", "ssp:", "ssp:-1", "ssp:x", "SYNC", "bsp"}) {
    EXPECT_THAT(ParseError(fmt::format("[consistency]\nmode = \"{}\"\n", bad)),
                HasSubstr(fmt::format("bad.toml: consistency.mode = \"{}\"", bad)));
  }
}

TEST(RunConfigTest, LrPolicyNamesRoundTrip) {
  for (LrPolicy p : {LrPolicy::kFixed, LrPolicy::kStep, LrPolicy::kMultistep, LrPolicy::kPoly,
                     LrPolicy::kInv, LrPolicy::kExp}) {
    LrPolicy back = LrPolicy::kFixed;
    ASSERT_TRUE(ParseLrPolicy(LrPolicyName(p), &back)) << LrPolicyName(p);
    EXPECT_EQ(back, p);
  }
  LrPolicy unused;
  EXPECT_FALSE(ParseLrPolicy("sigmoid", &unused));
}

TEST(RunConfigTest, ErrorsNameFileTableKeyAndValue) {
  EXPECT_THAT(ParseError("[solver]\nlr_policy = \"cosine\"\n"),
              HasSubstr("bad.toml: solver.lr_policy = \"cosine\": expected \"fixed\", \"step\", "
                        "\"multistep\", \"poly\", \"inv\" or \"exp\""));
  EXPECT_THAT(ParseError("[solver]\nbase_lr = -0.1\n"),
              HasSubstr("bad.toml: solver.base_lr = -0.1: must be finite and > 0"));
  EXPECT_THAT(ParseError("[solver]\nmomentum = 1.0\n"),
              HasSubstr("bad.toml: solver.momentum = 1: must be in [0, 1)"));
  EXPECT_THAT(ParseError("[solver]\nupdate = \"adam\"\n"),
              HasSubstr("bad.toml: solver.update = \"adam\": expected \"momentum\" or \"adagrad\""));
  EXPECT_THAT(ParseError("[solver]\nupdate = \"adagrad\"\nadagrad_epsilon = 0.0\n"),
              HasSubstr("bad.toml: solver.adagrad_epsilon = 0: must be finite and > 0"));
  EXPECT_THAT(ParseError("[solver]\nadagrad_initial = -0.5\n"),
              HasSubstr("bad.toml: solver.adagrad_initial = -0.5: must be finite and >= 0"));
  EXPECT_THAT(ParseError("[cluster]\nservers = 0\n"),
              HasSubstr("bad.toml: cluster.servers = 0: must be >= 1"));
  EXPECT_THAT(ParseError("[cluster]\nservers = \"two\"\n"),
              HasSubstr("bad.toml: cluster.servers = \"two\": expected an integer"));
  EXPECT_THAT(ParseError("[cluster]\nservers = 5000000000\n"),
              HasSubstr("bad.toml: cluster.servers = 5000000000: out of range"));
  EXPECT_THAT(ParseError("[cluster]\ncoordinator = \"localhost\"\n"),
              HasSubstr("bad.toml: cluster.coordinator = \"localhost\": expected host:port"));
  EXPECT_THAT(ParseError("[cluster]\nbase_port = 65535\nservers = 2\n"),
              HasSubstr("bad.toml: cluster.base_port = 65535"));
  EXPECT_THAT(ParseError("[cluster]\nheartbeat_ms = 500\nheartbeat_timeout_ms = 400\n"),
              HasSubstr("cluster.heartbeat_timeout_ms = 400: must be > cluster.heartbeat_ms (500)"));
  EXPECT_THAT(ParseError("[worker]\ndevice = \"tpu\"\n"),
              HasSubstr("bad.toml: worker.device = \"tpu\": expected \"cpu\" or \"gpu:N\""));
  EXPECT_THAT(ParseError("[worker]\nconv_algo = \"fastest\"\n"),
              HasSubstr("bad.toml: worker.conv_algo = \"fastest\": expected search, heuristic, gemm, "
                        "implicit_gemm, fft or winograd"));
  EXPECT_THAT(ParseError("[worker]\nbatch_size = 0\n"),
              HasSubstr("bad.toml: worker.batch_size = 0: must be >= 1"));
  EXPECT_THAT(ParseError("[data]\nsharding = \"random\"\n"),
              HasSubstr("bad.toml: data.sharding = \"random\": expected \"slice\" or \"own\""));
  EXPECT_THAT(ParseError("[data]\nmirror = 1\n"),
              HasSubstr("bad.toml: data.mirror = 1: expected true or false"));
  EXPECT_THAT(ParseError("[solver]\nlr_policy = \"multistep\"\n"),
              HasSubstr("solver.stepvalues = []: lr_policy \"multistep\" needs at least one"));
  EXPECT_THAT(ParseError("[solver]\nstepvalues = [10, 5]\n"),
              HasSubstr("solver.stepvalues = [10, 5]: must be positive and strictly increasing"));
  EXPECT_THAT(ParseError("[solver]\nstepvalues = [10, \"x\"]\n"),
              HasSubstr("solver.stepvalues = [10, \"x\"]: expected an array of integers"));
  EXPECT_THAT(ParseError("[consistency]\nmode = \"async\"\nbackup_workers = 1\n"),
              HasSubstr("consistency.backup_workers = 1: only mode \"sync\" has backup workers"));
  EXPECT_THAT(ParseError("[cluster]\nworkers = 2\n[consistency]\nmode = \"sync\"\n"
                         "backup_workers = 2\n"),
              HasSubstr("consistency.backup_workers = 2: must be < cluster.workers (2)"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"hogwild\"\n"),
              HasSubstr("bad.toml: consistency.algorithm = \"hogwild\": expected \"sgd\""));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"dc-asgd\"\ndc_lambda = -0.1\n"),
              HasSubstr("consistency.dc_lambda = -0.1: must be >= 0 and finite"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"dc-asgd-a\"\ndc_lambda0 = -2\n"),
              HasSubstr("consistency.dc_lambda0 = -2"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"dc-asgd-a\"\ndc_mean_square_decay = 1.0\n"),
              HasSubstr("consistency.dc_mean_square_decay = 1"));
  EXPECT_THAT(ParseError("[consistency]\nmode = \"sync\"\nalgorithm = \"dc-asgd-a\"\n"),
              HasSubstr("\"dc-asgd-a\" compensates delays"));
  EXPECT_THAT(ParseError("[consistency]\nmode = \"sync\"\nalgorithm = \"dc-asgd\"\n"),
              HasSubstr("consistency.algorithm = \"dc-asgd\": \"dc-asgd\" compensates delays; mode \"sync\" has none"));
}

TEST(RunConfigTest, StragglerMustBeAWorker) {
  EXPECT_THAT(ParseError("[cluster]\nworkers = 2\n[worker]\nstraggler = 2\nstraggler_delay_ms = 50\n"),
              HasSubstr("worker.straggler = 2: must be a worker id (0..1) or -1 (none)"));
  EXPECT_THAT(ParseError("[worker]\nstraggler_delay_ms = -5\n"),
              HasSubstr("worker.straggler_delay_ms = -5: must be in 0..60000"));
  const RunConfig c = ParseOk("[cluster]\nworkers = 4\n[worker]\nstraggler = 3\nstraggler_delay_ms = 40\n");
  EXPECT_EQ(c.worker.straggler, 3);
  EXPECT_EQ(c.worker.straggler_delay_ms, 40);
}

TEST(RunConfigTest, OutstandingStepsAreBounded) {
  for (const char* bad : {"0", "-1", "17"}) {
    EXPECT_THAT(ParseError(fmt::format("[worker]\noutstanding_steps = {}\n", bad)),
                HasSubstr(fmt::format("worker.outstanding_steps = {}: must be in 1..16", bad)));
  }
  EXPECT_THAT(ParseError("[worker]\noutstanding_steps = \"all\"\n"), HasSubstr("worker.outstanding_steps"));
  EXPECT_EQ(ParseOk("").worker.outstanding_steps, 1);
  EXPECT_EQ(ParseOk("[worker]\noutstanding_steps = 2\n").worker.outstanding_steps, 2);
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"dc-asgd\"\n[worker]\noutstanding_steps = 2\n"),
              HasSubstr("worker.outstanding_steps = 2: must be 1 with consistency.algorithm = \"dc-asgd\""));
}

TEST(RunConfigTest, EmulatedComputeMsAreChecked) {
  EXPECT_THAT(ParseError("[worker]\nemulate_ms = [1.0, -2.0]\n"),
              HasSubstr("worker.emulate_ms = [1, -2]: every value must be in 0..60000 ms"));
  EXPECT_THAT(ParseError("[worker]\nemulate_ms = [1.0, nan]\n"), HasSubstr("worker.emulate_ms"));
  EXPECT_THAT(ParseError("[worker]\nemulate_ms = [1.0, 2.0, 3.0]\n"),
              HasSubstr("worker.emulate_ms = 3 values: expected a forward and a backward ms per layer"));
  EXPECT_THAT(ParseError("[worker]\nemulate_ms = \"fast\"\n"), HasSubstr("expected an array of numbers"));
  const RunConfig c = ParseOk("[worker]\nemulate_ms = [0.5, 1, 0, 2.25]\n");
  EXPECT_EQ(c.worker.emulate_ms, (std::vector<float>{0.5f, 1.0f, 0.0f, 2.25f}));
  EXPECT_TRUE(ParseOk("").worker.emulate_ms.empty());  // off by default
}

TEST(RunConfigTest, EasgdSettingsAreChecked) {
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"easgd\"\neasgd_tau = 0\n"),
              HasSubstr("consistency.easgd_tau = 0: must be >= 1"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"easgd\"\neasgd_alpha = 1.5\n"),
              HasSubstr("consistency.easgd_alpha = 1.5: must be in [0, 1)"));
  EXPECT_THAT(ParseError("[consistency]\nmode = \"sync\"\nalgorithm = \"easgd\"\n"),
              HasSubstr("consistency.algorithm = \"easgd\": \"easgd\" exchanges asynchronously"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"easgd\"\n[compression]\nfactors = true\n"),
              HasSubstr("compression.factors = true: \"easgd\" workers push no gradients"));
  // local-sgd needs what easgd needs, named as itself.
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"local-sgd\"\nlocal_steps = 0\n"),
              HasSubstr("consistency.local_steps = 0: must be >= 1"));
  EXPECT_THAT(ParseError("[consistency]\nmode = \"ssp:2\"\nalgorithm = \"local-sgd\"\n"),
              HasSubstr("consistency.algorithm = \"local-sgd\": \"local-sgd\" exchanges asynchronously"));
  EXPECT_THAT(ParseError("[consistency]\nalgorithm = \"local-sgd\"\n[compression]\npush = \"fp16\"\n"),
              HasSubstr("\"local-sgd\" exchanges must be exact"));
  EXPECT_EQ(ParseOk("[consistency]\nalgorithm = \"local-sgd\"\nlocal_steps = 16\n").consistency.local_steps, 16);
  const RunConfig c = ParseOk("[cluster]\nworkers = 3\n[consistency]\nalgorithm = \"easgd\"\neasgd_tau = 8\n");
  EXPECT_EQ(c.consistency.algorithm, Algorithm::kEasgd);
  EXPECT_EQ(c.consistency.easgd_tau, 8);
  EXPECT_FLOAT_EQ(EasgdAlpha(c.consistency, 3), 0.3f);  // the paper's beta / W, beta = 0.9
}

TEST(RunConfigTest, PolyMaxIterZeroIsTheRunsPlannedBatches) {
  const RunConfig c = ParseOk("[solver]\nlr_policy = \"poly\"\nmax_iter = 0\n[cluster]\nworkers = 4\n[worker]\nsteps = 300\n");
  EXPECT_EQ(RunSolver(c).max_iter, 1200);
  EXPECT_EQ(RunSolver(c, /*local=*/true).max_iter, 300);
  EXPECT_FLOAT_EQ(LearningRateAt(RunSolver(c), 600), c.solver.base_lr * 0.5f);
  EXPECT_EQ(RunSolver(ParseOk("[solver]\nmax_iter = 77\n")).max_iter, 77);  // explicit: kept
  EXPECT_THAT(ParseError("[solver]\nlr_policy = \"poly\"\nmax_iter = 0\n[worker]\nepochs = 2\n"),
              HasSubstr("solver.max_iter = 0: 0 (the run's length) needs a run counted in worker.steps"));
  EXPECT_THAT(ParseError("[solver]\nmax_iter = -1\n"), HasSubstr("solver.max_iter = -1: must be >= 0"));
}

TEST(RunConfigTest, PaddingIsCheckedAndNeedsAnLmdb) {
  EXPECT_THAT(ParseError("[data]\npad = 65\n"), HasSubstr("data.pad = 65: must be in 0..64"));
  EXPECT_THAT(ParseError("[data]\npad = 2\ntrain = \"/x/train-images-idx3-ubyte.gz\"\n"),
              HasSubstr("data.pad = 2: needs an LMDB data.train"));
  EXPECT_EQ(ParseOk("[data]\npad = 2\n").data.pad, 2);
}

TEST(RunConfigTest, TheEvaluatorIsTheDefaultAndItsIntervalIsChecked) {
  EXPECT_THAT(ParseError("[eval]\nevery_updates = -1\n"), HasSubstr("eval.every_updates = -1: must be >= 0"));
  EXPECT_THAT(ParseError("[eval]\nevaluator = 1\n"), HasSubstr("eval.evaluator"));
  RunConfig c = ParseOk("[cluster]\nworkers = 4\n[eval]\nevery_steps = 250\n");
  EXPECT_TRUE(RunHasEvaluator(c));
  EXPECT_EQ(EvaluatorEveryUpdates(c), 1000);  // every_steps x workers: as often, in images, as worker 0
  c = ParseOk("[eval]\nevery_updates = 300\n");
  EXPECT_EQ(EvaluatorEveryUpdates(c), 300);
  EXPECT_FALSE(RunHasEvaluator(ParseOk("[eval]\nevaluator = false\n")));
  EXPECT_FALSE(RunHasEvaluator(ParseOk("[data]\ntest = \"\"\n")));  // nothing to evaluate on
}

TEST(RunConfigTest, DcAsgdIsASetting) {
  const RunConfig c = ParseOk("[consistency]\nmode = \"ssp:2\"\nalgorithm = \"dc-asgd\"\ndc_lambda = 0.5\n");
  EXPECT_EQ(c.consistency.algorithm, Algorithm::kDcAsgd);
  EXPECT_FLOAT_EQ(c.consistency.dc_lambda, 0.5f);
  EXPECT_EQ(ParseOk("").consistency.algorithm, Algorithm::kSgd);  // the default stays plain SGD
  const RunConfig a = ParseOk("[consistency]\nalgorithm = \"dc-asgd-a\"\ndc_lambda0 = 1.5\n");
  EXPECT_EQ(a.consistency.algorithm, Algorithm::kDcAsgdAdaptive);
  EXPECT_FLOAT_EQ(a.consistency.dc_lambda0, 1.5f);
  EXPECT_FLOAT_EQ(a.consistency.dc_mean_square_decay, 0.95f);  // the paper's m
}

TEST(RunConfigTest, RejectsUnknownKeysAndTables) {
  EXPECT_THAT(ParseError("[solver]\nlearning_rate = 0.1\n"),
              HasSubstr("bad.toml: unknown key solver.learning_rate = 0.1"));
  EXPECT_THAT(ParseError("[optimizer]\nlr = 0.1\n"),
              HasSubstr("bad.toml: unknown table 'optimizer'"));
  EXPECT_THAT(ParseError("lr = 0.1\n"), HasSubstr("bad.toml: unknown top-level key 'lr'"));
  EXPECT_THAT(ParseError("solver = 3\n"), HasSubstr("bad.toml: 'solver' = 3 must be a table"));
  EXPECT_THAT(ParseError("[solver\n"), HasSubstr("bad.toml:1:"));
}

TEST(RunConfigTest, ToTomlRoundTrips) {
  RunConfig c;
  c.run.name = "quote\"d \\ name";
  c.cluster.servers = 3;
  c.cluster.server_threads = 7;
  c.cluster.io_threads = 5;
  c.cluster.connections_per_server = 3;
  c.cluster.inflight_mb = 16;
  c.cluster.send_order = SendOrder::kLayer;
  c.cluster.trace_events = 123456;
  c.solver.base_lr = 0.1f / 3.0f;  // not exactly representable in decimal
  c.solver.lr_policy = LrPolicy::kMultistep;
  c.solver.stepvalues = {5, 50, 500};
  c.solver.clip_gradients = 1e-7f;
  c.consistency.mode = ConsistencyMode::kSsp;
  c.consistency.staleness_bound = 12;
  c.worker.device = DeviceKind::kGpu;
  c.worker.gpu_index = 3;
  c.worker.tf32 = false;
  c.worker.conv_algo = "implicit_gemm";
  c.worker.epochs = 2;
  c.data.sharding = DataSharding::kOwn;
  c.data.scale = 1.0f;
  c.eval.every_seconds = 0.1;
  c.eval.evaluator = false;
  c.eval.every_updates = 777;
  c.worker.emulate_ms = {0.1f / 3.0f, 2.0f, 0.0f, 12.5f};
  RunConfig back;
  Status s = ParseRunConfig(ToToml(c), "roundtrip.toml", &back);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << ToToml(c);
  EXPECT_EQ(back, c) << ToToml(c);
  // Defaults too.
  ASSERT_TRUE(ParseRunConfig(ToToml(RunConfig{}), "defaults.toml", &back).ok());
  EXPECT_EQ(back, RunConfig{});
}

// Every row, as RunConfigKeys lists them: a value of the wrong TOML type is refused naming the
// file and table.key, and a key with a fixed set of values refuses another naming what it takes.
TEST(RunConfigTest, EveryKeyRefusesAWrongValueNamingIt) {
  const std::vector<ConfigKey> keys = RunConfigKeys();
  ASSERT_GT(keys.size(), 90u);
  for (const ConfigKey& k : keys) {
    const std::string table = k.key.substr(0, k.key.find('.'));
    const std::string name = k.key.substr(k.key.find('.') + 1);
    const std::string wrong = k.type == "string" ? "[1]" : "\"x\"";
    EXPECT_THAT(ParseError(fmt::format("[{}]\n{} = {}\n", table, name, wrong)), HasSubstr("bad.toml: " + k.key + " = "))
        << k.key << " (" << k.type << ")";
    if (!k.choices.empty()) {
      const std::string first = k.choices.substr(0, k.choices.find(' '));
      EXPECT_THAT(ParseError(fmt::format("[{}]\n{} = \"nope\"\n", table, name)), HasSubstr(first)) << k.key;
    }
  }
}

TEST(RunConfigTest, CheckpointWalIoChoosesHowTheLogWrites) {
  EXPECT_EQ(ParseOk("").checkpoint.wal_io, WalIo::kAuto);
  EXPECT_EQ(ParseOk("[checkpoint]\nwal_io = \"buffered\"\n").checkpoint.wal_io, WalIo::kBuffered);
  EXPECT_EQ(ParseOk("[checkpoint]\nwal_io = \"direct\"\n").checkpoint.wal_io, WalIo::kDirect);
  EXPECT_THAT(ParseError("[checkpoint]\nwal_io = \"fast\"\n"),
              HasSubstr("checkpoint.wal_io = \"fast\": expected \"auto\", \"buffered\" or \"direct\""));
}

TEST(RunConfigTest, CheckpointHistoryNeedsTheLogAndOneModel) {
  EXPECT_FALSE(ParseOk("").checkpoint.history);
  EXPECT_TRUE(ParseOk("[checkpoint]\nhistory = true\n").checkpoint.history);
  EXPECT_THAT(ParseError("[checkpoint]\nhistory = true\nwal = false\n"),
              HasSubstr("checkpoint.history = true: the history is the servers' write-ahead logs: it needs "
                        "checkpoint.wal = true"));
  EXPECT_TRUE(ParseOk("[checkpoint]\nhistory = true\nevery_updates = 0\n").checkpoint.history)
      << "the servers checkpoint on stop for the history even without periodic checkpoints";
  EXPECT_THAT(ParseError("[[models]]\nname = \"a\"\nconfig = \"m.toml\"\n[checkpoint]\nhistory = true\n"),
              HasSubstr("checkpoint.history = true: is kept for single-model runs only"));
  EXPECT_THAT(ParseError("[checkpoint]\nhistory = 1\n"), HasSubstr("checkpoint.history"));
}

TEST(RunConfigTest, ValidateCatchesCodeMadeConfigs) {
  RunConfig c;
  c.cluster.workers = 0;  // e.g. a bad --workers override
  Status s = ValidateRunConfig(c, "--workers");
  EXPECT_THAT(s.message(), HasSubstr("--workers: cluster.workers = 0: must be >= 1"));
}

TEST(RunConfigTest, LoadMissingFileNamesIt) {
  RunConfig c;
  Status s = LoadRunConfig("/nonexistent/run.toml", &c);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/run.toml"));
}

// Every example in configs/runs/ must load, and the three documented ones say what they claim.
TEST(RunConfigTest, ExampleConfigsLoad) {
  const std::filesystem::path dir = std::filesystem::path(DOWNPOUR_SOURCE_DIR) / "configs/runs";
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    RunConfig c;
    Status s = LoadRunConfig(entry.path().string(), &c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(DOWNPOUR_SOURCE_DIR) / c.model.config))
        << entry.path() << ": model.config " << c.model.config << " does not exist";
    ++loaded;
  }
  EXPECT_GE(loaded, 3);
  RunConfig c;
  ASSERT_TRUE(LoadRunConfig((dir / "default.toml").string(), &c).ok());
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kAsync);
  EXPECT_EQ(c.cluster.servers, 2);
  EXPECT_EQ(c.cluster.workers, 2);
  EXPECT_EQ(c.worker.batch_size, 64);
  ASSERT_TRUE(LoadRunConfig((dir / "sync.toml").string(), &c).ok());
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kSync);
  ASSERT_TRUE(LoadRunConfig((dir / "ssp.toml").string(), &c).ok());
  EXPECT_EQ(c.consistency.mode, ConsistencyMode::kSsp);
  EXPECT_GT(c.consistency.staleness_bound, 0);
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

RunConfig WithSets(std::string_view text, const std::vector<std::string>& sets, Status* status) {
  RunConfig c;
  *status = ParseRunConfig(text, "base.toml", sets, &c);
  return c;
}

TEST(RunConfigSetTest, OverridesApplyOnTopOfTheFileWithTomlOrBareValues) {
  Status s;
  const RunConfig c = WithSets("[worker]\nsteps = 100\nbatch_size = 32\n",
                               {"worker.steps=500", "solver.base_lr=0.05", "data.train=/data/x train",
                                "worker.device=gpu:1", "data.mirror=true", "data.mean_values=[104, 117.5, 123]",
                                "model.weights=\"runs/a/model_final.dpt\""},
                               &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.worker.steps, 500);
  EXPECT_EQ(c.worker.batch_size, 32);  // from the file
  EXPECT_FLOAT_EQ(c.solver.base_lr, 0.05f);
  EXPECT_EQ(c.data.train, "/data/x train");  // not TOML: taken as a bare string
  EXPECT_EQ(c.worker.device, DeviceKind::kGpu);
  EXPECT_EQ(c.worker.gpu_index, 1);
  EXPECT_TRUE(c.data.mirror);
  EXPECT_EQ(c.data.mean_values, (std::vector<float>{104.0f, 117.5f, 123.0f}));
  EXPECT_EQ(c.model.weights, "runs/a/model_final.dpt");
}

TEST(RunConfigSetTest, BadOverridesNameTheFlag) {
  Status s;
  WithSets("", {"worker.steps=0"}, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--set worker.steps=0: worker.steps = 0: must be >= 1"));
  WithSets("", {"worker.stepz=5"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("--set worker.stepz=5: unknown key worker.stepz"));
  WithSets("", {"worker.steps=many"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("--set worker.steps=many: worker.steps = \"many\": expected an integer"));
  WithSets("", {"bogus.key=1"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("--set bogus.key=1: unknown table 'bogus'"));
  for (const char* malformed : {"steps=5", "worker.steps", ".x=1", "worker.=1", "a.b.c=1"}) {
    WithSets("", {malformed}, &s);
    EXPECT_THAT(s.message(), HasSubstr(fmt::format("--set {}: expected section.key=value", malformed)));
  }
  // A file error still names the file, not a flag.
  WithSets("[worker]\nsteps = 0\n", {"worker.batch_size=8"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("base.toml: worker.steps = 0"));
  // Cross-field rules name the flag that broke them.
  WithSets("[data]\nmean_file = \"m.binaryproto\"\n", {"data.mean_values=[1, 2, 3]"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("--set data.mean_values=[1, 2, 3]: data.mean_values"));
}

TEST(RunConfigSetTest, NewKeysRoundTripThroughToToml) {
  RunConfig c;
  c.model.weights = "w.caffemodel";
  c.data.mean_values = {104.0f, 117.0f, 123.0f};
  c.eval.at_start = true;
  RunConfig back;
  const Status s = ParseRunConfig(ToToml(c), "roundtrip", &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(back, c);
}

// ---- cluster.transport, cluster.ipc_dir, cluster.shared_memory; warnings -------------------

TEST(RunConfigClusterTransportTest, DefaultsAreTcpRunDirAndSharedMemory) {
  const RunConfig c = ParseOk("");
  EXPECT_EQ(c.cluster.transport, ClusterTransport::kTcp);
  EXPECT_EQ(c.cluster.ipc_dir, "");
  EXPECT_TRUE(c.cluster.shared_memory);
}

TEST(RunConfigClusterTransportTest, IpcParsesRoundTripsAndNamesTheSockets) {
  const RunConfig c =
      ParseOk("[cluster]\nservers = 3\ntransport = \"ipc\"\nipc_dir = \"/tmp/j\"\nshared_memory = false\n");
  EXPECT_EQ(c.cluster.transport, ClusterTransport::kIpc);
  EXPECT_FALSE(c.cluster.shared_memory);
  RunConfig back;
  ASSERT_TRUE(ParseRunConfig(ToToml(c), "roundtrip", &back).ok());
  EXPECT_EQ(back, c);
  EXPECT_EQ(ServerIpcPath(c.cluster, "/runs/r1", 2), "/tmp/j/server-2.sock");
  EXPECT_EQ(ServerAddress(c.cluster, "/runs/r1", 0), "ipc:///tmp/j/server-0.sock");
  ClusterConfig in_run = c.cluster;
  in_run.ipc_dir = "";
  EXPECT_EQ(ServerIpcPath(in_run, "/runs/r1", 1), "/runs/r1/server-1.sock");
  in_run.ipc_dir = "sock";
  EXPECT_EQ(ServerIpcPath(in_run, "/runs/r1", 1), "/runs/r1/sock/server-1.sock");
  // tcp: the launcher's port convention, a wildcard bind reached through loopback.
  ClusterConfig tcp;
  tcp.bind = "0.0.0.0";
  EXPECT_EQ(ServerAddress(tcp, "/runs/r1", 1), "tcp://127.0.0.1:5601");
}

TEST(RunConfigClusterTransportTest, UnknownTransportIsRefusedNamingTheKey) {
  EXPECT_THAT(ParseError("[cluster]\ntransport = \"shm\"\n"),
              HasSubstr("cluster.transport = \"shm\": expected \"tcp\" or \"ipc\""));
}

TEST(RunConfigClusterTransportTest, IpcWithAnOffHostBindIsRefusedNamingTransport) {
  const std::string e = ParseError("[cluster]\ntransport = \"ipc\"\nbind = \"0.0.0.0\"\n");
  EXPECT_THAT(e, HasSubstr("cluster.transport = \"ipc\""));
  EXPECT_THAT(e, HasSubstr("cluster.bind = \"0.0.0.0\""));
  Status s;
  WithSets("[cluster]\nbind = \"10.0.0.5\"\n", {"cluster.transport=ipc"}, &s);
  EXPECT_THAT(s.message(), HasSubstr("--set cluster.transport=ipc: cluster.transport"));
  // Loopback binds are one host.
  ParseOk("[cluster]\ntransport = \"ipc\"\nbind = \"127.0.0.1\"\n");
  ParseOk("[cluster]\ntransport = \"ipc\"\nbind = \"localhost\"\n");
}

TEST(RunConfigClusterTransportTest, SocketPathTooLongForSunPathNamesIpcDir) {
  RunConfig c = ParseOk("[cluster]\nservers = 12\ntransport = \"ipc\"\n");
  const std::string deep = "/" + std::string(95, 'd');  // + "/server-11.sock": 111 bytes
  Status s = CheckIpcPathLengths(c.cluster, deep);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cluster.ipc_dir = \"\" (the run directory)"));
  EXPECT_THAT(s.message(), HasSubstr(deep + "/server-11.sock"));  // the longest of the job's paths
  EXPECT_THAT(s.message(), HasSubstr("set cluster.ipc_dir to a shorter directory"));
  c.cluster.ipc_dir = "/tmp/short";
  EXPECT_TRUE(CheckIpcPathLengths(c.cluster, deep).ok());
  c.cluster.transport = ClusterTransport::kTcp;
  c.cluster.ipc_dir = "";
  EXPECT_TRUE(CheckIpcPathLengths(c.cluster, deep).ok());  // tcp has no socket paths
}

TEST(RunConfigWarningsTest, ChunksOf32MiBOrMoreAreWarnedNamingKeySizeAndWhy) {
  EXPECT_TRUE(RunConfigWarnings(RunConfig{}).empty());  // 4 MiB frames: no warning
  RunConfig c;
  c.cluster.chunk_elems = (int64_t{32} << 20) / 4 - 1;  // just under 32 MiB
  EXPECT_TRUE(RunConfigWarnings(c).empty());
  c.cluster.chunk_elems = (int64_t{32} << 20) / 4;  // exactly 32 MiB
  std::vector<std::string> w = RunConfigWarnings(c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_THAT(w[0], HasSubstr("cluster.chunk_elems = 8388608"));
  EXPECT_THAT(w[0], HasSubstr("32.0 MiB"));
  EXPECT_THAT(w[0], HasSubstr("mmap threshold"));
  // A warning, not an error: the config is valid.
  EXPECT_TRUE(ValidateRunConfig(c, "big.toml").ok());
}

TEST(RunConfigCompressionTest, DefaultsAreLosslessAndEverySettingRoundTrips) {
  const RunConfig d = ParseOk("");
  EXPECT_FALSE(d.compression.factors);
  EXPECT_EQ(d.compression.push, WireCodec::kFp32);
  EXPECT_EQ(d.compression.pull, WireCodec::kFp32);
  EXPECT_EQ(d.cluster.link_gbps, 0);
  RunConfig back;
  ASSERT_TRUE(ParseRunConfig(ToToml(d), "roundtrip", &back).ok()) << ToToml(d);
  EXPECT_EQ(back, d);
  const RunConfig c = ParseOk(
      "[cluster]\nlink_gbps = 10\n[compression]\nfactors = true\npush = \"topk\"\npull = \"bf16\"\n"
      "top_k_fraction = 0.05\nerror_feedback = false\ntop_k_warmup_pushes = 188\nfactor_threads = 4\n");
  EXPECT_TRUE(c.compression.factors);
  EXPECT_EQ(c.compression.push, WireCodec::kTopK);
  EXPECT_EQ(c.compression.pull, WireCodec::kBf16);
  EXPECT_DOUBLE_EQ(c.compression.top_k_fraction, 0.05);
  EXPECT_FALSE(c.compression.error_feedback);
  EXPECT_EQ(c.compression.top_k_warmup_pushes, 188);
  EXPECT_EQ(d.compression.top_k_warmup_pushes, 0);  // no warm-up by default
  EXPECT_EQ(c.compression.factor_threads, 4);
  EXPECT_EQ(d.compression.factor_threads, 1);  // one thread per shard by default
  EXPECT_DOUBLE_EQ(c.cluster.link_gbps, 10);
  ASSERT_TRUE(ParseRunConfig(ToToml(c), "roundtrip", &back).ok()) << ToToml(c);
  EXPECT_EQ(back, c);
  for (const char* name : {"fp32", "fp16", "bf16", "topk", "onebit"}) {
    WireCodec codec;
    ASSERT_TRUE(ParseWireCodec(name, &codec)) << name;
    EXPECT_STREQ(WireCodecName(codec), name);
  }
}

TEST(RunConfigCompressionTest, BadSettingsAreRefusedNamingTheKey) {
  EXPECT_THAT(ParseError("[compression]\npush = \"fp8\"\n"),
              HasSubstr("compression.push = \"fp8\": expected \"fp32\", \"fp16\", \"bf16\", \"topk\" or \"onebit\""));
  // Pulled weights are dense: top-k and 1-bit are push codecs only.
  EXPECT_THAT(ParseError("[compression]\npull = \"topk\"\n"),
              HasSubstr("compression.pull = \"topk\": expected \"fp32\", \"fp16\" or \"bf16\""));
  for (const char* bad : {"0", "-0.1", "1.5"}) {
    EXPECT_THAT(ParseError(std::string("[compression]\ntop_k_fraction = ") + bad + "\n"),
                HasSubstr("compression.top_k_fraction")) << bad;
    EXPECT_THAT(ParseError(std::string("[compression]\ntop_k_fraction = ") + bad + "\n"), HasSubstr("(0, 1]"));
  }
  EXPECT_DOUBLE_EQ(ParseOk("[compression]\ntop_k_fraction = 1\n").compression.top_k_fraction, 1.0);
  EXPECT_THAT(ParseError("[compression]\ntop_k_warmup_pushes = -1\n"),
              HasSubstr("compression.top_k_warmup_pushes = -1: must be >= 0"));
  EXPECT_THAT(ParseError("[compression]\ntop_k_warmup_pushes = 2.5\n"), HasSubstr("compression.top_k_warmup_pushes"));
  for (const char* bad : {"0", "-2", "65"}) {
    EXPECT_THAT(ParseError(std::string("[compression]\nfactor_threads = ") + bad + "\n"),
                HasSubstr(std::string("compression.factor_threads = ") + bad + ": must be in 1..64"));
  }
  EXPECT_THAT(ParseError("[compression]\nfactor_threads = 1.5\n"), HasSubstr("compression.factor_threads"));
  for (const char* bad : {"0", "-2", "65"}) {
    EXPECT_THAT(ParseError(std::string("[cluster]\nserver_threads = ") + bad + "\n"),
                HasSubstr(std::string("cluster.server_threads = ") + bad + ": must be in 1..64"));
  }
  EXPECT_THAT(ParseError("[cluster]\nserver_threads = 1.5\n"), HasSubstr("cluster.server_threads"));
  EXPECT_EQ(ParseOk("[cluster]\nserver_threads = 64\n").cluster.server_threads, 64);
  EXPECT_EQ(ParseOk("").cluster.server_threads, 1);  // one apply lane by default
  for (const char* bad : {"0", "-1", "17"}) {
    EXPECT_THAT(ParseError(std::string("[cluster]\nio_threads = ") + bad + "\n"),
                HasSubstr(std::string("cluster.io_threads = ") + bad + ": must be in 1..16"));
  }
  EXPECT_EQ(ParseOk("").cluster.io_threads, 2);
  EXPECT_EQ(ParseOk("[cluster]\nio_threads = 16\n").cluster.io_threads, 16);
  for (const char* bad : {"0", "-3", "9"}) {
    EXPECT_THAT(ParseError(std::string("[cluster]\nconnections_per_server = ") + bad + "\n"),
                HasSubstr(std::string("cluster.connections_per_server = ") + bad + ": must be in 1..8"));
  }
  EXPECT_THAT(ParseError("[cluster]\nconnections_per_server = \"two\"\n"), HasSubstr("cluster.connections_per_server"));
  EXPECT_EQ(ParseOk("").cluster.connections_per_server, 1);
  EXPECT_EQ(ParseOk("[cluster]\nconnections_per_server = 8\n").cluster.connections_per_server, 8);
  for (const char* bad : {"0", "-16", "4097"}) {
    EXPECT_THAT(ParseError(std::string("[cluster]\ninflight_mb = ") + bad + "\n"),
                HasSubstr(std::string("cluster.inflight_mb = ") + bad + ": must be in 1..4096"));
  }
  EXPECT_EQ(ParseOk("").cluster.inflight_mb, 128);
  EXPECT_EQ(ParseOk("[cluster]\ninflight_mb = 16\n").cluster.inflight_mb, 16);
  EXPECT_THAT(ParseError("[cluster]\ninflight_mb = 256\n"),
              HasSubstr("cluster.inflight_mb = 256: must be < cluster.peer_queue_mb (256)"));
  EXPECT_EQ(ParseOk("[cluster]\ninflight_mb = 256\npeer_queue_mb = 512\n").cluster.inflight_mb, 256);
  EXPECT_THAT(ParseError("[cluster]\nsend_order = \"priority\"\n"), HasSubstr("cluster.send_order"));
  EXPECT_EQ(ParseOk("").cluster.send_order, SendOrder::kCall);
  EXPECT_EQ(ParseOk("[cluster]\nsend_order = \"layer\"\n").cluster.send_order, SendOrder::kLayer);
  for (const char* bad : {"-1", "10000001"}) {
    EXPECT_THAT(ParseError(std::string("[cluster]\ntrace_events = ") + bad + "\n"),
                HasSubstr(std::string("cluster.trace_events = ") + bad + ": must be in 0..10000000 (0 = off)"));
  }
  EXPECT_THAT(ParseError("[cluster]\ntrace_events = \"many\"\n"), HasSubstr("cluster.trace_events"));
  EXPECT_EQ(ParseOk("[cluster]\ntrace_events = 10000000\n").cluster.trace_events, 10000000);
  EXPECT_EQ(ParseOk("").cluster.trace_events, 0);  // off by default
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    const std::string e = ParseError(std::string("[cluster]\nlink_gbps = ") + bad + "\n");
    EXPECT_THAT(e, HasSubstr("cluster.link_gbps")) << bad;
    EXPECT_THAT(e, HasSubstr("> 0")) << bad;
  }
  EXPECT_THAT(ParseError("[compression]\nfactor = true\n"), HasSubstr("factor"));  // misspelt key
  // cluster.reply_order: "arrival" by default, "step" only on an emulated link.
  EXPECT_EQ(ParseOk("").cluster.reply_order, ReplyOrder::kArrival);
  const RunConfig step = ParseOk("[cluster]\nlink_gbps = 10\nreply_order = \"step\"\n");
  EXPECT_EQ(step.cluster.reply_order, ReplyOrder::kStep);
  RunConfig back;
  ASSERT_TRUE(ParseRunConfig(ToToml(step), "roundtrip", &back).ok()) << ToToml(step);
  EXPECT_EQ(back, step);
  EXPECT_THAT(ParseError("[cluster]\nreply_order = \"fifo\"\n"),
              HasSubstr("cluster.reply_order = \"fifo\": expected \"arrival\" or \"step\""));
  EXPECT_THAT(ParseError("[cluster]\nreply_order = \"step\"\n"),
              HasSubstr("cluster.reply_order = \"step\": \"step\" orders replies on an emulated link: it needs "
                        "cluster.link_gbps"));
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

constexpr std::string_view kOwnData = R"(
[data]
sharding = "own"
)";

TEST(RunConfigModelsTest, ModelsEntriesOverrideTheRunSolverAndRoundTrip) {
  const std::string text = std::string(R"(
[solver]
base_lr = 0.02
weight_decay = 0.0005
momentum = 0.9
[rotation]
scheme = "pipeline"
passes = 3
stage_steps = 50
[[models]]
name = "small-lr"
[models.solver]
base_lr = 0.005
[[models]]
name = "wide"
config = "configs/models/cifar10_small.toml"
solver = { weight_decay = 0.001, momentum = 0.8 }
)") + std::string(kOwnData);
  const RunConfig c = ParseOk(text);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].name, "small-lr");
  EXPECT_EQ(c.models[0].config, c.model.config);  // [model].config by default
  EXPECT_FLOAT_EQ(c.models[0].solver.base_lr, 0.005f);
  EXPECT_FLOAT_EQ(c.models[0].solver.weight_decay, 0.0005f);  // the run's, not overridden
  EXPECT_EQ(c.models[1].config, "configs/models/cifar10_small.toml");
  EXPECT_FLOAT_EQ(c.models[1].solver.base_lr, 0.02f);
  EXPECT_FLOAT_EQ(c.models[1].solver.weight_decay, 0.001f);
  EXPECT_FLOAT_EQ(c.models[1].solver.momentum, 0.8f);
  EXPECT_EQ(c.rotation.scheme, RotationScheme::kPipeline);
  EXPECT_EQ(c.rotation.passes, 3);
  EXPECT_EQ(c.rotation.stage_steps, 50);
  EXPECT_EQ(c.rotation.groups, RotationGroups::kDataParallel);  // the default
  RunConfig back;
  const Status s = ParseRunConfig(ToToml(c), "roundtrip.toml", &back);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << ToToml(c);
  EXPECT_EQ(back, c) << ToToml(c);
}

TEST(RunConfigModelsTest, SweepExpandsToTheCrossProductNamedByItsValues) {
  const RunConfig c = ParseOk(std::string(R"(
[solver]
momentum = 0.9
[sweep]
solver.base_lr = [0.01, 0.02]
solver.weight_decay = [0.0005, 0.001, 0]
)") + std::string(kOwnData) + "[rotation]\nstage_steps = 10\n");
  ASSERT_EQ(c.models.size(), 6u);
  EXPECT_EQ(c.models[0].name, "base_lr=0.01+weight_decay=0.0005");
  EXPECT_FLOAT_EQ(c.models[0].solver.base_lr, 0.01f);
  EXPECT_FLOAT_EQ(c.models[2].solver.weight_decay, 0.0f);
  EXPECT_EQ(c.models[5].name, "base_lr=0.02+weight_decay=0");
  EXPECT_FLOAT_EQ(c.models[5].solver.base_lr, 0.02f);
  for (const ModelEntry& m : c.models) EXPECT_FLOAT_EQ(m.solver.momentum, 0.9f);
  // Stored expanded: what every process reads back is the same K models.
  RunConfig back;
  ASSERT_TRUE(ParseRunConfig(ToToml(c), "roundtrip.toml", &back).ok());
  EXPECT_EQ(back.models, c.models);
}

TEST(RunConfigModelsTest, ModelSolverResolvesPolyMaxIterToTheModelsPlannedBatches) {
  RunConfig c = ParseOk(std::string(R"(
[cluster]
workers = 4
[solver]
lr_policy = "poly"
max_iter = 0
[rotation]
passes = 2
stage_steps = 25
[sweep]
solver.base_lr = [0.01, 0.02]
)") + std::string(kOwnData));
  EXPECT_EQ(ModelSolver(c, 1).max_iter, 2 * 4 * 25);
  EXPECT_FLOAT_EQ(ModelSolver(c, 1).base_lr, 0.02f);
}

TEST(RunConfigModelsTest, BadModelListsGetOneErrorNamingTheKey) {
  const std::string own(kOwnData);
  EXPECT_THAT(ParseError("models = []\n" + own), HasSubstr("no models (K = 0)"));
  EXPECT_THAT(ParseError(own + "[[models]]\nname = \"a\"\n[[models]]\nname = \"a\"\n"),
              HasSubstr("models[1].name = \"a\": the same name as models[0]"));
  EXPECT_THAT(ParseError(own + "[[models]]\nconfig = \"x.toml\"\n"), HasSubstr("models[0].name is missing"));
  EXPECT_THAT(ParseError(own + "[[models]]\nname = \"a/b\"\n"), HasSubstr("models[0].name = \"a/b\""));
  EXPECT_THAT(ParseError(own + "[[models]]\nname = \"a\"\nlr = 1\n"), HasSubstr("unknown key models[0].lr"));
  EXPECT_THAT(ParseError(own + "[[models]]\nname = \"a\"\n[models.solver]\nbase_lr = -1\n"),
              HasSubstr("models[0].solver.base_lr = -1: must be finite and > 0"));
  EXPECT_THAT(ParseError(own + "[[models]]\nname = \"a\"\n[models.solver]\nlearning_rate = 1\n"),
              HasSubstr("unknown key models[0].solver.learning_rate"));
  EXPECT_THAT(ParseError(own + "[sweep]\nsolver.learning_rate = [0.1, 0.2]\n"),
              HasSubstr("sweep.solver.learning_rate = [0.1, 0.2]: not a sweepable key"));
  EXPECT_THAT(ParseError(own + "[sweep]\nworker.batch_size = [32, 64]\n"), HasSubstr("sweep.worker.batch_size"));
  EXPECT_THAT(ParseError(own + "[sweep]\nsolver.base_lr = []\n"), HasSubstr("sweep.solver.base_lr = []: an empty list"));
  EXPECT_THAT(ParseError(own + "[sweep]\nsolver.base_lr = \"0.1\"\n"), HasSubstr("expected a list of values"));
  EXPECT_THAT(ParseError(own + "[sweep]\nsolver.base_lr = [0.1]\n[[models]]\nname = \"a\"\n"),
              HasSubstr("give [[models]] or [sweep], not both"));
  // The pipeline moves models, not data: each worker must have a partition of its own.
  EXPECT_THAT(ParseError("[[models]]\nname = \"a\"\n"), HasSubstr("data.sharding = \"slice\""));
  EXPECT_THAT(ParseError(own + "[rotation]\nscheme = \"round-robin\"\n"), HasSubstr("rotation.scheme = \"round-robin\""));
  EXPECT_THAT(ParseError(own + "[rotation]\npasses = 0\n"), HasSubstr("rotation.passes = 0: must be >= 1"));
  EXPECT_THAT(ParseError(own + "[solver]\nlr_policy = \"poly\"\nmax_iter = 0\n[[models]]\nname = \"a\"\n"),
              HasSubstr("models[0].solver.max_iter = 0"));
  // K = 1 < W = 4: the holders of a stage train the model together, so they need a fixed stage
  // length, a mode whose rounds can follow the holders, and backups fewer than a group.
  const std::string one = own + "[cluster]\nworkers = 4\n[solver]\nlr_policy = \"fixed\"\n[[models]]\nname = \"a\"\n";
  EXPECT_THAT(ParseError(one + "[rotation]\ngroups = \"mean\"\n"),
              HasSubstr("rotation.groups = \"mean\": expected \"data_parallel\" or \"average\""));
  EXPECT_THAT(ParseError(one), HasSubstr("rotation.stage_steps = 0: a pipeline of 1 models on 4 workers"));
  EXPECT_THAT(ParseError(one + "[rotation]\nstage_steps = 5\n[consistency]\nmode = \"ssp:3\"\n"),
              HasSubstr("consistency.mode = \"ssp:3\": ssp bounds the clocks"));
  EXPECT_THAT(ParseError(own + "[cluster]\nworkers = 4\n[solver]\nlr_policy = \"fixed\"\n[sweep]\nsolver.base_lr = [0.1, "
                         "0.2]\n[rotation]\nstage_steps = 5\n[consistency]\nmode = \"sync\"\nbackup_workers = 2\n"),
              HasSubstr("consistency.backup_workers = 2: must be < the smallest group of holders of a model in a stage "
                        "(2 = 4 workers / 2 models)"));
  // Averaging the copies once per stage needs none of that; nor does K >= W.
  EXPECT_EQ(ParseOk(one + "[rotation]\ngroups = \"average\"\n").rotation.groups, RotationGroups::kAverage);
  ParseOk(own + "[cluster]\nworkers = 2\n[solver]\nlr_policy = \"fixed\"\n[sweep]\nsolver.base_lr = [0.1, 0.2]\n");
}

}  // namespace
}  // namespace downpour
