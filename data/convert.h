// convert.h — converters into LMDBs of Caffe Datum records, and the dataset inspector.
//
// Every converter writes records in a fixed order with Caffe-style keys "%08d_<name>"
// (the global record index, so key order = insertion order) into 1 or N shard LMDBs:
//   shards == 1: the LMDB is `out` itself;
//   shards == N: `out`/shard_<i>_of_<N> for i in 0..N-1, record r going to shard r % N
//                (round robin keeps every shard's class mix that of the whole set).
// Outputs that exist and are not empty are refused; nothing is overwritten. Records are
// written under `out`.incomplete, renamed to `out` only when the conversion succeeds and
// removed on every failure, so a failed conversion leaves nothing behind.
//
// Thread-safety: free functions, one conversion per call. Ownership: results are values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::data {

struct ConvertOptions {
  std::string out;         // output LMDB directory (or parent of the shard LMDBs)
  int shards = 1;          // number of shard LMDBs to write
  bool shuffle = false;    // permute the records (seeded) before writing
  uint64_t seed = 1;       // shuffle seed
};

struct ConvertReport {
  int64_t records = 0;
  std::vector<std::string> lmdbs;       // paths written, one per shard
  std::map<int, int64_t> label_counts;  // label -> records
  // convert-folder: the images skipped as unreadable, one "<list> line <n>: <file>: <why>"
  // each (empty for the other converters and with FolderOptions::strict).
  std::vector<std::string> skipped;
};

// The LMDB directories a conversion with `shards` shards writes under `out`.
std::vector<std::string> ShardPaths(const std::string& out, int shards);

// How convert-idx shapes its records. The defaults keep the IDX images as they are (raw
// 1 x rows x cols); the ImageNet-shaped variant AlexNet trains on (docs/alexnet.md) is
// resize = 256, channels = 3, encoded = "jpg".
struct IdxOptions {
  int resize = 0;            // bilinear resize to resize x resize (as convert-folder); 0 = keep
  int channels = 1;          // 1 = greyscale as stored; 3 = the grey plane replicated to B, G, R
  std::string encoded;       // "" = raw pixels; "jpg" or "png" = store encoded images
  int jpeg_quality = 90;     // when encoded == "jpg" (1..100)
  int64_t limit = 0;         // convert only the first `limit` images of the file; 0 = all
};

// IDX images + labels (MNIST / Fashion-MNIST, gzipped or raw) -> records of
// channels x (resize or rows) x (resize or cols), raw or encoded, labels as stored. Bad
// IdxOptions are kInvalidArgument naming the flag (--resize, --channels, --encoded,
// --quality, --limit) before anything is read or written.
Status ConvertIdx(const std::string& images, const std::string& labels, const IdxOptions& idx,
                  const ConvertOptions& options, ConvertReport* report);
// The same with the default IdxOptions (1 x rows x cols raw records).
Status ConvertIdx(const std::string& images, const std::string& labels,
                  const ConvertOptions& options, ConvertReport* report);

// CIFAR-10 binary batches (records of 1 label byte + 3072 pixel bytes, R, G and B planes of
// 32x32) -> 3 x 32 x 32 records with the bytes as stored, as Caffe's convert_cifar_data does
// (so the channel order is RGB, not BGR).
Status ConvertCifar(const std::vector<std::string>& batches, const ConvertOptions& options,
                    ConvertReport* report);

struct FolderOptions {
  std::string root;         // image paths in the list are relative to this folder
  std::string list;         // text file: "<relative path> <integer label>" per line
  int resize_h = 0;         // resize every image to resize_h x resize_w; 0 = keep its size
  int resize_w = 0;
  int channels = 3;         // 3 = colour (BGR), 1 = greyscale
  std::string encoded;      // "" = raw pixels; "jpg" or "png" = store the encoded image
  int jpeg_quality = 90;    // when encoded == "jpg" and the image is re-encoded (1..100)
  // false (default): an image that cannot be read or decoded is skipped with one warning
  // naming the file and the list line, and listed in ConvertReport::skipped (as Caffe's
  // convert_imageset skips it). true: it fails the conversion.
  bool strict = false;
};

// An image folder and a label list -> records (raw planar BGR, or encoded JPEG/PNG).
// CMYK JPEGs are converted to BGR (image.h). A list line naming a missing file is an error
// naming the file and line, found before anything is written; a malformed line too.
// Encoded records keep the file as it is when nothing changes it (see FolderRecord in
// convert.cc); their channels/height/width always say what decoding the stored image gives.
Status ConvertFolder(const FolderOptions& folder, const ConvertOptions& options,
                     ConvertReport* report);

struct InspectReport {
  int64_t records = 0;
  int64_t encoded = 0;                      // records holding JPEG/PNG
  int64_t bad = 0;                          // records that failed to parse/decode
  std::string first_bad;                    // the first such error
  std::map<std::string, int64_t> shapes;    // "CxHxW" -> records
  std::map<int, int64_t> label_counts;      // label -> records
};

// Reads every record (an encoded record whose channels/height/width, when set, differ from
// its decoded image counts as bad); writes a PNG contact sheet of the first `sheet_images` images to
// `sheet_path` when it is not empty.
Status InspectLmdb(const std::string& path, const std::string& sheet_path, int sheet_images,
                   InspectReport* report);

}  // namespace downpour::data
