// loader.h — the prefetching, augmenting batch loader a worker trains from.
//
// Background threads read records of this worker's shard (its own LMDB, or slice i of W of a
// shared one), decode them (raw, or JPEG via libjpeg-turbo / PNG), augment them (crop,
// mirror, mean subtraction, scale) and fill batches into a ring of `queue_depth`
// preallocated buffers. The training loop takes a ready batch with Next() — a pointer into
// the ring, no copy — and hands it back with Release().
//
// Determinism: the record stream (which record is at position p of epoch e) and every
// random choice are pure functions of (seed, shard, epoch, position); batches come out in
// stream order whatever the thread count. Two loaders with equal options yield equal
// batches.
//
// Bad records (policy, LoaderOptions::on_bad_record):
//   kSkip (default): a record that is not a Datum, has the wrong byte count, does not decode
//     or has the wrong shape is skipped and counted (Stats::skipped_records), with a warning
//     naming the LMDB and key. Its slot in the batch is filled with a copy of another good
//     image of the same batch (label included) so batches keep their shape. A batch with no
//     good record at all stops the loader with an error.
//   kFail: the first bad record stops the loader; status() names the LMDB and key.
// Only a bad record (kCorrupt) is skipped: an LMDB read failure, or a label outside
// num_classes (LoaderOptions::num_classes), always stops the loader.
// Errors on loader threads surface at the caller's next Next(): it returns nullptr and
// status() says why. Next() also returns nullptr after the last batch when `epochs` > 0.
//
// Thread-safety: Open/Next/Release/stats/status are called from one consumer thread (the
// training loop); the loader's own threads are internal. Ownership: the Loader owns the
// batch buffers (allocated with the allocator hook, e.g. cudaHostAlloc for pinned memory);
// a Batch* is valid until Release() or the Loader's destruction.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_batch.h"
#include "common/status.h"
#include "data/lmdb_io.h"
#include "data/mean_file.h"
#include "data/shard.h"
#include "data/transform.h"

namespace downpour::data {

enum class BadRecordPolicy { kSkip, kFail };

struct LoaderOptions {
  std::string db_path;            // the LMDB directory (required)
  int shard_index = 0;            // this worker's slice i of shard_count (0-based)
  int shard_count = 1;            // W; 1 = read the whole LMDB (a worker's own shard)
  int batch_size = 64;            // N, images per batch
  int crop = 0;                   // square crop side (e.g. 227); 0 = whole image
  // Training: the random crop is taken from the record padded by `pad` pixels on every side
  // (padded pixels are 0 in the output: the mean, after subtraction), so with crop 0 the image
  // keeps its size and moves by up to `pad` pixels each way (the CIFAR / Fashion-MNIST
  // "random crop with padding"). Evaluation takes the same centre crop as without padding.
  int pad = 0;
  bool train = true;              // true: random crop + mirror; false: centre crop, no mirror
  bool mirror = false;            // random horizontal flip (train only)
  std::string mean_file;          // mean image (mean_file.h); empty = none
  std::vector<float> mean_values; // per-channel means (1 or C values) when no mean_file
  float scale = 1.0f;             // multiplies (pixel - mean)
  int channels = 0;               // decode encoded records as 1 or 3 channels; 0 = as stored
  int64_t shuffle_buffer = 0;     // windowed shuffle size in records; 0 = key order
  uint64_t seed = 1;              // drives shuffle, crops and mirrors
  int64_t epochs = 0;             // stop after this many passes; 0 = endless
  int threads = 2;                // decode/augment threads
  int queue_depth = 4;            // preallocated batches in the ring (>= 2)
  BadRecordPolicy on_bad_record = BadRecordPolicy::kSkip;
  // The net's number of classes (its last layer's num_output); 0 = labels are not checked.
  // When set, a record whose label is outside [0, num_classes) stops the loader with
  // kInvalidArgument naming the LMDB, the key, the label and num_classes, whatever
  // on_bad_record says: it means the dataset and the model do not match, and skipping would
  // only hide that.
  int num_classes = 0;
  // The first batch of the stream: the loader yields batches start_batch, start_batch + 1,
  // ... exactly as a loader with start_batch = 0 would (same records, crops, mirrors,
  // `index` and `epoch`), so a resumed worker goes on where it stopped. With epochs > 0 it
  // counts toward the total: the loader yields total - start_batch batches.
  int64_t start_batch = 0;
  // Byte batches (common/byte_batch.h): each image's crop window as uint8 (Batch::bytes, with its
  // Batch::windows) instead of floats (Batch::data stays null). The crop is chosen as for floats;
  // the mean, the mirror and the scale are left to the consumer (normalization()), which gets the
  // float batch of the same options bit for bit, from a quarter of the bytes. The records must
  // hold uint8 pixels (raw or encoded): a float record is a bad record.
  bool byte_batches = false;
  // Batch memory. Default: 64-byte aligned host memory. A GPU worker passes cudaHostAlloc /
  // cudaFreeHost here for pinned buffers, so data/ never depends on CUDA.
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void*)> deallocate;
};

// Options to iterate an evaluation LMDB once, in key order, centre-cropped, no mirror.
LoaderOptions EvalOptions(const std::string& db_path, int batch_size, int crop);

struct Batch {
  float* data = nullptr;   // [n, c, h, w] contiguous (capacity batch_size images)
  uint8_t* bytes = nullptr;       // byte_batches: [n, c, h, w] crop windows (instead of data)
  CropWindow* windows = nullptr;  // byte_batches: [n]
  int* labels = nullptr;   // [n]
  int n = 0, c = 0, h = 0, w = 0;
  int64_t index = 0;       // batch number in the stream, 0, 1, 2, ...
  int64_t epoch = 0;       // epoch of the batch's first image
  int skipped = 0;         // bad records replaced in this batch
};

struct LoaderStats {
  int64_t batches = 0;            // handed out by Next()
  int64_t images = 0;             // in those batches
  int64_t skipped_records = 0;    // bad records skipped (kSkip policy)
  double consumer_wait_s = 0;     // time Next() waited for a batch (the trainer starving)
  double elapsed_s = 0;           // since Open()
  int64_t records_in_shard = 0;   // records in this worker's slice
};

class Loader {
 public:
  explicit Loader(LoaderOptions options);
  ~Loader();  // stops and joins the threads
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Validates options (errors name the field and value), opens the LMDB, reads the shard's
  // keys, learns the shape from the first record, allocates the ring, starts the threads.
  Status Open();
  // The next batch in stream order, waiting if it is not ready; nullptr at the end or on
  // error (see status()). At most queue_depth batches may be held before Release().
  const Batch* Next();
  // Returns a batch's buffer to the ring.
  void Release(const Batch* batch);
  LoaderStats stats() const;
  Status status() const;

  // Output shape (valid after Open): c x h x w per image.
  int channels() const { return out_c_; }
  int height() const { return out_h_; }
  int width() const { return out_w_; }
  // Batches in one pass over the shard (the last one may be partial).
  int64_t batches_per_epoch() const;
  // Whether the records hold uint8 pixels (raw or encoded), as byte batches need (valid after Open).
  bool uint8_records() const { return uint8_records_; }
  // byte_batches: what turns a batch's bytes into the floats this loader would otherwise yield
  // (valid after Open).
  InputNormalization normalization() const;

 private:
  enum class SlotState { kFree, kFilling, kReady, kTaken };
  struct Slot {
    Batch batch;
    SlotState state = SlotState::kFree;
  };

  Status ValidateOptions() const;
  Status CollectKeys();
  Status LearnShape();
  void ThreadMain();
  Status FillBatch(int64_t b, ReadTxn* txn, Batch* batch, caffe::Datum* datum, Image* scratch);
  // Image i of `batch` from the record at stream `position`.
  Status LoadRecord(int64_t position, ReadTxn* txn, caffe::Datum* datum, Image* scratch, Batch* batch, int i);
  std::shared_ptr<const std::vector<int64_t>> OrderFor(int64_t epoch);
  void Fail(Status s);

  LoaderOptions options_;
  std::unique_ptr<LmdbEnv> env_;
  SliceRange slice_;
  std::string key_arena_;               // the slice's keys, back to back
  std::vector<size_t> key_offsets_;     // [slice size + 1] into key_arena_
  MeanImage mean_image_;
  MeanSpec mean_;
  int out_c_ = 0, out_h_ = 0, out_w_ = 0;
  int src_h_ = 0, src_w_ = 0;           // record size when crop == 0 (all must match)
  bool uint8_records_ = false;          // the first readable record's pixels are uint8
  int64_t total_batches_ = -1;          // -1 = endless

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  int64_t next_claim_ = 0;              // next batch a thread will fill
  int64_t next_consume_ = 0;            // next batch Next() returns
  bool stop_ = false;
  Status error_;
  LoaderStats stats_;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
  std::atomic<int64_t> skipped_{0};
  int64_t warned_ = 0;
  std::chrono::steady_clock::time_point opened_at_;
  std::vector<std::thread> threads_;
};

}  // namespace downpour::data
