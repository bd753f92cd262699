// history_check.h — checks a finished run's history (checkpoint.history): what every server
// logged (server/wal.h, every segment kept) against what every worker saw acknowledged
// (common/ack_history.h), and each server's last checkpoint against a replay of its log.
//
// The guarantee checked, after any fault: every push a worker saw acknowledged was applied by
// its server exactly once, and no push was applied twice; and the weights, update-rule state,
// versions and counters the server checkpointed are, bit for bit, those of a fresh shard that
// applies the logged records one at a time, in order, through the same apply path. The second
// part sets the live server (parallel apply lanes, resends, restarts, fences) against a serial
// replay; it does not check the update rule's arithmetic, which the solver's closed-form tests
// and the gradient checks do. A push applied whose acknowledgement no worker recorded is allowed
// (its worker died or was cut off before reading it) and counted.
//
// This is Jepsen's way for this system's histories: inject the fault, let the workload run, check
// the history afterwards (docs/operations.md "Checking a run's history").
//
// Thread-safety: a free function; it reads the run directory and builds shards of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/run_config.h"
#include "common/status.h"

namespace downpour {

struct ServerHistory {
  int server = 0;
  int segments = 0;            // log files read (kept segments and the live log)
  uint64_t records = 0;        // valid records, seq 1..last_seq
  uint64_t last_seq = 0;
  uint64_t pushes = 0;         // push records (init pushes included)
  bool torn_tail = false;      // the live log ends in a torn record (never acknowledged)
  bool checkpoint = false;     // a last checkpoint was there to compare with
  uint64_t checkpoint_seq = 0; // the records it covers (replayed and compared up to it)
  bool equal = false;          // the replay equals it
  std::string difference;      // the first difference, when not equal
  uint64_t floats_compared = 0;
};

struct WorkerHistory {
  int worker = 0;
  bool has_acks = false;          // RUN_DIR/history/worker-<w>.acks was there
  uint64_t acked = 0;             // acknowledged push parts recorded
  uint64_t lost = 0;              // acknowledged, in no server's log
  uint64_t acked_twice = 0;       // the same acknowledgement recorded twice
  uint64_t applied = 0;           // logged pushes of this worker, over every server
  uint64_t applied_twice = 0;     // logged under a (session, request id) already logged
  uint64_t applied_unacked = 0;   // logged, acknowledgement not recorded (allowed)
  uint64_t partial_lines = 0;     // a partial last line of the ack file (a killed worker)
};

struct HistoryReport {
  std::vector<ServerHistory> servers;
  std::vector<WorkerHistory> workers;  // every worker id that pushed or recorded an ack
  std::vector<std::string> violations;  // the guarantee broken: lost, doubled, replay differs
  // What could not be checked: no checkpoint, one that does not cover the whole log, no ack file.
  std::vector<std::string> unknowns;
  bool valid() const { return violations.empty() && unknowns.empty(); }
};

// Reads the run in `run_dir` (its config `config`, layout `layout`) and fills *report. A run
// without checkpoint.history, a missing or corrupt log, a log with records missing from seq 1, a
// checkpoint of another run, or a malformed ack file is an error naming the file; what the
// history shows is in the report.
Status CheckRunHistory(const std::string& run_dir, const RunConfig& config, const ParamLayout& layout,
                       HistoryReport* report);

}  // namespace downpour
