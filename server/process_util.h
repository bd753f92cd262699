// process_util.h — small pieces shared by the thin mains downpour-server and downpour-coordinator:
// a signal waiter without global state (SIGINT/SIGTERM blocked, then polled with sigtimedwait)
// and host:port parsing. (The "<run-dir>/<name>.addr" files through which launchers and tests
// learn the address a process bound are written with common/file_io.h WriteFileAtomic.)
//
// Thread-safety: BlockStopSignals() must be called in main before any thread starts.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"

namespace downpour {

// Blocks SIGINT and SIGTERM in the calling thread (and threads it starts later).
void BlockStopSignals();
// Waits up to `timeout` for SIGINT/SIGTERM; true if one arrived.
bool StopSignalArrived(std::chrono::milliseconds timeout);
// "host:port" -> port; error names the flag/field `what`.
Status ParsePort(const std::string& host_port, const std::string& what, int* port, std::string* host);

}  // namespace downpour
