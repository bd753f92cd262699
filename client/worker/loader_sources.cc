// loader_sources.cc — see loader_sources.h.
#include "client/worker/loader_sources.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "client/engine/net.h"
#include "data/loader.h"

namespace downpour::worker {
namespace {

// Shuffle window of the training stream (records); a few thousand Fashion-MNIST records mix
// classes well while keeping LMDB reads mostly sequential.
constexpr int64_t kShuffleBuffer = 4096;

// A GPU worker's batches live in page-locked memory (async uploads); a CPU worker's in the
// loader's default aligned memory.
void SetBatchMemory(const RunConfig& c, data::LoaderOptions* o) {
  engine::HostAllocator a = engine::HostAllocatorFor(c.worker.device);
  o->allocate = std::move(a.allocate);
  o->deallocate = std::move(a.deallocate);
}

// A loader batch as the trainer sees it (valid until the batch is released).
BatchView ViewOf(const data::Batch& b, int epoch) {
  BatchView view;
  view.data = b.data;
  view.bytes = b.bytes;
  view.windows = b.windows;
  view.labels = b.labels;
  view.n = b.n;
  view.c = b.c;
  view.h = b.h;
  view.w = b.w;
  view.epoch = epoch;
  return view;
}

// A loader and the batches its consumer holds: one, or with byte batches two (a view handed out
// stays valid until the second Next() after it: the trainer stages it while the step before runs).
class HeldLoader {
 public:
  explicit HeldLoader(data::LoaderOptions o) : options_(std::move(o)) {}
  ~HeldLoader() { Release(); }
  data::LoaderOptions& options() {
    fresh_ = false;  // the caller may change them: the next Reopen opens
    return options_;
  }
  const data::Loader& loader() const { return *loader_; }
  // A new loader from options(), every batch held given back.
  Status Open() {
    Release();
    loader_ = std::make_unique<data::Loader>(options_);
    const Status s = loader_->Open();
    fresh_ = s.ok();
    return s;
  }
  // Open, unless the loader was opened from the same options and nothing has been taken from it
  // since: it would hand out the same batches (a test set's first Rewind after UseBytes).
  Status Reopen() { return fresh_ ? Status::Ok() : Open(); }
  // The next batch (null at the end or on an error: loader().status()); gives back the one it
  // no longer has to hold.
  const data::Batch* Next() {
    fresh_ = false;
    if (previous_ != nullptr) loader_->Release(previous_);
    previous_ = nullptr;
    if (options_.byte_batches) {
      previous_ = held_;
    } else if (held_ != nullptr) {
      loader_->Release(held_);
    }
    held_ = loader_->Next();
    return held_;
  }
  // TrainSource / TestSource::UseBytes: uint8 records switch the loader to byte batches once.
  Status UseBytes(bool* used, InputNormalization* norm) {
    *used = loader_->uint8_records();
    if (!*used) return Status::Ok();
    if (!options_.byte_batches) {
      options_.byte_batches = true;
      ++options_.queue_depth;  // the consumer holds two batches at a time
      DP_RETURN_IF_ERROR(Open());
    }
    *norm = loader_->normalization();
    return Status::Ok();
  }

 private:
  void Release() {
    if (held_ != nullptr) loader_->Release(held_);
    if (previous_ != nullptr) loader_->Release(previous_);
    held_ = previous_ = nullptr;
  }

  data::LoaderOptions options_;
  std::unique_ptr<data::Loader> loader_;
  const data::Batch* held_ = nullptr;
  const data::Batch* previous_ = nullptr;  // byte batches: the one handed out before held_
  bool fresh_ = false;                     // opened from options_, no Next() since
};

// The training stream: the loader with epochs = 0 runs endlessly over the shard, batch b
// holding stream positions [b·N, (b+1)·N) across epoch boundaries, so every batch is full and
// training step s reads batch s.
class LoaderTrainSource : public TrainSource {
 public:
  explicit LoaderTrainSource(data::LoaderOptions o) : loader_(std::move(o)) {}
  Status Open() { return loader_.Open(); }

  Status Next(BatchView* view) override {
    const data::Batch* b = loader_.Next();
    if (b == nullptr) {
      Status s = loader_.loader().status();
      return s.ok() ? Internal("training loader ended (it should be endless)") : s;
    }
    DP_CHECK_EQ(b->n, loader_.options().batch_size);
    *view = ViewOf(*b, static_cast<int>(b->epoch));
    return Status::Ok();
  }
  Status UseBytes(bool* used, InputNormalization* norm) override { return loader_.UseBytes(used, norm); }
  int64_t shard_size() const override { return loader_.loader().stats().records_in_shard; }
  Status SeekToStep(int64_t step) override {
    loader_.options().start_batch = step;
    return Open();
  }

 private:
  HeldLoader loader_;
};

class LoaderTestSource : public TestSource {
 public:
  explicit LoaderTestSource(data::LoaderOptions o) : loader_(std::move(o)) {}

  Status Rewind() override { return loader_.Reopen(); }
  Status Next(BatchView* view, bool* has_batch) override {
    const data::Batch* b = loader_.Next();
    *has_batch = b != nullptr;
    if (b == nullptr) return loader_.loader().status();
    *view = ViewOf(*b, 0);
    return Status::Ok();
  }
  Status UseBytes(bool* used, InputNormalization* norm) override { return loader_.UseBytes(used, norm); }

 private:
  HeldLoader loader_;
};

}  // namespace

Status OpenLoaderTrainSource(const RunConfig& c, int worker_id, bool shuffle, int num_classes,
                             std::unique_ptr<TrainSource>* out, int slice, int slices) {
  data::LoaderOptions o;
  // A worker that joined a running job (id >= workers) reads the data of worker id mod workers
  // (with a shuffle of its own: the seed below takes the whole id), until slices are re-dealt.
  const int own = worker_id % std::max(1, c.cluster.workers);
  if (c.data.sharding == DataSharding::kOwn) {
    o.db_path = OwnShardPath(c.data, own, c.cluster.workers);
  } else {
    o.db_path = c.data.train;
    o.shard_index = slices > 0 ? slice : own;
    o.shard_count = slices > 0 ? slices : c.cluster.workers;
  }
  o.batch_size = c.worker.batch_size;
  o.crop = c.data.crop;
  o.pad = c.data.pad;
  o.train = true;
  o.mirror = c.data.mirror;
  o.mean_file = c.data.mean_file;
  o.mean_values = c.data.mean_values;
  o.scale = c.data.scale;
  o.shuffle_buffer = shuffle ? kShuffleBuffer : 0;
  o.seed = static_cast<uint64_t>(c.run.seed) * 1000003u + static_cast<uint64_t>(worker_id);
  o.queue_depth = std::max(2, c.data.prefetch);
  o.num_classes = num_classes;
  SetBatchMemory(c, &o);
  auto source = std::make_unique<LoaderTrainSource>(o);
  DP_RETURN_IF_ERROR(source->Open());
  *out = std::move(source);
  return Status::Ok();
}

Status OpenLoaderTestSource(const RunConfig& c, int batch, int num_classes, std::unique_ptr<TestSource>* out) {
  data::LoaderOptions o = data::EvalOptions(c.data.test, batch, c.data.crop);
  o.num_classes = num_classes;
  o.mean_file = c.data.mean_file;
  o.mean_values = c.data.mean_values;
  o.scale = c.data.scale;
  SetBatchMemory(c, &o);
  auto source = std::make_unique<LoaderTestSource>(o);
  DP_RETURN_IF_ERROR(source->Rewind());  // checks the LMDB now, not at the first evaluation
  *out = std::move(source);
  return Status::Ok();
}

}  // namespace downpour::worker
