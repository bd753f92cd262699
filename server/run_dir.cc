// run_dir.cc — see run_dir.h.
#include "server/run_dir.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "common/metrics.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// An LMDB directory (holding data.mdb) or an IDX images file with its labels file beside it.
Status CheckDataset(const std::string& path, const std::string& key, const std::string& source) {
  std::error_code ec;
  const auto quoted = fmt::format("{} = \"{}\"", key, path);
  if (EndsWith(path, "idx3-ubyte") || EndsWith(path, "idx3-ubyte.gz")) {
    if (!fs::is_regular_file(path, ec)) return NotFound("{}: {}: no such IDX images file", source, quoted);
    const auto pos = path.rfind("images-idx3");
    std::string labels = path;
    if (pos != std::string::npos) labels.replace(pos, std::string("images-idx3").size(), "labels-idx1");
    if (pos == std::string::npos || !fs::is_regular_file(labels, ec)) {
      return NotFound("{}: {}: the labels file beside it ({}) is missing", source, quoted,
                      pos == std::string::npos ? "a name with images-idx3 → labels-idx1" : labels);
    }
    return Status::Ok();
  }
  if (!fs::exists(path, ec)) {
    // The ImageNet-shaped set AlexNet trains on here is made by the same script with --alexnet.
    const bool alexnet = path.find("fashion-256") != std::string::npos;
    return NotFound("{}: {}: no such LMDB directory (make one with {} or downpour-data convert-*)", source, quoted,
                    alexnet ? "scripts/get_fashion_mnist --alexnet" : "scripts/get_fashion_mnist");
  }
  if (!fs::is_directory(path, ec)) {
    return InvalidArgument("{}: {}: is a file; expected an LMDB directory (or an IDX images file)", source, quoted);
  }
  if (!fs::is_regular_file(fs::path(path) / "data.mdb", ec)) {
    return NotFound("{}: {}: the directory holds no data.mdb, so it is not an LMDB", source, quoted);
  }
  return Status::Ok();
}

Status CheckFile(const std::string& path, const std::string& key, const std::string& source, std::string_view what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return NotFound("{}: {} = \"{}\": no such {}", source, key, path, what);
  }
  return Status::Ok();
}

}  // namespace

Status CheckRunDirIsNew(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return Status::Ok();
  if (!fs::is_directory(run_dir, ec)) return FailedPrecondition("run directory {} exists and is a file", run_dir);
  if (fs::exists(fs::path(run_dir) / "config.toml", ec)) {
    return FailedPrecondition(
        "run directory {} already holds a run (config.toml); continue it with --resume {}, or choose another "
        "--run-dir (or remove it to start it again)",
        run_dir, run_dir);
  }
  if (!fs::is_empty(run_dir, ec)) {
    return FailedPrecondition("run directory {} exists and is not empty; choose another --run-dir", run_dir);
  }
  return Status::Ok();
}

Status CheckTaskFilesAreNew(const std::string& run_dir, const std::string& stem) {
  std::error_code ec;
  if (fs::exists(run_dir, ec) && !fs::is_directory(run_dir, ec)) {
    return FailedPrecondition("run directory {} exists and is a file", run_dir);
  }
  for (const fs::path& mine : {fs::path("logs") / (stem + ".log"), fs::path("metrics") / (stem + ".jsonl"),
                               fs::path("launch-" + stem + ".jsonl")}) {
    if (fs::exists(fs::path(run_dir) / mine, ec)) {
      return FailedPrecondition(
          "run directory {} already holds {} of an earlier run of this task ({}); choose another --run-dir", run_dir,
          stem, (fs::path(run_dir) / mine).string());
    }
  }
  return Status::Ok();
}

namespace {
// model.config, and every [[models]] entry's config.
Status CheckModelConfigs(const RunConfig& c, const ConfigSource& source) {
  DP_RETURN_IF_ERROR(CheckFile(c.model.config, "model.config", source.Of("model.config"), "model config"));
  for (size_t k = 0; k < c.models.size(); ++k) {
    DP_RETURN_IF_ERROR(CheckFile(c.models[k].config, fmt::format("models[{}].config", k).c_str(), source.file,
                                 "model config"));
  }
  return Status::Ok();
}

// The weights a run starts from, the test set and the mean file: what every worker reads besides
// the model configs and its training data.
Status CheckOtherInputs(const RunConfig& c, const ConfigSource& source) {
  if (!c.model.weights.empty()) {
    DP_RETURN_IF_ERROR(CheckFile(c.model.weights, "model.weights", source.Of("model.weights"), "weights file"));
  }
  if (!c.data.test.empty()) DP_RETURN_IF_ERROR(CheckDataset(c.data.test, "data.test", source.Of("data.test")));
  if (!c.data.mean_file.empty()) {
    DP_RETURN_IF_ERROR(CheckFile(c.data.mean_file, "data.mean_file", source.Of("data.mean_file"), "mean file"));
  }
  return Status::Ok();
}
}  // namespace

std::string ConfigSource::Of(std::string_view key) const {
  for (const std::string& set : sets) {
    if (set.size() > key.size() && set.compare(0, key.size(), key) == 0 && set[key.size()] == '=') return "--set";
  }
  return file;
}

Status CheckTaskInputs(const RunConfig& c, const ConfigSource& source, bool worker, int worker_id) {
  if (!worker) return CheckModelConfigs(c, source);
  const bool reads_all = !c.models.empty() && c.rotation.scheme == RotationScheme::kIndependent;
  if (c.data.sharding != DataSharding::kOwn || reads_all) return CheckRunInputs(c, source);
  // Only this worker's own partition need be on this host.
  DP_RETURN_IF_ERROR(CheckModelConfigs(c, source));
  DP_RETURN_IF_ERROR(CheckDataset(OwnShardPath(c.data, worker_id, c.cluster.workers),
                                  fmt::format("data.train (sharding \"own\", worker {})", worker_id),
                                  source.Of("data.train")));
  return CheckOtherInputs(c, source);
}

Status CheckRunInputs(const RunConfig& c, const ConfigSource& source) {
  DP_RETURN_IF_ERROR(CheckModelConfigs(c, source));
  if (c.data.sharding == DataSharding::kOwn) {
    for (int j = 0; j < c.cluster.workers; ++j) {
      DP_RETURN_IF_ERROR(CheckDataset(OwnShardPath(c.data, j, c.cluster.workers),
                                      fmt::format("data.train (sharding \"own\", worker {})", j),
                                      source.Of("data.train")));
    }
  } else {
    DP_RETURN_IF_ERROR(CheckDataset(c.data.train, "data.train", source.Of("data.train")));
  }
  return CheckOtherInputs(c, source);
}

namespace {
std::string ShardFileName(int server, int model, const char* ext) {
  return model == 0 ? fmt::format("server-{}.{}", server, ext) : fmt::format("server-{}.model-{}.{}", server, model, ext);
}
}  // namespace

std::string ServerCheckpointPath(const std::string& run_dir, const CheckpointConfig& checkpoint, int server, int model) {
  const fs::path dir =
      fs::path(checkpoint.dir).is_absolute() ? fs::path(checkpoint.dir) : fs::path(run_dir) / checkpoint.dir;
  return (dir / ShardFileName(server, model, "dpt")).string();
}

std::string ServerWalPath(const std::string& run_dir, const CheckpointConfig& checkpoint, int server, int model) {
  return (fs::path(ServerCheckpointPath(run_dir, checkpoint, server)).parent_path() / ShardFileName(server, model, "wal"))
      .string();
}

bool RunSavedNothing(const std::string& run_dir, const RunConfig& c) {
  std::error_code ec;
  if (fs::exists(fs::path(run_dir) / "state", ec)) return false;  // a worker's progress
  const int models = std::max<int>(1, static_cast<int>(c.models.size()));
  for (int i = 0; i < c.cluster.servers; ++i) {
    for (int k = 0; k < models; ++k) {
      if (fs::exists(ServerCheckpointPath(run_dir, c.checkpoint, i, k), ec) ||
          fs::exists(ServerWalPath(run_dir, c.checkpoint, i, k), ec)) {
        return false;
      }
    }
  }
  return true;
}

namespace {
// Whether anything of a run's processes is in `run_dir`: a "start" record in launch.jsonl, a
// server's checkpoint or log, a worker's progress.
bool RunEverStarted(const std::string& run_dir, const RunConfig& c, const std::vector<MetricRecord>& launch) {
  for (const MetricRecord& r : launch) {
    if (r.Get("event").AsString() == "start") return true;
  }
  return !RunSavedNothing(run_dir, c);
}
}  // namespace

Status PlanResume(const std::string& run_dir, const RunConfig& c, ResumePlan* plan) {
  std::error_code ec;
  const std::string launch_log = (fs::path(run_dir) / "launch.jsonl").string();
  std::vector<MetricRecord> records;
  if (fs::exists(launch_log, ec)) {
    std::vector<int> torn;
    DP_RETURN_IF_ERROR(ReadMetrics(launch_log, &records, &torn));
    if (!torn.empty()) {  // a launch that stopped half-way through a line (a full disk): that line is lost
      spdlog::warn("{}: skipped {} torn line(s), the first at line {} (a write that stopped half-way)", launch_log,
                   torn.size(), torn.front());
    }
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      if (it->Get("event").AsString() != "end") continue;
      if (it->Get("code").AsInt() == 0) {
        return FailedPrecondition("run {} already finished (its last launch ended with exit code 0); nothing to resume",
                                  run_dir);
      }
      break;
    }
  }
  plan->never_started = !RunEverStarted(run_dir, c, records);
  if (plan->never_started) return Status::Ok();
  if (c.checkpoint.every_updates <= 0 && !c.checkpoint.wal) {
    return FailedPrecondition(
        "run {} cannot be resumed: checkpointing was off (checkpoint.every_updates = {}, checkpoint.wal = false), so "
        "its servers saved no weights",
        run_dir, c.checkpoint.every_updates);
  }
  plan->checkpoints.clear();
  plan->wals.clear();
  for (int i = 0; i < c.cluster.servers; ++i) {
    const std::string path = ServerCheckpointPath(run_dir, c.checkpoint, i);
    const std::string wal = ServerWalPath(run_dir, c.checkpoint, i);
    const bool has_checkpoint = fs::is_regular_file(path, ec);
    const bool has_wal = c.checkpoint.wal && fs::is_regular_file(wal, ec);
    if (!has_checkpoint && !has_wal) {
      return FailedPrecondition(
          "run {} cannot be resumed: server {} saved nothing to recover from ({} is missing{}; the run stopped before "
          "its first checkpoint — checkpoint.every_updates = {}); to start it again, remove the directory (rm -r {}) "
          "and launch with the same --run-dir, or launch with another",
          run_dir, i, path, c.checkpoint.wal ? fmt::format(", and so is its write-ahead log {}", wal) : "",
          c.checkpoint.every_updates, run_dir);
    }
    plan->checkpoints.push_back(has_checkpoint ? path : "");
    plan->wals.push_back(has_wal ? wal : "");
  }
  return Status::Ok();
}

}  // namespace downpour
