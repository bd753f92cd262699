// run_secret.h — the per-run secret that guards admin and register messages when a run has no
// CurveZMQ keys (the loopback default), as Jupyter's token or Erlang's cookie do: a stranger on
// the same host who cannot read the run directory cannot send them.
//
//   <run_dir>/secret   64 hex characters (32 bytes of /dev/urandom) and a newline, mode 0600.
//
// The first process of a run that needs it creates it atomically (a private temporary file,
// then link() into place: exactly one creator wins, the others read the winner's), and every
// other process of the run reads it. A secret file that group or other may read is refused, as
// ssh refuses a private key with loose permissions. Across hosts without a shared run
// directory, the same file must be copied into each host's run directory (docs/cluster.md) —
// or, better, the run uses keys.
//
// Thread-safety: reentrant free functions; concurrent EnsureRunSecret calls (threads or
// processes) on one run directory all return the same secret.
#pragma once

#include <string>

#include "common/status.h"

namespace downpour {

// <run_dir>/secret.
std::string RunSecretPath(const std::string& run_dir);

// Reads <run_dir>/secret, creating it first (and `run_dir` if needed) when it does not exist.
Status EnsureRunSecret(const std::string& run_dir, std::string* secret);

// Reads <run_dir>/secret: NotFound when absent; FailedPrecondition when group/other can read
// it (naming the mode and the chmod that fixes it) or it is not 64 hex characters.
Status ReadRunSecret(const std::string& run_dir, std::string* secret);

}  // namespace downpour
