// shm_share.h — where a server's chunks lie in the shared region it offers a worker on its host
// (common/shm_region.h): a push area, then a pull area of the same size, each holding the
// server's chunks back to back in ascending id order. The server (server/shard.cc) and the
// worker's link (client/ps/shm_path.cc) both place chunks by this one rule.
#pragma once

#include <cstdint>
#include <vector>

#include "common/layout.h"

namespace downpour {

struct ShmShare {
  ShmShare(const ParamLayout& layout, int server) : offset(static_cast<size_t>(layout.num_chunks()), 0) {
    for (int32_t id : layout.ServerChunks(server)) {
      offset[static_cast<size_t>(id)] = floats;
      floats += static_cast<uint64_t>(layout.chunk(id).count);
    }
  }
  // The region's size: both areas.
  uint64_t region_bytes() const { return 2 * floats * sizeof(float); }

  std::vector<uint64_t> offset;  // by chunk id: floats into an area (0 for other servers' chunks)
  uint64_t floats = 0;           // of one area: the server's chunks
};

}  // namespace downpour
