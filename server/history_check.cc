#include "server/history_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <unordered_map>

#include "common/ack_history.h"
#include "server/model_host.h"
#include "server/run_dir.h"
#include "server/shard.h"
#include "server/shard_log.h"
#include "server/wal.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;

// What names a push: the worker, its client's session, the request id (server/sessions.h).
struct PushKey {
  int32_t worker = 0;
  uint64_t session = 0;
  uint64_t request_id = 0;
  bool operator==(const PushKey&) const = default;
};
struct PushKeyHash {
  size_t operator()(const PushKey& k) const {
    uint64_t h = k.session * 0x9E3779B97F4A7C15ull ^ k.request_id;
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(k.worker)) << 17;
    return static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull);
  }
};
struct Logged {
  uint64_t first_seq = 0;
  uint32_t times = 0;
  bool acked = false;
};
using LoggedPushes = std::unordered_map<PushKey, Logged, PushKeyHash>;

constexpr size_t kExamples = 10;  // violations of one kind named one by one; then a count

// Adds `line` to `out` while fewer than kExamples of `kind` are there; counts the rest.
void Note(std::vector<std::string>* out, std::map<std::string, uint64_t>* counts, const std::string& kind,
          const std::string& line) {
  if ((*counts)[kind]++ < kExamples) out->push_back(line);
}

// A server's log files in the order of their records: the kept segments (named by
// KeptSegmentPath), then the live log.
std::vector<std::string> LogFiles(const std::string& wal) {
  std::vector<std::pair<uint64_t, std::string>> kept;
  const fs::path dir = fs::path(wal).parent_path();
  const std::string prefix = fs::path(wal).filename().string() + ".";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t seq = 0;
    if (!name.starts_with(prefix)) continue;
    const auto [end, bad] = std::from_chars(name.data() + prefix.size(), name.data() + name.size(), seq);
    if (bad != std::errc() || end != name.data() + name.size()) continue;
    if (fs::path(KeptSegmentPath(wal, seq)).filename() == name) kept.emplace_back(seq, e.path().string());
  }
  std::sort(kept.begin(), kept.end());
  std::vector<std::string> out;
  for (auto& [seq, path] : kept) out.push_back(std::move(path));
  if (fs::exists(wal, ec)) out.push_back(wal);
  return out;
}

// "" when `a` and `b` hold the same bits; else where and how they first differ.
std::string CompareFloats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return fmt::format("{} floats against {}", a.size(), b.size());
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) return "";
  size_t first = a.size(), n = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    first = std::min(first, i);
    ++n;
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return fmt::format("{} of {} floats differ, the first at {} ({} checkpointed, {} replayed), max |difference| {:.3g}",
                     n, a.size(), first, a[first], b[first], worst);
}

// The first difference between the checkpointed shard and the replayed one; "" when none.
std::string CompareShards(const ShardServer& live, const ShardServer& replay, const ParamLayout& layout, int server,
                          uint64_t* floats) {
  for (int32_t chunk : layout.ServerChunks(server)) {
    const std::vector<float> w = live.ChunkWeights(chunk);
    *floats += w.size();
    std::string d = CompareFloats(w, replay.ChunkWeights(chunk));
    if (!d.empty()) return fmt::format("chunk {} weights: {}", chunk, d);
    if (d = CompareFloats(live.ChunkHistory(chunk), replay.ChunkHistory(chunk)); !d.empty()) {
      return fmt::format("chunk {} update-rule state: {}", chunk, d);
    }
    if (d = CompareFloats(live.ChunkRuleState(chunk), replay.ChunkRuleState(chunk)); !d.empty()) {
      return fmt::format("chunk {} shard rule state ({}): {}", chunk, live.RuleStateName(), d);
    }
    if (live.ChunkVersion(chunk) != replay.ChunkVersion(chunk)) {
      return fmt::format("chunk {} version: {} checkpointed, {} replayed", chunk, live.ChunkVersion(chunk),
                         replay.ChunkVersion(chunk));
    }
    if (live.ChunkScheduleIter(chunk) != replay.ChunkScheduleIter(chunk)) {
      return fmt::format("chunk {} schedule iteration: {} checkpointed, {} replayed", chunk,
                         live.ChunkScheduleIter(chunk), replay.ChunkScheduleIter(chunk));
    }
  }
  if (live.updates() != replay.updates()) {
    return fmt::format("chunk updates: {} checkpointed, {} replayed", live.updates(), replay.updates());
  }
  const std::vector<uint64_t> a = live.Stats().pushes_by_worker, b = replay.Stats().pushes_by_worker;
  if (a != b) return fmt::format("pushes by worker: [{}] checkpointed, [{}] replayed", fmt::join(a, ", "), fmt::join(b, ", "));
  return "";
}

std::string Hex(uint64_t v) { return fmt::format("{:#x}", v); }

}  // namespace

Status CheckRunHistory(const std::string& run_dir, const RunConfig& config, const ParamLayout& layout,
                       HistoryReport* report) {
  *report = HistoryReport{};
  if (!config.checkpoint.history) {
    return FailedPrecondition("run {}: checkpoint.history is false: the run kept no history to check (set "
                              "checkpoint.history = true for the run)",
                              run_dir);
  }
  if (!config.models.empty()) {
    return InvalidArgument("run {}: trains [[models]]; the history is checked for single-model runs only", run_dir);
  }
  std::map<std::string, uint64_t> counts;
  std::map<int32_t, WorkerHistory> workers;
  std::vector<LoggedPushes> logged(static_cast<size_t>(config.cluster.servers));

  for (int s = 0; s < config.cluster.servers; ++s) {
    ServerHistory h;
    h.server = s;
    const ShardOptions o = RunShardOptions(config, s);
    std::unique_ptr<ShardServer> replay;
    DP_RETURN_IF_ERROR(ShardServer::Create(layout, o, &replay));
    std::unique_ptr<ShardServer> live;
    const std::string checkpoint = ServerCheckpointPath(run_dir, config.checkpoint, s);
    std::error_code ec;
    if (fs::exists(checkpoint, ec)) {
      DP_RETURN_IF_ERROR(ShardServer::Create(layout, o, &live));
      DP_RETURN_IF_ERROR(live->LoadCheckpoint(checkpoint));
      h.checkpoint = true;
      h.checkpoint_seq = live->log_seq();
    }
    const std::string wal = ServerWalPath(run_dir, config.checkpoint, s);
    const std::vector<std::string> files = LogFiles(wal);
    if (files.empty()) return NotFound("{}: server {} left no write-ahead log (nor kept segments)", wal, s);
    LoggedPushes& mine = logged[static_cast<size_t>(s)];
    for (size_t f = 0; f < files.size(); ++f) {
      const std::string& path = files[f];
      WalScanInfo info;
      DP_RETURN_IF_ERROR(ScanWal(path, [&](const WalRecord& r) -> Status {
        if (r.seq != h.last_seq + 1) {
          return Corrupt("{}: record seq {}: server {}'s records {}..{} are in none of its log files (was "
                         "checkpoint.history on from the start of the run?)",
                         path, r.seq, s, h.last_seq + 1, r.seq - 1);
        }
        h.last_seq = r.seq;
        ++h.records;
        if (r.kind == WalKind::kPush || r.kind == WalKind::kCodedPush) {
          ++h.pushes;
          Logged& l = mine[PushKey{r.worker, r.session, r.request_id}];
          WorkerHistory& w = workers[r.worker];
          w.worker = r.worker;
          ++w.applied;
          if (l.times++ == 0) {
            l.first_seq = r.seq;
          } else {
            ++w.applied_twice;
            Note(&report->violations, &counts, "twice",
                 fmt::format("server {}: worker {}'s push (session {}, request {}) is logged again at seq {} (first at "
                             "seq {}): applied twice",
                             s, r.worker, Hex(r.session), r.request_id, r.seq, l.first_seq));
          }
        }
        if (h.checkpoint && r.seq <= h.checkpoint_seq) DP_RETURN_IF_ERROR(replay->Replay(r, path));
        return Status::Ok();
      }, &info));
      if (info.torn) {
        if (f + 1 < files.size()) {
          return Corrupt("{}: byte {}: a kept log segment ends in a torn record ({})", path, info.valid_bytes,
                         info.torn_reason);
        }
        h.torn_tail = true;  // never acknowledged: the process died inside its write
      }
    }
    h.segments = static_cast<int>(files.size());
    if (!h.checkpoint) {
      report->unknowns.push_back(
          fmt::format("server {}: no checkpoint at {}: its weights were not compared with the replay", s, checkpoint));
    } else if (h.checkpoint_seq > h.last_seq) {
      return Corrupt("{}: covers server {}'s log up to seq {}, but its log files end at seq {}", checkpoint, s,
                     h.checkpoint_seq, h.last_seq);
    } else {
      if (h.checkpoint_seq < h.last_seq) {
        // A server that stopped without its stop checkpoint (killed, not restarted), or a stale
        // checkpoint written over a newer one: the final state is not what was compared.
        report->unknowns.push_back(fmt::format(
            "server {}: its last checkpoint covers its log up to seq {}, and the log goes on to seq {}: the state "
            "after those {} records was not compared",
            s, h.checkpoint_seq, h.last_seq, h.last_seq - h.checkpoint_seq));
      }
      h.difference = CompareShards(*live, *replay, layout, s, &h.floats_compared);
      h.equal = h.difference.empty();
      if (!h.equal) {
        report->violations.push_back(fmt::format(
            "server {}: its last checkpoint ({}) differs from a replay of its log to seq {}: {}", s, checkpoint,
            h.checkpoint_seq, h.difference));
      }
    }
    report->servers.push_back(std::move(h));
  }

  // Every acknowledgement a worker recorded, against the logs.
  const fs::path dir = fs::path(run_dir) / "history";
  std::error_code ec;
  std::vector<std::pair<int32_t, std::string>> ack_files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int32_t w = -1;
    if (name.starts_with("worker-") && name.ends_with(".acks") &&
        std::sscanf(name.c_str(), "worker-%d.acks", &w) == 1 && w >= 0 && AckHistoryPath(run_dir, w) == e.path().string()) {
      ack_files.emplace_back(w, e.path().string());
    }
  }
  std::sort(ack_files.begin(), ack_files.end());
  for (const auto& [w, path] : ack_files) {
    WorkerHistory& wh = workers[w];
    wh.worker = w;
    wh.has_acks = true;
    Status bad;
    DP_RETURN_IF_ERROR(ReadAckHistory(path, [&](const AckRecord& a) {
      if (a.server >= config.cluster.servers) {
        if (bad.ok()) bad = Corrupt("{}: an acknowledgement from server {}, and the run has {} servers", path, a.server,
                                    config.cluster.servers);
        return;
      }
      ++wh.acked;
      LoggedPushes& l = logged[static_cast<size_t>(a.server)];
      auto it = l.find(PushKey{w, a.session, a.request_id});
      if (it == l.end()) {
        ++wh.lost;
        Note(&report->violations, &counts, "lost",
             fmt::format("worker {}: server {} acknowledged its push (session {}, request {}), which is in none of "
                         "the server's log files: lost",
                         w, a.server, Hex(a.session), a.request_id));
        return;
      }
      if (it->second.acked) {
        ++wh.acked_twice;
        Note(&report->violations, &counts, "acked twice",
             fmt::format("worker {}: the acknowledgement of its push (session {}, request {}) by server {} is "
                         "recorded twice",
                         w, Hex(a.session), a.request_id, a.server));
      }
      it->second.acked = true;
    }, &wh.partial_lines));
    DP_RETURN_IF_ERROR(bad);
  }
  for (const LoggedPushes& l : logged) {
    for (const auto& [key, entry] : l) {
      if (!entry.acked) ++workers[key.worker].applied_unacked;
    }
  }
  for (auto& [w, wh] : workers) {
    if (!wh.has_acks && wh.applied > 0) {
      report->unknowns.push_back(fmt::format("worker {}: {} pushes logged, and no acknowledgement history at {}", w,
                                             wh.applied, AckHistoryPath(run_dir, w)));
    }
    report->workers.push_back(wh);
  }
  for (const auto& [kind, n] : counts) {
    if (n > kExamples) report->violations.push_back(fmt::format("... and {} more of this kind ({})", n - kExamples, kind));
  }
  return Status::Ok();
}

}  // namespace downpour
