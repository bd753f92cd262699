// tensor_file.h — the project's tensor file format: named float32 tensors plus string
// metadata. Used for server shard checkpoints and for engine weights alike, so checkpoints
// move between backends (CPU/GPU) and between S-server layouts (tensors are stored whole or as
// named slices; the names are the caller's business).
//
// Layout (all integers little-endian; the build refuses big-endian hosts):
//
//   offset  size          field
//   0       4             magic        u32 0x46545044 (bytes "DPTF")
//   4       4             version      u32 kTensorFileVersion (1)
//   8       4             meta_count   u32
//   12      4             tensor_count u32
//   16      ...           meta_count × { key_len u32, key bytes, value_len u32, value bytes }
//           4             header_crc   u32 CRC-32 of every byte before it
//           ...           tensor_count × tensor record:
//                           name_len u32, name bytes (UTF-8, 1..4096 bytes),
//                           ndim u32 (0..8), dims i64[ndim] (each >= 0),
//                           numel u64 (== product of dims; 1 for ndim 0),
//                           data f32[numel],
//                           crc u32 — CRC-32 of the record's bytes from name_len to data end
//   the file ends right after the last record.
//
// CRC-32 is the zlib/PNG one (reflected polynomial 0xEDB88320), so `python3 -c
// "import zlib"` can check a record by hand.
//
// Writes are atomic: a temporary file in the target's directory, fsync, rename over the
// target, fsync of the directory. A failed write leaves any previous file at `path` intact
// and removes its temporary. Reads check everything and name the file and the field in the
// error (truncated, bad magic, bad version, crc mismatch in tensor "x", ...).
//
// Thread-safety: the functions are reentrant; concurrent writers to the same path each
// rename a complete file, the last rename wins.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour {

inline constexpr uint32_t kTensorFileMagic = 0x46545044;  // "DPTF" on disk
inline constexpr uint32_t kTensorFileVersion = 1;

struct NamedTensor {
  std::string name;            // unique within a file, e.g. "conv1.weight"
  std::vector<int64_t> shape;  // canonical layout (common/tensor_spec.h); {} = scalar
  std::vector<float> data;     // row-major, data.size() == product(shape)
  bool operator==(const NamedTensor&) const = default;
};

struct TensorFile {
  std::map<std::string, std::string> meta;  // e.g. "model", "layout_hash", "updates", "server"
  std::vector<NamedTensor> tensors;         // in file order
  bool operator==(const TensorFile&) const = default;
};

// Writes `file` to `path` atomically (see above). Rejects tensors whose data size does not
// match their shape, empty or duplicate names, before touching the disk.
Status WriteTensorFile(const std::string& path, const TensorFile& file);

// Reads and verifies the whole file into `out` (unspecified on error).
Status ReadTensorFile(const std::string& path, TensorFile* out);

// The tensor called `name`, or nullptr.
const NamedTensor* FindTensor(const TensorFile& file, std::string_view name);

// CRC-32 (zlib's; libdeflate's, PCLMUL where the CPU has it) of `bytes`, continuing from `crc` (0 to start);
// empty bytes (null data too) leave `crc` as it is.
uint32_t Crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);

// A meta value that holds a list of integers is written "a,b,c" ("" = the empty list).
std::string FormatMetaInts(std::span<const int64_t> values);
// Parses such a value into `out`; a bad entry is kCorrupt naming `path`, `key` and the entry.
Status ParseMetaInts(std::string_view text, const std::string& path, std::string_view key, std::vector<int64_t>* out);

}  // namespace downpour
