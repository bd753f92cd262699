// ack_history.h — the workers' side of a run's history (checkpoint.history): every push part a
// server acknowledged, one line each, for downpour-history to set against what the servers
// logged (server/wal.h). An acknowledged push must be in its server's log exactly once.
//
// File: RUN_DIR/history/worker-<w>.acks (AckHistoryPath), appended by every process of worker w
// (a restart with --resume is a new session and appends). Each line is
//
//   <server> <session> <request id>\n
//
// in decimal: the names the server logged the push under (its WalRecord's worker is w). Each line
// is one write(2) on an O_APPEND descriptor, so a worker killed at any moment leaves every line it
// finished, and at most one partial last line, which the reader skips.
//
// Thread-safety: AckHistoryWriter::Add from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace downpour {

std::string AckHistoryPath(const std::string& run_dir, int worker);

struct AckRecord {
  int server = 0;
  uint64_t session = 0;
  uint64_t request_id = 0;
};

class AckHistoryWriter {
 public:
  // Creates the directory and the file (0600) if missing; appends otherwise.
  static Status Open(const std::string& path, std::unique_ptr<AckHistoryWriter>* out);
  ~AckHistoryWriter();
  AckHistoryWriter(const AckHistoryWriter&) = delete;
  AckHistoryWriter& operator=(const AckHistoryWriter&) = delete;

  // One line. A write that fails is logged once (the history then lacks it: the check is weaker,
  // never wrong) and counted.
  void Add(const AckRecord& r);
  uint64_t failed() const;

 private:
  AckHistoryWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
  mutable std::mutex mu_;
  uint64_t failed_ = 0;
};

// Calls `visit` for every whole line of `path` in order. A malformed line before the last is
// kCorrupt naming the file and the line; a partial last line (no newline) is skipped and counted
// in *partial. A missing file is kNotFound.
Status ReadAckHistory(const std::string& path, const std::function<void(const AckRecord&)>& visit,
                      uint64_t* partial = nullptr);

}  // namespace downpour
