// worker_state.cc — see worker_state.h.
#include "client/worker/worker_state.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/file_io.h"

namespace downpour::worker {

std::string WorkerStatePath(const std::string& run_dir, int worker_id) {
  return (std::filesystem::path(run_dir) / "state" / fmt::format("worker-{}.toml", worker_id)).string();
}

Status WriteWorkerProgress(const std::string& path, const WorkerProgress& p) {
  const std::string text = fmt::format(
      "# downpour worker progress (client/worker/worker_state.h); read by downpour-worker --resume\n"
      "step = {}\nclock = {}\nimages = {}\nepoch = {}\nwall_s = {:.6f}\neval_s = {:.6f}\nfinished = {}\n",
      p.step, p.clock, p.images, p.epoch, p.wall_s, p.eval_s, p.finished ? "true" : "false");
  return WriteFileAtomic(path, text, Durability::kProcessCrash);
}

Status ReadWorkerProgress(const std::string& path, WorkerProgress* out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound("{}: no worker progress file", path);
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return Corrupt("{}: not a worker progress file: {}", path, e.description());
  }
  WorkerProgress p;
  auto integer = [&](const char* key, int64_t* v) -> Status {
    const auto x = t[key].value<int64_t>();
    if (!x || *x < 0) return Corrupt("{}: {} is missing or not an integer >= 0", path, key);
    *v = *x;
    return Status::Ok();
  };
  auto real = [&](const char* key, double* v) -> Status {
    const auto x = t[key].value<double>();
    if (!x || !(*x >= 0)) return Corrupt("{}: {} is missing or not a number >= 0", path, key);
    *v = *x;
    return Status::Ok();
  };
  int64_t epoch = 0;
  DP_RETURN_IF_ERROR(integer("step", &p.step));
  DP_RETURN_IF_ERROR(integer("clock", &p.clock));
  DP_RETURN_IF_ERROR(integer("images", &p.images));
  DP_RETURN_IF_ERROR(integer("epoch", &epoch));
  DP_RETURN_IF_ERROR(real("wall_s", &p.wall_s));
  DP_RETURN_IF_ERROR(real("eval_s", &p.eval_s));
  const auto finished = t["finished"].value<bool>();
  if (!finished) return Corrupt("{}: finished is missing or not true/false", path);
  p.epoch = static_cast<int>(epoch);
  p.finished = *finished;
  *out = p;
  return Status::Ok();
}

}  // namespace downpour::worker
