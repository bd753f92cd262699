// run_config.cc — TOML → RunConfig, validation, and RunConfig → TOML.
#include "common/run_config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <type_traits>

#include "common/net_address.h"

namespace downpour {
namespace {

constexpr std::string_view kLrPolicyNames[] = {"fixed", "step", "multistep", "poly", "inv", "exp"};
constexpr std::string_view kUpdateRuleNames[] = {"momentum", "adagrad"};
// The wire codecs, in WireCodec's order; the first kDenseWireCodecs (fp32, fp16, bf16) are dense.
constexpr std::array<std::string_view, 5> kWireCodecNames = {"fp32", "fp16", "bf16", "topk", "onebit"};
constexpr size_t kDenseWireCodecs = 3;
static_assert(static_cast<size_t>(WireCodec::kBf16) + 1 == kDenseWireCodecs, "the dense codecs come first");

// A string in double quotes with TOML/JSON basic-string escapes.
std::string Quote(std::string_view v) {
  std::string out = "\"";
  for (char ch : v) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// The value of a TOML node as it would be written in the file, for error messages.
std::string NodeText(const toml::node& node) {
  if (const auto* s = node.as_string()) return Quote(s->get());
  if (const auto* arr = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < arr->size(); ++i) out += (i ? ", " : "") + NodeText(*arr->get(i));
    return out + "]";
  }
  if (node.is_table()) return "{...}";
  if (const auto* d = node.as_floating_point()) return fmt::format("{}", d->get());  // shortest: 0.1, not 0.1000...01
  std::ostringstream os;
  node.visit([&os](const auto& v) { os << v; });
  return os.str();
}

// Reads the keys of one table and remembers which ones it consumed, so that Finish() can
// reject the rest. A missing table (nullptr) reads as all defaults.
class TableReader {
 public:
  // `overridden`: "table.key" → the --set text that gave it, so errors name the flag.
  TableReader(const toml::table* table, std::string_view name, const std::string& source,
              const std::map<std::string, std::string>& overridden)
      : table_(table), name_(name), source_(source), overridden_(overridden) {}

  const toml::node* Get(const char* key) {
    known_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }

  Status Bad(const char* key, const toml::node& node, std::string_view why) const {
    return InvalidArgument("{}: {}.{} = {}: {}", SourceOf(key), name_, key, NodeText(node), why);
  }

  template <typename T>
  Status Int(const char* key, T* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_integer()) return Bad(key, *n, "expected an integer");
    const int64_t v = n->as_integer()->get();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return Bad(key, *n, "out of range");
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }

  template <typename T>
  Status Float(const char* key, T* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (n->is_integer()) {
      *out = static_cast<T>(n->as_integer()->get());
    } else if (n->is_floating_point()) {
      *out = static_cast<T>(n->as_floating_point()->get());
    } else {
      return Bad(key, *n, "expected a number");
    }
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_boolean()) return Bad(key, *n, "expected true or false");
    *out = n->as_boolean()->get();
    return Status::Ok();
  }

  Status String(const char* key, std::string* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_string()) return Bad(key, *n, "expected a string");
    *out = n->as_string()->get();
    return Status::Ok();
  }

  Status IntList(const char* key, std::vector<int64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    const toml::array* arr = n->as_array();
    if (!arr) return Bad(key, *n, "expected an array of integers");
    out->clear();
    for (const toml::node& e : *arr) {
      if (!e.is_integer()) return Bad(key, *n, "expected an array of integers");
      out->push_back(e.as_integer()->get());
    }
    return Status::Ok();
  }

  Status FloatList(const char* key, std::vector<float>* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    const toml::array* arr = n->as_array();
    if (!arr) return Bad(key, *n, "expected an array of numbers");
    out->clear();
    for (const toml::node& e : *arr) {
      if (e.is_integer()) {
        out->push_back(static_cast<float>(e.as_integer()->get()));
      } else if (e.is_floating_point()) {
        out->push_back(static_cast<float>(e.as_floating_point()->get()));
      } else {
        return Bad(key, *n, "expected an array of numbers");
      }
    }
    return Status::Ok();
  }

  // Rejects keys this reader was never asked about.
  Status Finish() const {
    if (!table_) return Status::Ok();
    for (const auto& [k, v] : *table_) {
      if (!known_.count(std::string(k.str()))) {
        return InvalidArgument("{}: unknown key {}.{} = {} (known keys: {})", SourceOf(k.str()), name_,
                               k.str(), NodeText(v), fmt::join(known_, ", "));
      }
    }
    return Status::Ok();
  }

 private:
  std::string SourceOf(std::string_view key) const {
    const auto it = overridden_.find(fmt::format("{}.{}", name_, key));
    return it == overridden_.end() ? source_ : fmt::format("--set {}", it->second);
  }

  const toml::table* table_;
  std::string name_;
  const std::string& source_;
  const std::map<std::string, std::string>& overridden_;
  std::set<std::string> known_;
};

Status ReadRun(TableReader& r, RunSection* s) {
  DP_RETURN_IF_ERROR(r.String("name", &s->name));
  DP_RETURN_IF_ERROR(r.String("out_dir", &s->out_dir));
  DP_RETURN_IF_ERROR(r.Int("seed", &s->seed));
  return r.Finish();
}

// The names of the enum settings, in the enums' order (run_config.h).
constexpr std::string_view kClusterTransportNames[] = {"tcp", "ipc"};
constexpr std::string_view kReplyOrderNames[] = {"arrival", "step"};
constexpr std::string_view kDataShardingNames[] = {"slice", "own"};
constexpr std::string_view kRotationSchemeNames[] = {"pipeline", "sequential", "independent"};
constexpr std::string_view kRotationGroupsNames[] = {"data_parallel", "average"};

// What an enum setting's error says it expected: expected "a", "b" or "c" (every key's names
// are listed the same way).
std::string ExpectedNames(std::span<const std::string_view> names) {
  std::string expected = "expected ";
  for (size_t i = 0; i < names.size(); ++i) {
    expected += fmt::format("{}\"{}\"", i == 0 ? "" : i + 1 == names.size() ? " or " : ", ", names[i]);
  }
  return expected;
}

// `key`, when given, as the enum value whose index in `names` it is; anything else is refused
// naming the key and listing the names.
template <typename Enum, size_t N>
Status ReadNamed(TableReader& r, const char* key, const std::string_view (&names)[N], Enum* out) {
  static_assert(N >= 2);
  const toml::node* n = r.Get(key);
  if (n == nullptr) return Status::Ok();
  const auto text = n->value<std::string>();
  for (size_t i = 0; text && i < N; ++i) {
    if (*text == names[i]) {
      *out = static_cast<Enum>(i);
      return Status::Ok();
    }
  }
  return r.Bad(key, *n, ExpectedNames(names));
}

Status ReadModel(TableReader& r, ModelSection* s) {
  DP_RETURN_IF_ERROR(r.String("config", &s->config));
  DP_RETURN_IF_ERROR(r.String("weights", &s->weights));
  return r.Finish();
}

Status ReadCluster(TableReader& r, ClusterConfig* c) {
  DP_RETURN_IF_ERROR(r.Int("servers", &c->servers));
  DP_RETURN_IF_ERROR(r.Int("workers", &c->workers));
  DP_RETURN_IF_ERROR(r.String("coordinator", &c->coordinator));
  DP_RETURN_IF_ERROR(r.Int("base_port", &c->base_port));
  DP_RETURN_IF_ERROR(r.String("bind", &c->bind));
  DP_RETURN_IF_ERROR(r.String("advertise", &c->advertise));
  DP_RETURN_IF_ERROR(r.Int("heartbeat_ms", &c->heartbeat_ms));
  DP_RETURN_IF_ERROR(r.Int("heartbeat_timeout_ms", &c->heartbeat_timeout_ms));
  DP_RETURN_IF_ERROR(r.Int("chunk_elems", &c->chunk_elems));
  DP_RETURN_IF_ERROR(r.Int("server_restarts", &c->server_restarts));
  DP_RETURN_IF_ERROR(r.Int("coordinator_restarts", &c->coordinator_restarts));
  DP_RETURN_IF_ERROR(r.Int("restart_workers", &c->restart_workers));
  DP_RETURN_IF_ERROR(r.Int("server_wait_ms", &c->server_wait_ms));
  DP_RETURN_IF_ERROR(r.Int("max_workers", &c->max_workers));
  DP_RETURN_IF_ERROR(r.Int("peer_queue_mb", &c->peer_queue_mb));
  DP_RETURN_IF_ERROR(r.Int("server_threads", &c->server_threads));
  DP_RETURN_IF_ERROR(r.Int("io_threads", &c->io_threads));
  DP_RETURN_IF_ERROR(r.Int("connections_per_server", &c->connections_per_server));
  DP_RETURN_IF_ERROR(r.Int("trace_events", &c->trace_events));
  DP_RETURN_IF_ERROR(ReadNamed(r, "transport", kClusterTransportNames, &c->transport));
  DP_RETURN_IF_ERROR(r.String("ipc_dir", &c->ipc_dir));
  DP_RETURN_IF_ERROR(r.Bool("shared_memory", &c->shared_memory));
  DP_RETURN_IF_ERROR(ReadNamed(r, "reply_order", kReplyOrderNames, &c->reply_order));
  if (const toml::node* n = r.Get("link_gbps")) {
    // Absent = off; a value given must be a link speed (0 or less is a mistake, not "off").
    DP_RETURN_IF_ERROR(r.Float("link_gbps", &c->link_gbps));
    if (!(c->link_gbps > 0) || !std::isfinite(c->link_gbps)) {
      return r.Bad("link_gbps", *n, "must be a finite link speed > 0 in Gbit/s (leave it out for no emulated link)");
    }
  }
  return r.Finish();
}

Status ReadCodec(TableReader& r, const char* key, bool push, WireCodec* out) {
  const toml::node* n = r.Get(key);
  if (n == nullptr) return Status::Ok();
  const auto text = n->value<std::string>();
  // A pull is a copy of the weights: the dense codecs only.
  const size_t allowed = push ? kWireCodecNames.size() : kDenseWireCodecs;
  if (!text || !ParseWireCodec(*text, out) || static_cast<size_t>(*out) >= allowed) {
    return r.Bad(key, *n, ExpectedNames(std::span(kWireCodecNames).first(allowed)));
  }
  return Status::Ok();
}

Status ReadCompression(TableReader& r, CompressionConfig* c) {
  DP_RETURN_IF_ERROR(r.Bool("factors", &c->factors));
  DP_RETURN_IF_ERROR(ReadCodec(r, "push", /*push=*/true, &c->push));
  DP_RETURN_IF_ERROR(ReadCodec(r, "pull", /*push=*/false, &c->pull));
  DP_RETURN_IF_ERROR(r.Float("top_k_fraction", &c->top_k_fraction));
  DP_RETURN_IF_ERROR(r.Int("top_k_warmup_pushes", &c->top_k_warmup_pushes));
  DP_RETURN_IF_ERROR(r.Bool("error_feedback", &c->error_feedback));
  DP_RETURN_IF_ERROR(r.Int("factor_threads", &c->factor_threads));
  return r.Finish();
}

Status ReadSolver(TableReader& r, SolverConfig* s) {
  DP_RETURN_IF_ERROR(r.Float("base_lr", &s->base_lr));
  if (const toml::node* n = r.Get("lr_policy")) {
    const auto text = n->value<std::string>();
    if (!text || !ParseLrPolicy(*text, &s->lr_policy)) {
      return r.Bad("lr_policy", *n, ExpectedNames(kLrPolicyNames));
    }
  }
  DP_RETURN_IF_ERROR(r.Float("gamma", &s->gamma));
  DP_RETURN_IF_ERROR(r.Float("power", &s->power));
  DP_RETURN_IF_ERROR(r.Int("stepsize", &s->stepsize));
  DP_RETURN_IF_ERROR(r.IntList("stepvalues", &s->stepvalues));
  DP_RETURN_IF_ERROR(r.Int("max_iter", &s->max_iter));
  DP_RETURN_IF_ERROR(r.Float("momentum", &s->momentum));
  DP_RETURN_IF_ERROR(r.Float("weight_decay", &s->weight_decay));
  DP_RETURN_IF_ERROR(r.Float("clip_gradients", &s->clip_gradients));
  if (const toml::node* n = r.Get("update")) {
    const auto text = n->value<std::string>();
    if (!text || !ParseUpdateRule(*text, &s->update)) return r.Bad("update", *n, ExpectedNames(kUpdateRuleNames));
  }
  DP_RETURN_IF_ERROR(r.Float("adagrad_epsilon", &s->adagrad_epsilon));
  DP_RETURN_IF_ERROR(r.Float("adagrad_initial", &s->adagrad_initial));
  return r.Finish();
}

// "async" | "sync" | "ssp:<s>" with s a non-negative integer.
bool ParseConsistencyMode(std::string_view text, ConsistencyConfig* c) {
  if (text == "async") {
    c->mode = ConsistencyMode::kAsync;
    c->staleness_bound = 0;
    return true;
  }
  if (text == "sync") {
    c->mode = ConsistencyMode::kSync;
    c->staleness_bound = 0;
    return true;
  }
  if (!text.starts_with("ssp:") || text.size() == 4 || text.size() > 4 + 9) return false;
  int s = 0;
  for (char ch : text.substr(4)) {
    if (ch < '0' || ch > '9') return false;
    s = s * 10 + (ch - '0');
  }
  c->mode = ConsistencyMode::kSsp;
  c->staleness_bound = s;
  return true;
}

Status ReadConsistency(TableReader& r, ConsistencyConfig* c) {
  if (const toml::node* n = r.Get("mode")) {
    const auto text = n->value<std::string>();
    if (!text || !ParseConsistencyMode(*text, c)) {
      return r.Bad("mode", *n, "expected \"async\", \"sync\" or \"ssp:<s>\" with s >= 0");
    }
  }
  DP_RETURN_IF_ERROR(r.Int("backup_workers", &c->backup_workers));
  DP_RETURN_IF_ERROR(r.Bool("staleness_aware_lr", &c->staleness_aware_lr));
  if (const toml::node* n = r.Get("algorithm")) {
    const auto text = n->value<std::string>();
    if (!text || !ParseAlgorithm(*text, &c->algorithm)) {
      return r.Bad("algorithm", *n,
                   "expected \"sgd\" (the gradient as pushed), \"dc-asgd\" (delay compensation, constant lambda), "
                   "\"dc-asgd-a\" (delay compensation, adaptive lambda) or \"easgd\" (elastic averaging)");
    }
  }
  DP_RETURN_IF_ERROR(r.Float("dc_lambda", &c->dc_lambda));
  DP_RETURN_IF_ERROR(r.Float("dc_lambda0", &c->dc_lambda0));
  DP_RETURN_IF_ERROR(r.Float("dc_mean_square_decay", &c->dc_mean_square_decay));
  DP_RETURN_IF_ERROR(r.Int("easgd_tau", &c->easgd_tau));
  DP_RETURN_IF_ERROR(r.Float("easgd_alpha", &c->easgd_alpha));
  return r.Finish();
}

// "cpu" | "gpu:N".
bool ParseDevice(std::string_view text, WorkerConfig* w) {
  if (text == "cpu") {
    w->device = DeviceKind::kCpu;
    w->gpu_index = 0;
    return true;
  }
  if (!text.starts_with("gpu:") || text.size() == 4 || text.size() > 4 + 4) return false;
  int index = 0;
  for (char ch : text.substr(4)) {
    if (ch < '0' || ch > '9') return false;
    index = index * 10 + (ch - '0');
  }
  w->device = DeviceKind::kGpu;
  w->gpu_index = index;
  return true;
}

Status ReadWorker(TableReader& r, WorkerConfig* w) {
  DP_RETURN_IF_ERROR(r.Int("batch_size", &w->batch_size));
  DP_RETURN_IF_ERROR(r.Int("steps", &w->steps));
  DP_RETURN_IF_ERROR(r.Int("epochs", &w->epochs));
  DP_RETURN_IF_ERROR(r.Int("pull_every", &w->pull_every));
  DP_RETURN_IF_ERROR(r.Int("push_every", &w->push_every));
  DP_RETURN_IF_ERROR(r.Int("outstanding_steps", &w->outstanding_steps));
  if (const toml::node* n = r.Get("device")) {
    const auto text = n->value<std::string>();
    if (!text || !ParseDevice(*text, w)) return r.Bad("device", *n, "expected \"cpu\" or \"gpu:N\"");
  }
  DP_RETURN_IF_ERROR(r.Int("threads", &w->threads));
  DP_RETURN_IF_ERROR(r.Int("straggler", &w->straggler));
  DP_RETURN_IF_ERROR(r.Int("straggler_delay_ms", &w->straggler_delay_ms));
  DP_RETURN_IF_ERROR(r.FloatList("emulate_ms", &w->emulate_ms));
  DP_RETURN_IF_ERROR(r.Bool("tf32", &w->tf32));
  DP_RETURN_IF_ERROR(r.String("conv_algo", &w->conv_algo));
  return r.Finish();
}

Status ReadData(TableReader& r, DataConfig* d) {
  DP_RETURN_IF_ERROR(r.String("train", &d->train));
  DP_RETURN_IF_ERROR(r.String("test", &d->test));
  DP_RETURN_IF_ERROR(ReadNamed(r, "sharding", kDataShardingNames, &d->sharding));
  DP_RETURN_IF_ERROR(r.Int("crop", &d->crop));
  DP_RETURN_IF_ERROR(r.Int("pad", &d->pad));
  DP_RETURN_IF_ERROR(r.Bool("mirror", &d->mirror));
  DP_RETURN_IF_ERROR(r.String("mean_file", &d->mean_file));
  DP_RETURN_IF_ERROR(r.FloatList("mean_values", &d->mean_values));
  DP_RETURN_IF_ERROR(r.Float("scale", &d->scale));
  DP_RETURN_IF_ERROR(r.Int("prefetch", &d->prefetch));
  return r.Finish();
}

Status ReadEval(TableReader& r, EvalConfig* e) {
  DP_RETURN_IF_ERROR(r.Bool("evaluator", &e->evaluator));
  DP_RETURN_IF_ERROR(r.Int("every_steps", &e->every_steps));
  DP_RETURN_IF_ERROR(r.Int("every_updates", &e->every_updates));
  DP_RETURN_IF_ERROR(r.Float("every_seconds", &e->every_seconds));
  DP_RETURN_IF_ERROR(r.Int("test_batches", &e->test_batches));
  DP_RETURN_IF_ERROR(r.Bool("at_start", &e->at_start));
  return r.Finish();
}

Status ReadCheckpoint(TableReader& r, CheckpointConfig* c) {
  DP_RETURN_IF_ERROR(r.Int("every_updates", &c->every_updates));
  DP_RETURN_IF_ERROR(r.String("dir", &c->dir));
  DP_RETURN_IF_ERROR(r.Bool("wal", &c->wal));
  DP_RETURN_IF_ERROR(r.Int("wal_fsync_ms", &c->wal_fsync_ms));
  DP_RETURN_IF_ERROR(r.Int("wal_max_mb", &c->wal_max_mb));
  return r.Finish();
}

Status ReadSecurity(TableReader& r, SecurityConfig* c) {
  DP_RETURN_IF_ERROR(r.String("keys", &c->keys));
  DP_RETURN_IF_ERROR(r.Bool("insecure", &c->insecure));
  return r.Finish();
}

// One range rule: "<source>: <table.key> = <value>: <why>".
class Validator {
 public:
  Validator(const std::string& source, const std::map<std::string, std::string>& overridden)
      : source_(source), overridden_(overridden) {}

  template <typename T>
  Validator& Check(bool ok, std::string_view field, const T& value, std::string_view why) {
    if (ok || !status_.ok()) return *this;
    const auto it = overridden_.find(std::string(field));
    const std::string source = it == overridden_.end() ? source_ : fmt::format("--set {}", it->second);
    if constexpr (std::is_same_v<T, std::string>) {
      status_ = InvalidArgument("{}: {} = {}: {}", source, field, Quote(value), why);
    } else {
      status_ = InvalidArgument("{}: {} = {}: {}", source, field, value, why);
    }
    return *this;
  }
  Status status() const { return status_; }

 private:
  const std::string& source_;
  const std::map<std::string, std::string>& overridden_;
  Status status_;
};

// Applies one "table.key=value" override to the parsed file. The value is TOML (7, 0.5, true,
// "text", [1, 2]); text that is not valid TOML is taken as a bare string (gpu:0, /data/x).
Status ApplyOverride(const std::string& text, toml::table* root, std::map<std::string, std::string>* overridden) {
  const size_t eq = text.find('=');
  const std::string key = eq == std::string::npos ? text : text.substr(0, eq);
  const size_t dot = key.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == key.size() ||
      key.find('.', dot + 1) != std::string::npos) {
    return InvalidArgument("--set {}: expected section.key=value, e.g. --set worker.steps=500", text);
  }
  const std::string table = key.substr(0, dot), name = key.substr(dot + 1), value = text.substr(eq + 1);
  toml::node_view<toml::node> existing = (*root)[table];
  if (existing && !existing.is_table()) {
    return InvalidArgument("--set {}: '{}' is not a table in the config", text, table);
  }
  if (!existing) root->insert(table, toml::table{});
  toml::table& t = *(*root)[table].as_table();
  try {
    toml::table parsed = toml::parse("v = " + value);
    t.insert_or_assign(name, std::move(*parsed.get("v")));
  } catch (const toml::parse_error&) {
    t.insert_or_assign(name, value);
  }
  (*overridden)[key] = text;
  return Status::Ok();
}

// host:port with a non-empty host and a port in 1..65535.
bool IsHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  int64_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || i - colon > 5) return false;
    port = port * 10 + (s[i] - '0');
  }
  return port >= 1 && port <= 65535;
}

// Shortest text that reads back to the same float/double, always with a '.' or exponent so
// TOML reads it as a float.
template <typename T>
std::string FloatText(T v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf / nan
  return s;
}

Status ReadRotation(TableReader& r, RotationConfig* c) {
  DP_RETURN_IF_ERROR(ReadNamed(r, "scheme", kRotationSchemeNames, &c->scheme));
  DP_RETURN_IF_ERROR(r.Int("passes", &c->passes));
  DP_RETURN_IF_ERROR(r.Int("stage_steps", &c->stage_steps));
  DP_RETURN_IF_ERROR(ReadNamed(r, "groups", kRotationGroupsNames, &c->groups));
  return r.Finish();
}

// [[models]]: an array of tables {name, config, solver = {...}}; each entry's solver starts
// from the run's [solver].
Status ReadModels(const toml::node& node, const RunConfig& base, const std::string& source,
                  const std::map<std::string, std::string>& overridden, std::vector<ModelEntry>* out) {
  const toml::array* arr = node.as_array();
  if (arr != nullptr && arr->empty()) {
    return InvalidArgument("{}: models = []: no models (K = 0); give at least one [[models]] entry, or leave models out "
                           "for a one-model run",
                           source);
  }
  if (arr == nullptr || !arr->is_array_of_tables()) {
    return InvalidArgument("{}: models = {}: expected [[models]] tables (name, config, [models.solver])", source,
                           NodeText(node));
  }
  out->clear();
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = arr->get(i)->as_table();
    TableReader r(t, fmt::format("models[{}]", i), source, overridden);
    ModelEntry e;
    e.config = base.model.config;
    e.solver = base.solver;
    DP_RETURN_IF_ERROR(r.String("name", &e.name));
    if (!r.Get("name")) return InvalidArgument("{}: models[{}].name is missing: every model needs a name", source, i);
    DP_RETURN_IF_ERROR(r.String("config", &e.config));
    if (const toml::node* s = r.Get("solver")) {
      if (!s->is_table()) return r.Bad("solver", *s, "expected a table of [solver] keys");
      TableReader sr(s->as_table(), fmt::format("models[{}].solver", i), source, overridden);
      DP_RETURN_IF_ERROR(ReadSolver(sr, &e.solver));
    }
    DP_RETURN_IF_ERROR(r.Finish());
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

// [sweep]: "table.key = [values]" for the kSweepKeys; expands to the cross product (first key
// slowest), one model per point, named "key=value+key=value".
Status ReadSweep(const toml::table& sweep, const RunConfig& base, const std::string& source,
                 std::vector<ModelEntry>* out) {
  struct Axis {
    std::string key;  // "solver.base_lr"
    const toml::array* values;
  };
  std::vector<Axis> axes;
  for (const auto& [table, sub] : sweep) {
    const std::string prefix(table.str());
    if (!sub.is_table()) {
      return InvalidArgument("{}: sweep.{} = {}: not a sweepable key (sweepable: {})", source, prefix, NodeText(sub),
                             fmt::join(kSweepKeys, ", "));
    }
    for (const auto& [k, v] : *sub.as_table()) {
      const std::string key = prefix + "." + std::string(k.str());
      if (std::find(std::begin(kSweepKeys), std::end(kSweepKeys), key) == std::end(kSweepKeys)) {
        return InvalidArgument("{}: sweep.{} = {}: not a sweepable key (sweepable: {})", source, key, NodeText(v),
                               fmt::join(kSweepKeys, ", "));
      }
      const toml::array* arr = v.as_array();
      if (arr == nullptr) return InvalidArgument("{}: sweep.{} = {}: expected a list of values", source, key, NodeText(v));
      if (arr->empty()) {
        return InvalidArgument("{}: sweep.{} = []: an empty list gives no models (K = 0)", source, key);
      }
      const bool text = key == "model.config";
      for (const toml::node& e : *arr) {
        const bool ok = text ? e.is_string() : (e.is_integer() || (e.is_floating_point() && key != "solver.max_iter"));
        if (!ok) {
          return InvalidArgument("{}: sweep.{} = {}: expected a list of {}", source, key, NodeText(v),
                                 text ? "model TOML paths" : key == "solver.max_iter" ? "integers" : "numbers");
        }
      }
      axes.push_back({key, arr});
    }
  }
  if (axes.empty()) return InvalidArgument("{}: [sweep] is empty: no models (K = 0)", source);
  size_t points = 1;
  for (const Axis& a : axes) {
    points *= a.values->size();
    if (points > 4096) return InvalidArgument("{}: [sweep] expands to more than 4096 models", source);
  }
  out->clear();
  for (size_t p = 0; p < points; ++p) {
    ModelEntry e;
    e.config = base.model.config;
    e.solver = base.solver;
    std::vector<std::string> parts;
    size_t rest = p;
    std::vector<size_t> index(axes.size());
    for (size_t a = axes.size(); a-- > 0;) {
      index[a] = rest % axes[a].values->size();
      rest /= axes[a].values->size();
    }
    for (size_t a = 0; a < axes.size(); ++a) {
      const toml::node& v = *axes[a].values->get(index[a]);
      const std::string& key = axes[a].key;
      const std::string field = key.substr(key.find('.') + 1);
      if (key == "model.config") {
        e.config = v.as_string()->get();
        parts.push_back("config=" + std::filesystem::path(e.config).stem().string());
        continue;
      }
      const double x = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
      if (field == "base_lr") e.solver.base_lr = static_cast<float>(x);
      if (field == "weight_decay") e.solver.weight_decay = static_cast<float>(x);
      if (field == "momentum") e.solver.momentum = static_cast<float>(x);
      if (field == "gamma") e.solver.gamma = static_cast<float>(x);
      if (field == "power") e.solver.power = static_cast<float>(x);
      if (field == "clip_gradients") e.solver.clip_gradients = static_cast<float>(x);
      if (field == "max_iter") e.solver.max_iter = v.as_integer()->get();
      parts.push_back(fmt::format("{}={}", field, NodeText(v)));
    }
    e.name = fmt::format("{}", fmt::join(parts, "+"));
    out->push_back(std::move(e));
  }
  return Status::Ok();
}


}  // namespace

const char* LrPolicyName(LrPolicy policy) {
  return kLrPolicyNames[static_cast<int>(policy)].data();
}

const char* UpdateRuleName(UpdateRuleKind kind) { return kUpdateRuleNames[static_cast<int>(kind)].data(); }

bool ParseUpdateRule(std::string_view text, UpdateRuleKind* out) {
  for (size_t i = 0; i < std::size(kUpdateRuleNames); ++i) {
    if (text == kUpdateRuleNames[i]) {
      *out = static_cast<UpdateRuleKind>(i);
      return true;
    }
  }
  return false;
}

const char* WireCodecName(WireCodec codec) { return kWireCodecNames[static_cast<size_t>(codec)].data(); }

bool ParseWireCodec(std::string_view text, WireCodec* out) {
  for (size_t i = 0; i < kWireCodecNames.size(); ++i) {
    if (text == kWireCodecNames[i]) {
      *out = static_cast<WireCodec>(i);
      return true;
    }
  }
  return false;
}

bool ParseLrPolicy(std::string_view text, LrPolicy* out) {
  for (size_t i = 0; i < std::size(kLrPolicyNames); ++i) {
    if (text == kLrPolicyNames[i]) {
      *out = static_cast<LrPolicy>(i);
      return true;
    }
  }
  return false;
}

std::string ConsistencyModeString(const ConsistencyConfig& c) {
  switch (c.mode) {
    case ConsistencyMode::kAsync: return "async";
    case ConsistencyMode::kSync: return "sync";
    case ConsistencyMode::kSsp: return fmt::format("ssp:{}", c.staleness_bound);
  }
  return "?";
}

std::string AlgorithmString(Algorithm a) {
  switch (a) {
    case Algorithm::kDcAsgd: return "dc-asgd";
    case Algorithm::kDcAsgdAdaptive: return "dc-asgd-a";
    case Algorithm::kEasgd: return "easgd";
    case Algorithm::kSgd: break;
  }
  return "sgd";
}

bool ParseAlgorithm(std::string_view text, Algorithm* out) {
  for (Algorithm a : {Algorithm::kSgd, Algorithm::kDcAsgd, Algorithm::kDcAsgdAdaptive, Algorithm::kEasgd}) {
    if (text == AlgorithmString(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

SolverConfig RunSolver(const RunConfig& config, bool local) {
  SolverConfig s = config.solver;
  if (s.max_iter == 0) s.max_iter = std::max<int64_t>(1, config.worker.steps * (local ? 1 : std::max(1, config.cluster.workers)));
  return s;
}

SolverConfig ModelSolver(const RunConfig& config, int model) {
  SolverConfig s = config.models.at(static_cast<size_t>(model)).solver;
  if (s.max_iter == 0) {
    s.max_iter = std::max<int64_t>(1, int64_t{config.rotation.passes} * std::max(1, config.cluster.workers) *
                                          config.rotation.stage_steps);
  }
  return s;
}

RunConfig ModelRunConfig(const RunConfig& config, int model) {
  RunConfig one = config;
  one.model.config = config.models.at(static_cast<size_t>(model)).config;
  one.models.clear();
  return one;
}

const char* RotationSchemeName(RotationScheme scheme) { return kRotationSchemeNames[static_cast<int>(scheme)].data(); }
const char* RotationGroupsName(RotationGroups groups) { return kRotationGroupsNames[static_cast<int>(groups)].data(); }

bool RunHasEvaluator(const RunConfig& config) {
  return config.eval.evaluator && !config.data.test.empty() && config.models.empty();
}

int64_t EvaluatorEveryUpdates(const RunConfig& config) {
  if (config.eval.every_updates > 0) return config.eval.every_updates;
  return config.eval.every_steps * std::max(1, config.cluster.workers);
}

float EasgdAlpha(const ConsistencyConfig& c, int workers) {
  return c.easgd_alpha > 0.0f ? c.easgd_alpha : 0.9f / static_cast<float>(std::max(1, workers));
}

std::string OwnShardPath(const DataConfig& data, int worker, int workers) {
  const std::filesystem::path dir(data.train);
  const std::filesystem::path converted = dir / fmt::format("shard_{}_of_{}", worker, workers);
  std::error_code ec;
  if (std::filesystem::is_directory(converted, ec)) return converted.string();
  return (dir / std::to_string(worker)).string();
}

const char* ClusterTransportName(ClusterTransport transport) {
  return kClusterTransportNames[static_cast<int>(transport)].data();
}

const char* ReplyOrderName(ReplyOrder order) { return kReplyOrderNames[static_cast<int>(order)].data(); }

std::string ServerIpcPath(const ClusterConfig& cluster, const std::string& run_dir, int server) {
  std::filesystem::path dir(cluster.ipc_dir);
  if (cluster.ipc_dir.empty()) {
    dir = run_dir;
  } else if (dir.is_relative()) {
    dir = std::filesystem::path(run_dir) / dir;
  }
  return (dir / fmt::format("server-{}.sock", server)).lexically_normal().string();
}

std::string ServerAddress(const ClusterConfig& cluster, const std::string& run_dir, int server) {
  if (cluster.transport == ClusterTransport::kIpc) return IpcUrl(ServerIpcPath(cluster, run_dir, server));
  const std::string host = IsWildcardAddress(cluster.bind) ? "127.0.0.1" : cluster.bind;
  return TcpUrl(host, cluster.base_port + server);
}

Status CheckIpcPathLengths(const ClusterConfig& cluster, const std::string& run_dir) {
  if (cluster.transport != ClusterTransport::kIpc) return Status::Ok();
  // The last server has the longest name.
  const std::string path = ServerIpcPath(cluster, run_dir, cluster.servers - 1);
  if (path.size() <= kIpcPathMax) return Status::Ok();
  return InvalidArgument(
      "cluster.ipc_dir = \"{}\"{}: the socket path {} is {} bytes, longer than the {} a Unix socket path can hold; "
      "set cluster.ipc_dir to a shorter directory, e.g. \"/tmp/{}\"",
      cluster.ipc_dir, cluster.ipc_dir.empty() ? " (the run directory)" : "", path, path.size(), kIpcPathMax,
      std::filesystem::path(run_dir).filename().string());
}

std::vector<std::string> RunConfigWarnings(const RunConfig& c) {
  std::vector<std::string> out;
  const int64_t frame = c.cluster.chunk_elems * int64_t{4};
  if (frame >= kLargeFrameBytes) {
    out.push_back(fmt::format(
        "warning: cluster.chunk_elems = {} makes payload frames of {:.1f} MiB: frames of 32 MiB or more fall past "
        "glibc's mmap threshold and page-fault on every receive (measured 10x slower than 4 MiB frames); keep it "
        "near 1048576 (4 MiB)",
        c.cluster.chunk_elems, static_cast<double>(frame) / (1 << 20)));
  }
  return out;
}

std::string DeviceString(const WorkerConfig& w) {
  return w.device == DeviceKind::kCpu ? std::string("cpu") : fmt::format("gpu:{}", w.gpu_index);
}

namespace {

// The checks of one solver: the run's [solver] (table "solver") or a model's
// ("models[i].solver").
void CheckSolver(Validator& v, const SolverConfig& so, const RunConfig& c, const std::string& table) {
  const std::string T = table;
  v.Check(so.base_lr > 0 && std::isfinite(so.base_lr), T + ".base_lr", so.base_lr,
             "must be finite and > 0")
      .Check(so.gamma > 0 && std::isfinite(so.gamma), T + ".gamma", so.gamma,
             "must be finite and > 0")
      .Check(so.power >= 0 && std::isfinite(so.power), T + ".power", so.power,
             "must be finite and >= 0")
      .Check(so.stepsize > 0, T + ".stepsize", so.stepsize, "must be > 0")
      .Check(so.max_iter >= 0, T + ".max_iter", so.max_iter, "must be >= 0 (0 = the run's planned worker batches)")
      .Check(so.max_iter > 0 || so.lr_policy != LrPolicy::kPoly || c.worker.epochs == 0, T + ".max_iter",
             so.max_iter, "0 (the run's length) needs a run counted in worker.steps, not worker.epochs")
      .Check(so.momentum >= 0 && so.momentum < 1, T + ".momentum", so.momentum,
             "must be in [0, 1)")
      .Check(so.weight_decay >= 0 && std::isfinite(so.weight_decay), T + ".weight_decay",
             so.weight_decay, "must be finite and >= 0")
      .Check(!std::isnan(so.clip_gradients), T + ".clip_gradients", so.clip_gradients,
             "must be a number (<= 0 turns clipping off)")
      .Check(so.adagrad_epsilon > 0 && std::isfinite(so.adagrad_epsilon), T + ".adagrad_epsilon",
             so.adagrad_epsilon, "must be finite and > 0 (AdaGrad divides by sqrt(acc + epsilon))")
      .Check(so.adagrad_initial >= 0 && std::isfinite(so.adagrad_initial), T + ".adagrad_initial",
             so.adagrad_initial, "must be finite and >= 0 (an accumulator of squares)")
      .Check(so.lr_policy != LrPolicy::kMultistep || !so.stepvalues.empty(), T + ".stepvalues",
             fmt::format("[{}]", fmt::join(so.stepvalues, ", ")).c_str(),
             "lr_policy \"multistep\" needs at least one step value");
  for (size_t i = 0; i < so.stepvalues.size(); ++i) {
    v.Check(so.stepvalues[i] > 0 && (i == 0 || so.stepvalues[i] > so.stepvalues[i - 1]),
            T + ".stepvalues", fmt::format("[{}]", fmt::join(so.stepvalues, ", ")).c_str(),
            "must be positive and strictly increasing");
  }
}

}  // namespace

Status ValidateRunConfig(const RunConfig& c, const std::string& src) { return ValidateRunConfig(c, src, {}); }

Status ValidateRunConfig(const RunConfig& c, const std::string& src,
                         const std::map<std::string, std::string>& overridden) {
  Validator v(src, overridden);
  const auto& cl = c.cluster;
  const auto& so = c.solver;
  const auto& co = c.consistency;
  const auto& wo = c.worker;
  const auto& da = c.data;
  const auto& ev = c.eval;
  const auto& ck = c.checkpoint;
  v.Check(!c.run.name.empty() && c.run.name.find('/') == std::string::npos, "run.name", c.run.name,
          "must be non-empty and contain no '/'")
      .Check(!c.run.out_dir.empty(), "run.out_dir", c.run.out_dir, "must be non-empty")
      .Check(c.run.seed >= 0, "run.seed", c.run.seed, "must be >= 0")
      .Check(!c.model.config.empty(), "model.config", c.model.config, "must name a model TOML")
      .Check(cl.servers >= 1, "cluster.servers", cl.servers, "must be >= 1")
      .Check(cl.workers >= 1, "cluster.workers", cl.workers, "must be >= 1")
      .Check(IsHostPort(cl.coordinator), "cluster.coordinator", cl.coordinator,
             "expected host:port with port in 1..65535")
      .Check(cl.base_port >= 1 && cl.base_port + cl.servers - 1 <= 65535, "cluster.base_port",
             cl.base_port, fmt::format("servers use base_port..base_port+{}, must lie in 1..65535",
                                       cl.servers - 1))
      .Check(!cl.bind.empty(), "cluster.bind", cl.bind, "must name an interface address")
      .Check(cl.heartbeat_ms > 0, "cluster.heartbeat_ms", cl.heartbeat_ms, "must be > 0")
      .Check(cl.heartbeat_timeout_ms > cl.heartbeat_ms, "cluster.heartbeat_timeout_ms",
             cl.heartbeat_timeout_ms,
             fmt::format("must be > cluster.heartbeat_ms ({})", cl.heartbeat_ms))
      .Check(cl.chunk_elems >= 1, "cluster.chunk_elems", cl.chunk_elems, "must be >= 1")
      .Check(cl.server_restarts >= 0, "cluster.server_restarts", cl.server_restarts, "must be >= 0")
      .Check(cl.coordinator_restarts >= 0, "cluster.coordinator_restarts", cl.coordinator_restarts, "must be >= 0")
      .Check(cl.restart_workers >= 0, "cluster.restart_workers", cl.restart_workers, "must be >= 0")
      .Check(cl.server_wait_ms > cl.heartbeat_timeout_ms, "cluster.server_wait_ms", cl.server_wait_ms,
             fmt::format("must be > cluster.heartbeat_timeout_ms ({})", cl.heartbeat_timeout_ms))
      .Check(cl.max_workers == 0 || cl.max_workers >= cl.workers, "cluster.max_workers", cl.max_workers,
             fmt::format("must be 0 (= workers) or >= cluster.workers ({})", cl.workers))
      .Check(cl.max_workers <= 65536, "cluster.max_workers", cl.max_workers, "must be <= 65536")
      .Check(cl.peer_queue_mb >= 1, "cluster.peer_queue_mb", cl.peer_queue_mb, "must be >= 1")
      .Check(cl.server_threads >= 1 && cl.server_threads <= kMaxServerThreads, "cluster.server_threads",
             cl.server_threads, fmt::format("must be in 1..{}", kMaxServerThreads))
      .Check(cl.io_threads >= 1 && cl.io_threads <= kMaxIoThreads, "cluster.io_threads", cl.io_threads,
             fmt::format("must be in 1..{}", kMaxIoThreads))
      .Check(cl.connections_per_server >= 1 && cl.connections_per_server <= kMaxConnectionsPerServer,
             "cluster.connections_per_server", cl.connections_per_server,
             fmt::format("must be in 1..{}", kMaxConnectionsPerServer))
      .Check(cl.trace_events >= 0 && cl.trace_events <= kMaxTraceEvents, "cluster.trace_events", cl.trace_events,
             fmt::format("must be in 0..{} (0 = off)", kMaxTraceEvents))
      .Check(cl.transport != ClusterTransport::kIpc || IsLoopbackLiteral(cl.bind) || cl.bind == "localhost",
             "cluster.transport", std::string(ClusterTransportName(cl.transport)),
             fmt::format("ipc reaches processes on this host only, but cluster.bind = \"{}\" is for a job across "
                         "hosts: use transport = \"tcp\" or a loopback cluster.bind",
                         cl.bind));
  CheckSolver(v, so, c, "solver");
  v.Check(co.staleness_bound >= 0, "consistency.mode", ConsistencyModeString(co), "staleness bound must be >= 0")
      .Check(co.backup_workers >= 0, "consistency.backup_workers", co.backup_workers, "must be >= 0")
      .Check(co.backup_workers == 0 || co.mode == ConsistencyMode::kSync, "consistency.backup_workers",
             co.backup_workers,
             fmt::format("only mode \"sync\" has backup workers (mode is \"{}\")", ConsistencyModeString(co)))
      .Check(co.backup_workers < cl.workers, "consistency.backup_workers", co.backup_workers,
             fmt::format("must be < cluster.workers ({})", cl.workers))
      .Check(!co.staleness_aware_lr || co.mode != ConsistencyMode::kSync, "consistency.staleness_aware_lr",
             co.staleness_aware_lr, "applies to async and ssp only (sync has no staleness)")
      .Check(std::isfinite(co.dc_lambda) && co.dc_lambda >= 0.0f, "consistency.dc_lambda", co.dc_lambda,
             "must be >= 0 and finite (0 = no compensation)")
      .Check(std::isfinite(co.dc_lambda0) && co.dc_lambda0 >= 0.0f, "consistency.dc_lambda0", co.dc_lambda0,
             "must be >= 0 and finite (0 = no compensation)")
      .Check(co.dc_mean_square_decay >= 0.0f && co.dc_mean_square_decay < 1.0f, "consistency.dc_mean_square_decay",
             co.dc_mean_square_decay, "must be in [0, 1)")
      .Check(co.easgd_tau >= 1, "consistency.easgd_tau", co.easgd_tau, "must be >= 1 (steps between exchanges)")
      .Check(std::isfinite(co.easgd_alpha) && co.easgd_alpha >= 0.0f && co.easgd_alpha < 1.0f,
             "consistency.easgd_alpha", co.easgd_alpha, "must be in [0, 1) (0 = 0.9 / cluster.workers)")
      .Check(co.algorithm != Algorithm::kEasgd || co.mode == ConsistencyMode::kAsync, "consistency.algorithm",
             AlgorithmString(co.algorithm), "\"easgd\" exchanges asynchronously: it needs mode \"async\"")
      .Check(co.algorithm != Algorithm::kEasgd || !co.staleness_aware_lr, "consistency.staleness_aware_lr",
             co.staleness_aware_lr, "does not apply to \"easgd\" (workers step with their own lr)")
      .Check(!DelayCompensated(co.algorithm) || co.mode != ConsistencyMode::kSync, "consistency.algorithm",
             AlgorithmString(co.algorithm),
             fmt::format("\"{}\" compensates delays; mode \"sync\" has none (use async or ssp:<s>)",
                         AlgorithmString(co.algorithm)))
      .Check(wo.batch_size >= 1, "worker.batch_size", wo.batch_size, "must be >= 1")
      .Check(wo.steps >= 1, "worker.steps", wo.steps, "must be >= 1")
      .Check(wo.epochs >= 0, "worker.epochs", wo.epochs, "must be >= 0 (0 = use steps)")
      .Check(wo.pull_every >= 1, "worker.pull_every", wo.pull_every, "must be >= 1")
      .Check(wo.push_every >= 1, "worker.push_every", wo.push_every, "must be >= 1")
      .Check(wo.outstanding_steps >= 1 && wo.outstanding_steps <= 16, "worker.outstanding_steps",
             wo.outstanding_steps, "must be in 1..16 (steps of pushes a step may start with unacknowledged)")
      .Check(wo.outstanding_steps == 1 || !DelayCompensated(co.algorithm) || co.mode != ConsistencyMode::kAsync,
             "worker.outstanding_steps", wo.outstanding_steps,
             fmt::format("must be 1 with consistency.algorithm = \"{}\": its servers compensate from the weights "
                         "they last sent a worker, and a step that may lack its own last pushes computes on older ones",
                         AlgorithmString(co.algorithm)))
      .Check(wo.gpu_index >= 0, "worker.device", DeviceString(wo), "GPU index must be >= 0")
      .Check(wo.threads >= 0, "worker.threads", wo.threads, "must be >= 0 (0 = all cores)")
      .Check(wo.straggler >= -1 && wo.straggler < cl.workers, "worker.straggler", wo.straggler,
             fmt::format("must be a worker id (0..{}) or -1 (none)", cl.workers - 1))
      .Check(wo.straggler_delay_ms >= 0 && wo.straggler_delay_ms <= 60000, "worker.straggler_delay_ms",
             wo.straggler_delay_ms, "must be in 0..60000")
      .Check(std::all_of(wo.emulate_ms.begin(), wo.emulate_ms.end(),
                         [](float m) { return std::isfinite(m) && m >= 0 && m <= 60000; }),
             "worker.emulate_ms", fmt::format("[{}]", fmt::join(wo.emulate_ms, ", ")).c_str(),
             "every value must be in 0..60000 ms")
      .Check(wo.emulate_ms.size() % 2 == 0, "worker.emulate_ms", fmt::format("{} values", wo.emulate_ms.size()).c_str(),
             "expected a forward and a backward ms per layer (an even count)")
      .Check(std::find(kConvAlgoNames.begin(), kConvAlgoNames.end(), wo.conv_algo) != kConvAlgoNames.end(),
             "worker.conv_algo", wo.conv_algo, "expected search, heuristic, gemm, implicit_gemm, fft or winograd")
      .Check(da.crop >= 0, "data.crop", da.crop, "must be >= 0 (0 = no crop)")
      .Check(da.pad >= 0 && da.pad <= 64, "data.pad", da.pad, "must be in 0..64 (0 = no padding)")
      .Check(da.pad == 0 || !(da.train.ends_with("idx3-ubyte") || da.train.ends_with("idx3-ubyte.gz")), "data.pad",
             da.pad, "needs an LMDB data.train (IDX files are read without augmentation; downpour-data convert-idx)")
      .Check(da.scale > 0 && std::isfinite(da.scale), "data.scale", da.scale, "must be finite and > 0")
      .Check(da.prefetch >= 1, "data.prefetch", da.prefetch, "must be >= 1")
      .Check(da.mean_file.empty() || da.mean_values.empty(), "data.mean_values",
             fmt::format("[{}]", fmt::join(da.mean_values, ", ")).c_str(),
             fmt::format("give either data.mean_file ({}) or data.mean_values, not both", Quote(da.mean_file)))
      .Check(std::all_of(da.mean_values.begin(), da.mean_values.end(), [](float m) { return std::isfinite(m); }),
             "data.mean_values", fmt::format("[{}]", fmt::join(da.mean_values, ", ")).c_str(), "must be finite")
      .Check(ev.every_steps >= 0, "eval.every_steps", ev.every_steps, "must be >= 0 (0 = off)")
      .Check(ev.every_updates >= 0, "eval.every_updates", ev.every_updates,
             "must be >= 0 (0 = every_steps x cluster.workers)")
      .Check(ev.every_seconds >= 0 && std::isfinite(ev.every_seconds), "eval.every_seconds", ev.every_seconds,
             "must be finite and >= 0 (0 = off)")
      .Check(ev.test_batches >= 0, "eval.test_batches", ev.test_batches, "must be >= 0 (0 = whole test set)")
      .Check(ck.every_updates >= 0, "checkpoint.every_updates", ck.every_updates, "must be >= 0 (0 = off)")
      .Check(!ck.dir.empty(), "checkpoint.dir", ck.dir, "must be non-empty")
      .Check(ck.wal_fsync_ms >= 0, "checkpoint.wal_fsync_ms", ck.wal_fsync_ms,
             "must be >= 0 (0 = fsync before every acknowledgement)")
      .Check(ck.wal_max_mb >= 1 && ck.wal_max_mb <= (int64_t{1} << 30), "checkpoint.wal_max_mb", ck.wal_max_mb,
             "must be between 1 and 2^30 MiB")
      .Check(cl.link_gbps == 0 || (std::isfinite(cl.link_gbps) && cl.link_gbps > 0), "cluster.link_gbps", cl.link_gbps,
             "must be a finite link speed > 0 in Gbit/s (0 in code = off)")
      .Check(cl.reply_order == ReplyOrder::kArrival || cl.link_gbps > 0, "cluster.reply_order",
             std::string(ReplyOrderName(cl.reply_order)),
             "\"step\" orders replies on an emulated link: it needs cluster.link_gbps (on a real network the NIC "
             "decides; not implemented)")
      .Check(c.compression.top_k_fraction > 0 && c.compression.top_k_fraction <= 1, "compression.top_k_fraction",
             c.compression.top_k_fraction, "must be in (0, 1]")
      .Check(c.compression.top_k_warmup_pushes >= 0, "compression.top_k_warmup_pushes",
             c.compression.top_k_warmup_pushes, "must be >= 0 (0 = no warm-up)")
      .Check(c.compression.factor_threads >= 1 && c.compression.factor_threads <= kMaxFactorThreads,
             "compression.factor_threads", c.compression.factor_threads, "must be in 1..64")
      .Check(co.algorithm != Algorithm::kEasgd || !c.compression.factors, "compression.factors", c.compression.factors,
             "\"easgd\" workers push no gradients (their exchanges are dense weight differences): turn it off")
      .Check(co.algorithm != Algorithm::kEasgd || c.compression.push == WireCodec::kFp32, "compression.push",
             WireCodecName(c.compression.push), "\"easgd\" exchanges must be exact: use \"fp32\"");
  // Several models (docs/multi_model.md).
  const auto& ro = c.rotation;
  v.Check(ro.passes >= 1, "rotation.passes", ro.passes, "must be >= 1")
      .Check(ro.stage_steps >= 0, "rotation.stage_steps", ro.stage_steps, "must be >= 0 (0 = one pass over the partition)");
  if (!c.models.empty()) {
    v.Check(ro.scheme != RotationScheme::kPipeline || da.sharding == DataSharding::kOwn, "data.sharding",
            std::string(kDataShardingNames[static_cast<int>(da.sharding)]),
            "rotation.scheme = \"pipeline\" moves models, not data: every worker reads its own partition "
            "(data.sharding = \"own\", downpour-data convert-* --shards W)")
        .Check(wo.push_every == 1, "worker.push_every", wo.push_every,
               "must be 1 with [[models]] (a stage's local SGD updates after every batch)")
        .Check(co.mode == ConsistencyMode::kAsync || ro.stage_steps > 0, "consistency.mode", ConsistencyModeString(co),
               "sync and ssp with [[models]] need rotation.stage_steps > 0: every worker must take the same steps "
               "on a model (partitions may differ by a record)")
        .Check(co.algorithm != Algorithm::kEasgd, "consistency.algorithm", AlgorithmString(co.algorithm),
               "\"easgd\" keeps worker-local weights, which a model moving between workers would lose: not with "
               "[[models]]");
    // A pipeline with K < W: each stage's holders of a model train it together through the
    // servers (rotation.h); the servers find a stage's holders from the model's version.
    const int K = static_cast<int>(c.models.size());
    if (ro.scheme == RotationScheme::kPipeline && K < cl.workers && ro.groups == RotationGroups::kDataParallel) {
      v.Check(ro.stage_steps > 0, "rotation.stage_steps", ro.stage_steps,
              fmt::format("a pipeline of {} models on {} workers trains each stage's holders of a model together "
                          "(rotation.groups = \"data_parallel\"): they must take the same steps; set stage_steps > 0 "
                          "(or groups = \"average\")",
                          K, cl.workers))
          .Check(co.mode != ConsistencyMode::kSsp, "consistency.mode", ConsistencyModeString(co),
                 "ssp bounds the clocks of all of a model's workers, but a pipeline's holders of a model change "
                 "every stage: use \"async\" or \"sync\" (or rotation.groups = \"average\")")
          .Check(co.backup_workers < cl.workers / K, "consistency.backup_workers", co.backup_workers,
                 fmt::format("must be < the smallest group of holders of a model in a stage ({} = {} workers / {} "
                             "models)",
                             cl.workers / K, cl.workers, K));
    }
  }
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < c.models.size(); ++i) {
    const ModelEntry& m = c.models[i];
    const std::string at = fmt::format("models[{}]", i);
    const bool charset = std::all_of(m.name.begin(), m.name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '=' || ch == '+' ||
             ch == '-';
    });
    v.Check(!m.name.empty() && m.name.size() <= 128 && charset, at + ".name", m.name,
            "must be 1..128 letters, digits or _ . = + - (it names the model's files)")
        .Check(!m.config.empty(), at + ".config", m.config, "must name a model TOML");
    const auto [it, fresh] = names.emplace(m.name, i);
    v.Check(fresh, at + ".name", m.name, fmt::format("the same name as models[{}]: model names must differ", it->second));
    CheckSolver(v, m.solver, c, at + ".solver");
    v.Check(m.solver.max_iter > 0 || m.solver.lr_policy != LrPolicy::kPoly || ro.stage_steps > 0,
            at + ".solver.max_iter", m.solver.max_iter,
            "0 (the run's length) needs rotation.stage_steps > 0 (a model's planned batches); give max_iter");
  }
  return v.status();
}

Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, RunConfig* out) {
  return ParseRunConfig(toml_text, source_name, {}, out);
}

Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, const std::vector<std::string>& sets,
                      RunConfig* out) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return InvalidArgument("{}:{}:{}: TOML syntax error: {}", source_name, where.line,
                           where.column, e.description());
  }
  std::map<std::string, std::string> overridden;  // "table.key" → the --set text
  for (const std::string& set : sets) DP_RETURN_IF_ERROR(ApplyOverride(set, &root, &overridden));
  RunConfig c;
  struct Section {
    const char* name;
    std::function<Status(TableReader&)> read;
  };
  const Section sections[] = {
      {"run", [&](TableReader& r) { return ReadRun(r, &c.run); }},
      {"model", [&](TableReader& r) { return ReadModel(r, &c.model); }},
      {"cluster", [&](TableReader& r) { return ReadCluster(r, &c.cluster); }},
      {"solver", [&](TableReader& r) { return ReadSolver(r, &c.solver); }},
      {"consistency", [&](TableReader& r) { return ReadConsistency(r, &c.consistency); }},
      {"worker", [&](TableReader& r) { return ReadWorker(r, &c.worker); }},
      {"data", [&](TableReader& r) { return ReadData(r, &c.data); }},
      {"eval", [&](TableReader& r) { return ReadEval(r, &c.eval); }},
      {"checkpoint", [&](TableReader& r) { return ReadCheckpoint(r, &c.checkpoint); }},
      {"security", [&](TableReader& r) { return ReadSecurity(r, &c.security); }},
      {"compression", [&](TableReader& r) { return ReadCompression(r, &c.compression); }},
      {"rotation", [&](TableReader& r) { return ReadRotation(r, &c.rotation); }},
  };
  for (const auto& [key, node] : root) {
    if (key.str() == "models") continue;  // [[models]]: an array of tables, read below
    bool known = key.str() == "sweep";
    for (const Section& s : sections) known = known || key.str() == s.name;
    if (!known) {
      std::string source = source_name;
      for (const auto& [k, text] : overridden) {
        if (k.starts_with(std::string(key.str()) + ".")) source = "--set " + text;
      }
      return InvalidArgument(
          "{}: unknown {} '{}' (known tables: run, model, cluster, solver, consistency, worker, "
          "data, eval, checkpoint, security, compression, rotation, sweep, [[models]])",
          source, node.is_table() ? "table" : "top-level key", key.str());
    }
    if (!node.is_table()) {
      return InvalidArgument("{}: '{}' = {} must be a table [{}]", source_name, key.str(),
                             NodeText(node), key.str());
    }
  }
  for (const Section& s : sections) {
    TableReader reader(root[s.name].as_table(), s.name, source_name, overridden);
    DP_RETURN_IF_ERROR(s.read(reader));
  }
  // Several models: [[models]] entries or a [sweep], over the [model] and [solver] just read.
  const toml::node* models = root.get("models");
  const toml::table* sweep = root["sweep"].as_table();
  if (models && sweep) {
    return InvalidArgument("{}: give [[models]] or [sweep], not both (a sweep expands to the models itself)", source_name);
  }
  if (models) DP_RETURN_IF_ERROR(ReadModels(*models, c, source_name, overridden, &c.models));
  if (sweep) DP_RETURN_IF_ERROR(ReadSweep(*sweep, c, source_name, &c.models));
  DP_RETURN_IF_ERROR(ValidateRunConfig(c, source_name, overridden));
  *out = std::move(c);
  return Status::Ok();
}

Status LoadRunConfig(const std::string& path, RunConfig* out) { return LoadRunConfig(path, {}, out); }

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& sets, RunConfig* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("{}: cannot open run config: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("{}: read failed", path);
  return ParseRunConfig(text.str(), path, sets, out);
}

std::string ToToml(const RunConfig& c) {
  std::string s;
  auto line = [&s](std::string_view key, const std::string& value) {
    s += fmt::format("{} = {}\n", key, value);
  };
  auto str = [](const std::string& v) { return Quote(v); };
  auto num = [](auto v) { return fmt::format("{}", v); };
  auto flt = [](auto v) { return FloatText(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };

  s += "# Run configuration as used (written by ToToml; every field explicit).\n[run]\n";
  line("name", str(c.run.name));
  line("out_dir", str(c.run.out_dir));
  line("seed", num(c.run.seed));
  s += "\n[model]\n";
  line("config", str(c.model.config));
  line("weights", str(c.model.weights));
  s += "\n[cluster]\n";
  line("servers", num(c.cluster.servers));
  line("workers", num(c.cluster.workers));
  line("coordinator", str(c.cluster.coordinator));
  line("base_port", num(c.cluster.base_port));
  line("bind", str(c.cluster.bind));
  line("advertise", str(c.cluster.advertise));
  line("heartbeat_ms", num(c.cluster.heartbeat_ms));
  line("heartbeat_timeout_ms", num(c.cluster.heartbeat_timeout_ms));
  line("chunk_elems", num(c.cluster.chunk_elems));
  line("server_restarts", num(c.cluster.server_restarts));
  line("coordinator_restarts", num(c.cluster.coordinator_restarts));
  line("restart_workers", num(c.cluster.restart_workers));
  line("server_wait_ms", num(c.cluster.server_wait_ms));
  line("max_workers", num(c.cluster.max_workers));
  line("peer_queue_mb", num(c.cluster.peer_queue_mb));
  line("server_threads", num(c.cluster.server_threads));
  line("io_threads", num(c.cluster.io_threads));
  line("connections_per_server", num(c.cluster.connections_per_server));
  line("trace_events", num(c.cluster.trace_events));
  line("transport", str(ClusterTransportName(c.cluster.transport)));
  line("ipc_dir", str(c.cluster.ipc_dir));
  line("shared_memory", boolean(c.cluster.shared_memory));
  line("reply_order", str(ReplyOrderName(c.cluster.reply_order)));
  if (c.cluster.link_gbps > 0) {
    line("link_gbps", flt(c.cluster.link_gbps));
  } else {
    s += "# link_gbps: off (no emulated link)\n";
  }
  auto solver = [&](const SolverConfig& so) {
    line("base_lr", flt(so.base_lr));
    line("lr_policy", str(LrPolicyName(so.lr_policy)));
    line("gamma", flt(so.gamma));
    line("power", flt(so.power));
    line("stepsize", num(so.stepsize));
    line("stepvalues", fmt::format("[{}]", fmt::join(so.stepvalues, ", ")));
    line("max_iter", num(so.max_iter));
    line("momentum", flt(so.momentum));
    line("weight_decay", flt(so.weight_decay));
    line("clip_gradients", flt(so.clip_gradients));
    line("update", str(UpdateRuleName(so.update)));
    line("adagrad_epsilon", flt(so.adagrad_epsilon));
    line("adagrad_initial", flt(so.adagrad_initial));
  };
  s += "\n[solver]\n";
  solver(c.solver);
  s += "\n[consistency]\n";
  line("mode", str(ConsistencyModeString(c.consistency)));
  line("backup_workers", num(c.consistency.backup_workers));
  line("staleness_aware_lr", boolean(c.consistency.staleness_aware_lr));
  line("algorithm", str(AlgorithmString(c.consistency.algorithm)));
  line("dc_lambda", flt(c.consistency.dc_lambda));
  line("dc_lambda0", flt(c.consistency.dc_lambda0));
  line("dc_mean_square_decay", flt(c.consistency.dc_mean_square_decay));
  line("easgd_tau", num(c.consistency.easgd_tau));
  line("easgd_alpha", flt(c.consistency.easgd_alpha));
  s += "\n[worker]\n";
  line("batch_size", num(c.worker.batch_size));
  line("steps", num(c.worker.steps));
  line("epochs", num(c.worker.epochs));
  line("pull_every", num(c.worker.pull_every));
  line("push_every", num(c.worker.push_every));
  line("outstanding_steps", num(c.worker.outstanding_steps));
  line("device", str(DeviceString(c.worker)));
  line("threads", num(c.worker.threads));
  line("straggler", num(c.worker.straggler));
  line("straggler_delay_ms", num(c.worker.straggler_delay_ms));
  {
    std::vector<std::string> ms;
    for (float m : c.worker.emulate_ms) ms.push_back(flt(m));
    line("emulate_ms", fmt::format("[{}]", fmt::join(ms, ", ")));
  }
  line("tf32", boolean(c.worker.tf32));
  line("conv_algo", str(c.worker.conv_algo));
  s += "\n[data]\n";
  line("train", str(c.data.train));
  line("test", str(c.data.test));
  line("sharding", str(kDataShardingNames[static_cast<int>(c.data.sharding)].data()));
  line("crop", num(c.data.crop));
  line("pad", num(c.data.pad));
  line("mirror", boolean(c.data.mirror));
  line("mean_file", str(c.data.mean_file));
  {
    std::vector<std::string> means;
    for (float m : c.data.mean_values) means.push_back(flt(m));
    line("mean_values", fmt::format("[{}]", fmt::join(means, ", ")));
  }
  line("scale", flt(c.data.scale));
  line("prefetch", num(c.data.prefetch));
  s += "\n[eval]\n";
  line("evaluator", boolean(c.eval.evaluator));
  line("every_steps", num(c.eval.every_steps));
  line("every_updates", num(c.eval.every_updates));
  line("every_seconds", flt(c.eval.every_seconds));
  line("test_batches", num(c.eval.test_batches));
  line("at_start", boolean(c.eval.at_start));
  s += "\n[checkpoint]\n";
  line("every_updates", num(c.checkpoint.every_updates));
  line("dir", str(c.checkpoint.dir));
  line("wal", boolean(c.checkpoint.wal));
  line("wal_fsync_ms", num(c.checkpoint.wal_fsync_ms));
  line("wal_max_mb", num(c.checkpoint.wal_max_mb));
  s += "\n[security]\n";
  line("keys", str(c.security.keys));
  line("insecure", boolean(c.security.insecure));
  s += "\n[compression]\n";
  line("factors", boolean(c.compression.factors));
  line("push", str(WireCodecName(c.compression.push)));
  line("pull", str(WireCodecName(c.compression.pull)));
  line("top_k_fraction", flt(c.compression.top_k_fraction));
  line("top_k_warmup_pushes", num(c.compression.top_k_warmup_pushes));
  line("error_feedback", boolean(c.compression.error_feedback));
  line("factor_threads", num(c.compression.factor_threads));
  s += "\n[rotation]\n";
  line("scheme", str(RotationSchemeName(c.rotation.scheme)));
  line("passes", num(c.rotation.passes));
  line("stage_steps", num(c.rotation.stage_steps));
  line("groups", str(RotationGroupsName(c.rotation.groups)));
  for (const ModelEntry& m : c.models) {  // a [sweep] is stored expanded
    s += "\n[[models]]\n";
    line("name", str(m.name));
    line("config", str(m.config));
    s += "[models.solver]\n";
    solver(m.solver);
  }
  return s;
}

}  // namespace downpour
