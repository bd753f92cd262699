// access.h — who may send what to a shard server or the coordinator: the one place that decides
// (issue 11, "roles are authorised").
//
// Two regimes, chosen per run:
//  * Keyed (CurveZMQ keys, common/security.h): every connection is authenticated, and the ZAP
//    handler sets the peer's ZeroMQ User-Id to the role its key is bound to ("admin",
//    "server", "worker"), which arrives as PeerInfo::user_id. The role decides; tokens are not
//    looked at. A peer with user_id "" (not authenticated) is refused everything privileged.
//  * Unkeyed (the loopback default): admin and register messages must carry the run's secret
//    (MessageHeader::token == run_secret, compared in constant time). The secret is the file
//    <run_dir>/secret, mode 0600 (common/run_secret.h), so only the user who started the run
//    can read it. run_secret "" turns the check off: only for in-process tests and programs
//    started without a run directory, never for a process reachable from another user.
//
// Privileges:
//   kAdmin           shutdown, checkpoint (shard); shutdown (coordinator). Keyed: "admin".
//   kRegisterServer  register as a server with the coordinator. Keyed: "server".
//   kRegisterWorker  register as a worker (coordinator, shard). Keyed: "worker".
//   kWorkerTraffic   push / pull / clock on a shard. Keyed: "worker"; unkeyed: no check here
//                    (the shard also requires the connection that registered the worker id).
//   kObserve         register as an observer (benchmarks and tools reading stats).
//                    Keyed: "admin"; unkeyed: the token.
//   kEvaluate        register as the run's evaluator (coordinator, shard), which may then pull
//                    weight snapshots and nothing else. Keyed: "worker" (it runs beside the
//                    workers with their key; it can do less than they can); unkeyed: the token.
//
// Checkpoint paths from the wire (ConfineToRunDir): a path a peer names must resolve inside the
// run directory; absolute paths elsewhere, ".." escapes and symlinks that lead out are refused.
//
// Thread-safety: free functions over values; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "common/codec.h"
#include "common/status.h"
#include "common/transport.h"

namespace downpour {

struct AccessPolicy {
  // True when the transport authenticates peers with CurveZMQ keys: roles come from
  // PeerInfo::user_id. Default false (no keys).
  bool keyed = false;
  // Unkeyed runs: the token admin and register messages must carry. Default "" = no check
  // (in-process tests only; see above).
  std::string run_secret;
  // The run directory: checkpoint paths from the wire must stay inside it. Default "" = every
  // checkpoint path from the wire is refused (the server's own checkpoint path still works).
  std::string run_dir;
};

enum class Privilege { kAdmin, kRegisterServer, kRegisterWorker, kWorkerTraffic, kObserve, kEvaluate };
const char* PrivilegeName(Privilege p);

// Ok when `peer` may exercise `privilege` with message `h` under `policy`; otherwise
// kFailedPrecondition whose message says what was refused and why (never the secret), for the
// error reply; the caller's log line adds who asked (DescribePeer).
Status Authorize(const AccessPolicy& policy, const PeerInfo& peer, const MessageHeader& h, Privilege privilege);

// Resolves `wire_path` (absolute, or relative to `run_dir`) and checks that it lies inside
// `run_dir`, both sides resolved with std::filesystem::weakly_canonical (so ".." and symlinks,
// including a symlinked parent directory, are followed before the check). On success
// `*resolved` is the resolved path. Refused (kFailedPrecondition) when run_dir is "" or the path
// leaves it, names the run directory itself, or ends in a dangling symlink.
Status ConfineToRunDir(const std::string& run_dir, const std::string& wire_path, std::string* resolved);

// Equal contents, in time that depends only on the lengths (no early exit on the first
// differing byte), so a token cannot be guessed byte by byte from reply timings.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// "127.0.0.5 (key worker)", "127.0.0.5" or "an unknown address": for log lines.
std::string DescribePeer(const PeerInfo& peer);

}  // namespace downpour
