// random_id.h — a random, nonzero 64-bit number that tells one process, object or region from
// another: a client's session, a server's or the coordinator's incarnation, a shared region's
// nonce. 0 is kept for "none". Not a secret (common/run_secret.h makes those).
//
// Thread-safety: any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace downpour {

inline uint64_t RandomId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) {
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return v;
}

}  // namespace downpour
