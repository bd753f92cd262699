// idx_sources.cc — the IDX-backed TrainSource/TestSource of sources.h.
#include <algorithm>
#include <numeric>
#include <random>

#include "client/worker/sources.h"
#include "data/idx.h"

namespace downpour::worker {
namespace {

// All records of one shard, decoded to float once (Fashion-MNIST: 60k × 784 floats = 188 MB
// for the whole set; a shard is 1/W of it).
struct IdxShard {
  std::vector<float> images;  // records × rows × cols
  std::vector<int> labels;
  int rows = 0, cols = 0;
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
};

Status LoadShard(const IdxSourceOptions& o, IdxShard* shard) {
  if (o.batch_size < 1) return InvalidArgument("IDX source {}: batch_size = {} (must be >= 1)", o.images_path, o.batch_size);
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count)
    return InvalidArgument("IDX source {}: shard {} of {} is out of range", o.images_path, o.shard_index, o.shard_count);
  data::IdxImages images;
  std::vector<uint8_t> labels;
  DP_RETURN_IF_ERROR(data::ReadIdxImages(o.images_path, &images));
  DP_RETURN_IF_ERROR(data::ReadIdxLabels(o.labels_path, &labels));
  if (static_cast<int64_t>(labels.size()) != images.count)
    return InvalidArgument("IDX source: {} has {} images but {} has {} labels", o.images_path, images.count,
                           o.labels_path, labels.size());
  const int64_t total = o.limit > 0 ? std::min(o.limit, images.count) : images.count;
  const int64_t pixels = images.rows * images.cols;
  shard->rows = static_cast<int>(images.rows);
  shard->cols = static_cast<int>(images.cols);
  for (int64_t r = o.shard_index; r < total; r += o.shard_count) {
    const uint8_t* src = images.pixels.data() + r * pixels;
    for (int64_t i = 0; i < pixels; ++i) shard->images.push_back(static_cast<float>(src[i]) * o.scale);
    shard->labels.push_back(labels[static_cast<size_t>(r)]);
  }
  if (shard->count() == 0)
    return InvalidArgument("IDX source {}: shard {} of {} is empty ({} records)", o.images_path, o.shard_index,
                           o.shard_count, total);
  return Status::Ok();
}

class IdxTrainSource : public TrainSource {
 public:
  IdxTrainSource(IdxSourceOptions o, IdxShard shard) : o_(o), shard_(std::move(shard)) {
    const size_t pixels = static_cast<size_t>(shard_.rows * shard_.cols);
    images_.resize(static_cast<size_t>(o_.batch_size) * pixels);
    labels_.resize(static_cast<size_t>(o_.batch_size));
    Restart();
  }

  // Step s starts at record s·N of the stream: replay the epochs' shuffles up to its epoch.
  Status SeekToStep(int64_t step) override {
    if (step < 0) return InvalidArgument("IDX source {}: step {} is negative", o_.images_path, step);
    Restart();
    const int64_t consumed = step * o_.batch_size;
    const int64_t epochs = consumed / shard_.count();
    for (int64_t e = 0; e < epochs; ++e) NextEpoch();
    pos_ = static_cast<size_t>(consumed % shard_.count());
    return Status::Ok();
  }

  // Fills a full batch, wrapping into the next epoch when the shard runs out (as a
  // cycling loader does); the batch's epoch is the epoch of its first record.
  Status Next(BatchView* b) override {
    const size_t pixels = static_cast<size_t>(shard_.rows * shard_.cols);
    b->epoch = epoch_;
    for (int i = 0; i < o_.batch_size; ++i) {
      if (pos_ == order_.size()) NextEpoch();
      const int64_t r = order_[pos_++];
      std::copy_n(shard_.images.data() + static_cast<size_t>(r) * pixels, pixels,
                  images_.data() + static_cast<size_t>(i) * pixels);
      labels_[static_cast<size_t>(i)] = shard_.labels[static_cast<size_t>(r)];
    }
    b->data = images_.data();
    b->labels = labels_.data();
    b->n = o_.batch_size;
    b->c = 1;
    b->h = shard_.rows;
    b->w = shard_.cols;
    return Status::Ok();
  }
  int64_t shard_size() const override { return shard_.count(); }

 private:
  void Restart() {
    rng_.seed(o_.seed * 7919 + static_cast<uint64_t>(o_.shard_index));
    order_.resize(static_cast<size_t>(shard_.count()));
    std::iota(order_.begin(), order_.end(), 0);
    if (o_.shuffle) std::shuffle(order_.begin(), order_.end(), rng_);
    pos_ = 0;
    epoch_ = 0;
  }
  void NextEpoch() {
    pos_ = 0;
    ++epoch_;
    if (o_.shuffle) std::shuffle(order_.begin(), order_.end(), rng_);
  }

  IdxSourceOptions o_;
  IdxShard shard_;
  std::mt19937_64 rng_;
  std::vector<int64_t> order_;
  size_t pos_ = 0;
  int epoch_ = 0;
  std::vector<float> images_;
  std::vector<int> labels_;
};

class IdxTestSource : public TestSource {
 public:
  IdxTestSource(IdxSourceOptions o, IdxShard shard) : o_(o), shard_(std::move(shard)) {}
  Status Rewind() override {
    pos_ = 0;
    return Status::Ok();
  }
  Status Next(BatchView* b, bool* has_batch) override {
    *has_batch = pos_ < shard_.count();
    if (!*has_batch) return Status::Ok();
    const int64_t n = std::min<int64_t>(o_.batch_size, shard_.count() - pos_);
    const size_t pixels = static_cast<size_t>(shard_.rows * shard_.cols);
    b->data = shard_.images.data() + static_cast<size_t>(pos_) * pixels;
    b->labels = shard_.labels.data() + pos_;
    b->n = static_cast<int>(n);
    b->c = 1;
    b->h = shard_.rows;
    b->w = shard_.cols;
    b->epoch = 0;
    pos_ += n;
    return Status::Ok();
  }

 private:
  IdxSourceOptions o_;
  IdxShard shard_;
  int64_t pos_ = 0;
};

}  // namespace

Status OpenIdxTrainSource(const IdxSourceOptions& options, std::unique_ptr<TrainSource>* out) {
  IdxShard shard;
  DP_RETURN_IF_ERROR(LoadShard(options, &shard));
  *out = std::make_unique<IdxTrainSource>(options, std::move(shard));
  return Status::Ok();
}

Status OpenIdxTestSource(const IdxSourceOptions& options, std::unique_ptr<TestSource>* out) {
  IdxShard shard;
  DP_RETURN_IF_ERROR(LoadShard(options, &shard));
  *out = std::make_unique<IdxTestSource>(options, std::move(shard));
  return Status::Ok();
}

}  // namespace downpour::worker
