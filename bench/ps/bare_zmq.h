// bare_zmq.h — the transport limit the load benchmark compares against.
//
// Moves exactly the payloads one push+pull round of the parameter service moves, over bare
// ZeroMQ sockets and nothing else: each of W worker threads has a DEALER per server; each of
// S server threads has a ROUTER. A round = every worker sends its gradient frames for server
// s (the chunks the layout deals to s) and s answers with the same number of bytes as weight
// frames. No header, no validation, no update: what is left is ZeroMQ + loopback TCP.
//
// This is the one place outside common/ that includes ZeroMQ: it is the peer being measured,
// not part of the system.
#pragma once

#include <cstdint>
#include <vector>

#include "common/security.h"

namespace downpour::bench {

struct BareResult {
  double seconds = 0;      // wall time of the timed rounds
  int rounds = 0;          // rounds per worker
  double bytes_moved = 0;  // payload bytes, both directions, all workers
  double cpu_seconds = 0;  // CPU time of the whole process (servers, workers, ZeroMQ) over `seconds`
};

// frames_per_server[s] = element counts of the chunks server s owns (floats). With `server` and
// `client` keys (curve.enabled) every socket is CurveZMQ (encrypted; no ZAP handler, so no
// client check): the cipher's own limit on this machine. Default: plaintext.
BareResult RunBareZmq(const std::vector<std::vector<int64_t>>& frames_per_server, int workers, int warmup_rounds,
                      int rounds, int base_port, const CurveOptions& server = {}, const CurveOptions& client = {});

}  // namespace downpour::bench
