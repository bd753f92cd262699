// config/checkpoint.h — [checkpoint]: a server shard's checkpoints and write-ahead log.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/table.h"

namespace downpour {

// How a write-ahead log's bytes reach the disk (server/wal.h).
enum class WalIo {
  kAuto,      // O_DIRECT where the filesystem takes it (tried at Open), else buffered
  kBuffered,  // write(2) through the page cache
  kDirect,    // O_DIRECT, or an error at Open naming the log
};
inline constexpr std::string_view kWalIoNames[] = {"auto", "buffered", "direct"};

// [checkpoint] — a server shard's durability: checkpoints (common/tensor_file.h format) and the
// write-ahead log (server/wal.h). ShardOptions embeds it.
struct CheckpointConfig {
  int64_t every_updates = 1000;
  std::string dir = "checkpoints";
  bool wal = true;
  int wal_fsync_ms = 200;
  int64_t wal_max_mb = 2048;
  WalIo wal_io = WalIo::kAuto;
  bool history = false;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("every_updates", s.every_updates, AtLeast<int64_t>(0, "0 = off"),
          "a shard checkpoints every n rounds of updates of its chunks; 0 = off");
    v.Key("dir", s.dir, NonEmpty(), "where checkpoints go; relative paths are inside the run directory");
    v.Key("wal", s.wal, "write-ahead log per shard: acknowledged updates survive a server's death");
    v.Key("wal_fsync_ms", s.wal_fsync_ms, AtLeast(0, "0 = fsync before every acknowledgement"),
          "fsync the log at least this often; 0 = before every ack");
    v.Key("wal_max_mb", s.wal_max_mb,
          Must<int64_t>([](int64_t x) { return x >= 1 && x <= (int64_t{1} << 30); },
                        "must be between 1 and 2^30 MiB"),
          "a log reaching this many MiB checkpoints its shard, which empties it");
    v.Named("wal_io", s.wal_io, Names{kWalIoNames}, "how the log writes: O_DIRECT where the filesystem takes it");
    v.Key("history", s.history,
          "keep every log segment and each worker's acknowledged pushes, for downpour-history to check");
  }
  bool operator==(const CheckpointConfig&) const = default;
};
// checkpoint.wal_max_mb in bytes.
inline uint64_t WalMaxBytes(const CheckpointConfig& c) { return static_cast<uint64_t>(c.wal_max_mb) << 20; }

}  // namespace downpour
