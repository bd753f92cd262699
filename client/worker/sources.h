// sources.h — where the training loop gets its images, behind two small interfaces, so the
// same loop runs on the LMDB loader (data/, the normal path) and on in-memory IDX files
// (the single-process reference run and tests).
//
// Batches are N×C×H×W float images (already scaled / mean-subtracted / augmented) and N int
// labels. A BatchView points into memory owned by the source; it stays valid until the next
// Next() or Release() on that source.
//
// Thread-safety: a source is used by one thread (the training thread); implementations may
// run their own prefetch threads internally.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/byte_batch.h"
#include "common/status.h"

namespace downpour::worker {

struct BatchView {
  const float* data = nullptr;  // n × c × h × w; null for a byte batch
  const int* labels = nullptr;  // n
  int n = 0, c = 0, h = 0, w = 0;
  int epoch = 0;                // pass over this source's shard the batch belongs to (0-based)
  // A byte batch (TrainSource::UseBytes): n × c × h × w crop windows and their n windows.
  const uint8_t* bytes = nullptr;
  const CropWindow* windows = nullptr;
  ByteBatch byte_batch() const { return ByteBatch{bytes, windows, n}; }
};

// An endless stream of training batches over this worker's shard (epochs roll over).
class TrainSource {
 public:
  virtual ~TrainSource() = default;
  // Next batch; the previous batch's view becomes invalid.
  virtual Status Next(BatchView* batch) = 0;
  // Byte batches (common/byte_batch.h), for a net whose backend normalises its input
  // (engine::Backend::normalizes_input): called before the first Next(). True: from now on Next()
  // fills bytes and windows instead of data, `norm` says how to normalise them, and a view stays
  // valid until the second Next() after it (the trainer stages the next step's batch while a step
  // runs). False (the default, or records that are not uint8): floats as before.
  virtual Status UseBytes(bool* used, InputNormalization* norm) {
    (void)norm;
    *used = false;
    return Status::Ok();
  }
  // Records in this worker's shard (for epoch-based runs and ETA); 0 if unknown.
  virtual int64_t shard_size() const = 0;
  // Positions the stream so that the next batch is the one training step `step` reads (a
  // resumed worker continues where it stopped): the stream of batches is a pure function of
  // the seed, the shard and the step, so this reproduces it exactly.
  virtual Status SeekToStep(int64_t step) = 0;
};

// The test set, in order, in batches; Rewind() before each evaluation.
class TestSource {
 public:
  virtual ~TestSource() = default;
  virtual Status Rewind() = 0;
  // False at the end of the set; otherwise fills `batch` (the last one may be short).
  virtual Status Next(BatchView* batch, bool* has_batch) = 0;
  // Byte batches, as TrainSource::UseBytes: true from now on (and on every later call, with the
  // same `norm`), Next() fills bytes and windows, and a view stays valid until the second Next()
  // after it or a Rewind(). Default: false.
  virtual Status UseBytes(bool* used, InputNormalization* norm) {
    (void)norm;
    *used = false;
    return Status::Ok();
  }
};

// In-memory Fashion-MNIST/MNIST IDX data: pixels × scale, 1×rows×cols per image.
struct IdxSourceOptions {
  std::string images_path;   // idx3-ubyte(.gz)
  std::string labels_path;   // idx1-ubyte(.gz)
  int batch_size = 64;       // images per batch (>= 1)
  float scale = 1.0f / 256;  // pixel multiplier (Caffe's MNIST 0.00390625)
  int64_t limit = 0;         // use only the first `limit` records; 0 = all
  int shard_index = 0;       // this reader takes records shard_index, +shard_count, ...
  int shard_count = 1;       //   (the loader's "slice" sharding)
  bool shuffle = false;      // reshuffle the shard's order every epoch (seeded)
  uint64_t seed = 1;
};
Status OpenIdxTrainSource(const IdxSourceOptions& options, std::unique_ptr<TrainSource>* out);
Status OpenIdxTestSource(const IdxSourceOptions& options, std::unique_ptr<TestSource>* out);

}  // namespace downpour::worker
