// elapsed.h — NanosSince, the nanoseconds a server's part has spent since a point of the steady
// clock: what its counters (stats busy_ns, sgd_ns, factor_ns, wal_ns; a lane's busy time) add up.
#pragma once

#include <chrono>
#include <cstdint>

namespace downpour {

inline uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace downpour
