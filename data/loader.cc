// loader.cc — the batch ring, its threads, and the record -> float pipeline.
#include "data/loader.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace downpour::data {
namespace {

// How many bad-record warnings are logged one by one before the loader only counts them.
constexpr int64_t kWarnOneByOne = 20;

void* AlignedAllocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

}  // namespace

LoaderOptions EvalOptions(const std::string& db_path, int batch_size, int crop) {
  LoaderOptions o;
  o.db_path = db_path;
  o.batch_size = batch_size;
  o.crop = crop;
  o.train = false;
  o.mirror = false;
  o.shuffle_buffer = 0;
  o.epochs = 1;
  return o;
}

Loader::Loader(LoaderOptions options) : options_(std::move(options)) {
  if (!options_.allocate) options_.allocate = AlignedAllocate;
  if (!options_.deallocate) options_.deallocate = [](void* p) { std::free(p); };
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& slot : slots_) {
    if (slot.batch.data) options_.deallocate(slot.batch.data);
    if (slot.batch.bytes) options_.deallocate(slot.batch.bytes);
    if (slot.batch.windows) options_.deallocate(slot.batch.windows);
    if (slot.batch.labels) options_.deallocate(slot.batch.labels);
  }
}

Status Loader::ValidateOptions() const {
  const LoaderOptions& o = options_;
  if (o.db_path.empty()) return InvalidArgument("loader: db_path is empty");
  if (o.shard_count < 1) return InvalidArgument("loader: shard_count is {}, must be >= 1", o.shard_count);
  if (o.shard_index < 0 || o.shard_index >= o.shard_count) {
    return InvalidArgument("loader: shard_index {} is outside [0, shard_count={})", o.shard_index,
                           o.shard_count);
  }
  if (o.batch_size < 1) return InvalidArgument("loader: batch_size is {}, must be >= 1", o.batch_size);
  if (o.crop < 0) return InvalidArgument("loader: crop is {}, must be >= 0", o.crop);
  if (o.pad < 0 || o.pad > 64) return InvalidArgument("loader: pad is {}, must be in [0, 64]", o.pad);
  if (o.threads < 1 || o.threads > 256) {
    return InvalidArgument("loader: threads is {}, must be in [1, 256]", o.threads);
  }
  if (o.queue_depth < 2) return InvalidArgument("loader: queue_depth is {}, must be >= 2", o.queue_depth);
  if (o.channels != 0 && o.channels != 1 && o.channels != 3) {
    return InvalidArgument("loader: channels is {}, must be 0, 1 or 3", o.channels);
  }
  if (o.shuffle_buffer < 0) return InvalidArgument("loader: shuffle_buffer is {}, must be >= 0", o.shuffle_buffer);
  if (o.epochs < 0) return InvalidArgument("loader: epochs is {}, must be >= 0", o.epochs);
  if (o.num_classes < 0) {
    return InvalidArgument("loader: num_classes is {}, must be >= 0 (0 = labels unchecked)", o.num_classes);
  }
  // Stream positions are start_batch * batch_size and up: keep them far from int64 overflow.
  if (o.start_batch < 0 || o.start_batch > (int64_t{1} << 62) / o.batch_size) {
    return InvalidArgument("loader: start_batch is {}, must be in [0, {}] for batch_size {}", o.start_batch,
                           (int64_t{1} << 62) / o.batch_size, o.batch_size);
  }
  if (!std::isfinite(o.scale)) return InvalidArgument("loader: scale is {}, must be finite", o.scale);
  if (!o.mean_file.empty() && !o.mean_values.empty()) {
    return InvalidArgument("loader: both mean_file ({}) and {} mean_values given; pick one",
                           o.mean_file, o.mean_values.size());
  }
  return Status::Ok();
}

Status Loader::CollectKeys() {
  DP_RETURN_IF_ERROR(LmdbEnv::OpenReadOnly(options_.db_path, &env_));
  const int64_t n = env_->entries();
  if (n == 0) return InvalidArgument("LMDB {}: has no records", options_.db_path);
  slice_ = SliceOf(n, options_.shard_index, options_.shard_count);
  if (slice_.size() == 0) {
    return InvalidArgument("LMDB {}: {} records leave slice {} of {} empty", options_.db_path, n,
                           options_.shard_index, options_.shard_count);
  }
  // One cursor pass over keys (values are not touched: LMDB hands out map pointers).
  std::unique_ptr<ReadTxn> txn;
  DP_RETURN_IF_ERROR(ReadTxn::Begin(env_.get(), &txn));
  key_offsets_.assign(1, 0);
  key_offsets_.reserve(static_cast<size_t>(slice_.size()) + 1);
  bool found = false;
  int64_t index = 0;
  DP_RETURN_IF_ERROR(txn->First(&found));
  while (found && index < slice_.end) {
    if (index >= slice_.begin) {
      key_arena_.append(txn->key());
      key_offsets_.push_back(key_arena_.size());
    }
    ++index;
    DP_RETURN_IF_ERROR(txn->Next(&found));
  }
  if (static_cast<int64_t>(key_offsets_.size()) - 1 != slice_.size()) {
    return Corrupt("LMDB {}: cursor found {} records of slice [{}, {}) (stat says {} in all)",
                   options_.db_path, key_offsets_.size() - 1, slice_.begin, slice_.end, n);
  }
  return Status::Ok();
}

Status Loader::LearnShape() {
  // The first record of the slice that parses fixes the output shape.
  std::unique_ptr<ReadTxn> txn;
  DP_RETURN_IF_ERROR(ReadTxn::Begin(env_.get(), &txn));
  caffe::Datum datum;
  Image scratch;
  ImageView v;
  Status last;
  bool have = false;
  const int64_t probe = std::min<int64_t>(slice_.size(), 100);
  for (int64_t i = 0; i < probe && !have; ++i) {
    const std::string_view key(key_arena_.data() + key_offsets_[i], key_offsets_[i + 1] - key_offsets_[i]);
    const std::string where = fmt::format("LMDB {} key {}", options_.db_path, key);
    std::string_view value;
    DP_RETURN_IF_ERROR(txn->Get(key, &value));
    last = ParseDatum(value, where, &datum);
    if (last.ok()) last = ViewDatum(datum, options_.channels, where, &scratch, &v);
    if (last.ok()) have = true;
    if (!have && options_.on_bad_record == BadRecordPolicy::kFail) return last;
  }
  if (!have) return Status(last.code(), "no readable record among the first records: " + last.message());
  uint8_records_ = v.u8 != nullptr;
  if (options_.byte_batches && !uint8_records_)
    return InvalidArgument("loader: LMDB {} holds float records; byte batches need uint8 pixels", options_.db_path);
  out_c_ = v.c;
  src_h_ = v.h;
  src_w_ = v.w;
  if (options_.crop > 0) {
    if (options_.crop > v.h || options_.crop > v.w) {
      return InvalidArgument("loader: crop {} is larger than the records of LMDB {} ({}x{})",
                             options_.crop, options_.db_path, v.h, v.w);
    }
    out_h_ = out_w_ = options_.crop;
  } else {
    out_h_ = v.h;
    out_w_ = v.w;
  }
  mean_.scale = options_.scale;
  if (!options_.mean_file.empty()) {
    DP_RETURN_IF_ERROR(ReadMeanFile(options_.mean_file, &mean_image_));
    if (mean_image_.c != v.c || mean_image_.h != v.h || mean_image_.w != v.w) {
      return InvalidArgument("mean file {}: shape {}x{}x{} differs from the records of LMDB {} "
                             "({}x{}x{})", options_.mean_file, mean_image_.c, mean_image_.h,
                             mean_image_.w, options_.db_path, v.c, v.h, v.w);
    }
    mean_.image = mean_image_.values.data();
    mean_.image_c = mean_image_.c;
    mean_.image_h = mean_image_.h;
    mean_.image_w = mean_image_.w;
  } else if (!options_.mean_values.empty()) {
    if (options_.mean_values.size() != 1 && static_cast<int>(options_.mean_values.size()) != v.c) {
      return InvalidArgument("loader: {} mean_values given; the records have {} channels "
                             "(give 1 or {})", options_.mean_values.size(), v.c, v.c);
    }
    mean_.values = options_.mean_values;
  }
  return Status::Ok();
}

Status Loader::Open() {
  DP_CHECK(threads_.empty());
  DP_RETURN_IF_ERROR(ValidateOptions());
  DP_RETURN_IF_ERROR(CollectKeys());
  DP_RETURN_IF_ERROR(LearnShape());
  const int64_t n = slice_.size();
  if (options_.epochs > 0) {
    total_batches_ = (options_.epochs * n + options_.batch_size - 1) / options_.batch_size;
    if (options_.start_batch > total_batches_) {
      return InvalidArgument(
          "loader: start_batch {} is past the end of the stream: {} epochs "
          "of the {} records of LMDB {} (slice {} of {}) are {} batches of {}",
          options_.start_batch, options_.epochs, n, options_.db_path, options_.shard_index, options_.shard_count,
          total_batches_, options_.batch_size);
    }
  }
  // Batches before start_batch count as taken: the threads claim, and Next() hands out, from
  // there on. Every batch is a pure function of its index, so nothing else changes.
  next_claim_ = next_consume_ = options_.start_batch;
  const size_t image_floats = size_t(out_c_) * out_h_ * out_w_;
  slots_.resize(static_cast<size_t>(options_.queue_depth));
  for (auto& slot : slots_) {
    const size_t data_bytes = image_floats * options_.batch_size * (options_.byte_batches ? 1 : sizeof(float));
    if (options_.byte_batches) {
      slot.batch.bytes = static_cast<uint8_t*>(options_.allocate(data_bytes));
      slot.batch.windows = static_cast<CropWindow*>(options_.allocate(options_.batch_size * sizeof(CropWindow)));
    } else {
      slot.batch.data = static_cast<float*>(options_.allocate(data_bytes));
    }
    slot.batch.labels = static_cast<int*>(options_.allocate(options_.batch_size * sizeof(int)));
    const bool images = options_.byte_batches ? slot.batch.bytes != nullptr && slot.batch.windows != nullptr
                                              : slot.batch.data != nullptr;
    if (!images || slot.batch.labels == nullptr) {
      return Internal("loader: allocating a {} byte batch buffer failed", data_bytes);
    }
    slot.batch.c = out_c_;
    slot.batch.h = out_h_;
    slot.batch.w = out_w_;
  }
  stats_.records_in_shard = n;
  opened_at_ = std::chrono::steady_clock::now();
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { ThreadMain(); });
  return Status::Ok();
}

int64_t Loader::batches_per_epoch() const {
  return (slice_.size() + options_.batch_size - 1) / options_.batch_size;
}

InputNormalization Loader::normalization() const {
  InputNormalization n;
  n.channels = out_c_;
  n.height = out_h_;
  n.width = out_w_;
  if (mean_.image != nullptr) {
    n.mean_image = mean_image_.values;
    n.mean_h = mean_image_.h;
    n.mean_w = mean_image_.w;
  }
  n.mean_values = mean_.values;
  n.scale = mean_.scale;
  return n;
}

std::shared_ptr<const std::vector<int64_t>> Loader::OrderFor(int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  const uint64_t seed = Mix64(options_.seed) ^ static_cast<uint64_t>(options_.shard_index);
  auto order = std::make_shared<const std::vector<int64_t>>(
      EpochOrder(slice_.size(), options_.shuffle_buffer, seed, epoch));
  orders_[epoch] = order;
  // Threads work on at most queue_depth consecutive batches, so old epochs are done with;
  // a straggler that still needs one recomputes it (the order is a pure function).
  while (orders_.size() > 3) orders_.erase(orders_.begin());
  return order;
}

void Loader::Fail(Status s) {
  // Caller holds mu_. The first error wins; it is what status() reports.
  if (error_.ok()) error_ = std::move(s);
  cv_.notify_all();
}

void Loader::ThreadMain() {
  std::unique_ptr<ReadTxn> txn;  // LMDB: this thread's own read transaction
  Status s = ReadTxn::Begin(env_.get(), &txn);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    Fail(std::move(s));
    return;
  }
  caffe::Datum datum;  // reused: protobuf keeps the string capacity between parses
  Image scratch;       // reused decode buffer
  const size_t depth = slots_.size();
  while (true) {
    Slot* slot = nullptr;
    int64_t b = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !error_.ok() || (total_batches_ >= 0 && next_claim_ >= total_batches_) ||
               slots_[next_claim_ % depth].state == SlotState::kFree;
      });
      if (stop_ || !error_.ok() || (total_batches_ >= 0 && next_claim_ >= total_batches_)) return;
      b = next_claim_++;
      slot = &slots_[b % depth];
      slot->state = SlotState::kFilling;
    }
    s = FillBatch(b, txn.get(), &slot->batch, &datum, &scratch);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok()) {
        Fail(std::move(s));
        return;
      }
      slot->state = SlotState::kReady;
    }
    cv_.notify_all();
  }
}

Status Loader::LoadRecord(int64_t position, ReadTxn* txn, caffe::Datum* datum, Image* scratch, Batch* batch,
                          int i_batch) {
  const int64_t n = slice_.size();
  const int64_t epoch = position / n;
  const auto order = OrderFor(epoch);
  const int64_t i = (*order)[static_cast<size_t>(position % n)];
  const size_t image_elems = size_t(out_c_) * out_h_ * out_w_;
  const std::string_view key(key_arena_.data() + key_offsets_[i], key_offsets_[i + 1] - key_offsets_[i]);
  std::string_view value;
  DP_RETURN_IF_ERROR(txn->Get(key, &value));
  const std::string where = fmt::format("LMDB {} key {}", options_.db_path, key);
  DP_RETURN_IF_ERROR(ParseDatum(value, where, datum));
  if (options_.num_classes > 0 && (datum->label() < 0 || datum->label() >= options_.num_classes)) {
    // Not a bad record to skip: the dataset and the model disagree (InvalidArgument stops the
    // loader whatever on_bad_record says).
    return InvalidArgument(
        "{}: label {} is outside the model's {} classes (0..{}): the dataset "
        "and model.config do not match",
        where, datum->label(), options_.num_classes, options_.num_classes - 1);
  }
  ImageView v;
  DP_RETURN_IF_ERROR(ViewDatum(*datum, options_.channels, where, scratch, &v));
  if (options_.byte_batches && v.u8 == nullptr)
    return Corrupt("{}: a float record; byte batches need uint8 pixels (raw or encoded)", where);
  if (v.c != out_c_) {
    if (datum->encoded() && options_.channels == 0) {
      // A folder of mostly colour JPEGs with a few greyscale ones (or the reverse).
      return Corrupt(
          "{}: the stored image decodes to {} channels, the stream has {}; to convert every encoded "
          "record to {} channels, set the loader's channels to {}",
          where, v.c, out_c_, out_c_, out_c_);
    }
    return Corrupt("{}: {} channels, the stream has {}", where, v.c, out_c_);
  }
  if (options_.crop > 0 ? (v.h < options_.crop || v.w < options_.crop)
                        : (v.h != src_h_ || v.w != src_w_)) {
    return Corrupt("{}: size {}x{} does not fit the stream ({}x{}, crop {})", where, v.h, v.w,
                   src_h_, src_w_, options_.crop);
  }
  if (mean_.image != nullptr && (v.h != mean_.image_h || v.w != mean_.image_w)) {
    return Corrupt("{}: size {}x{} differs from the mean image {}x{} ({})", where, v.h, v.w,
                   mean_.image_h, mean_.image_w, options_.mean_file);
  }
  // Padding (training only): the crop is chosen in the padded image, then placed back in the
  // record's coordinates, where it may reach past the edges by up to `pad` pixels.
  const int pad = options_.train ? options_.pad : 0;
  CropChoice crop = ChooseCrop(v.h + 2 * pad, v.w + 2 * pad, out_h_, out_w_, options_.train, options_.mirror,
                               options_.seed ^ Mix64(options_.shard_index), epoch, position);
  crop.y0 -= pad;
  crop.x0 -= pad;
  if (options_.byte_batches) {
    CropToBytes(v, crop, out_h_, out_w_, batch->bytes + i_batch * image_elems);
    batch->windows[i_batch] = CropWindow{crop.y0, crop.x0, v.h, v.w, crop.mirror ? 1 : 0};
  } else {
    TransformToFloat(v, crop, out_h_, out_w_, mean_, batch->data + i_batch * image_elems);
  }
  batch->labels[i_batch] = datum->label();
  return Status::Ok();
}

Status Loader::FillBatch(int64_t b, ReadTxn* txn, Batch* batch, caffe::Datum* datum,
                         Image* scratch) {
  const int64_t n = slice_.size();
  const int64_t first = b * options_.batch_size;
  int64_t last = first + options_.batch_size;
  if (options_.epochs > 0) last = std::min(last, options_.epochs * n);
  const int count = static_cast<int>(last - first);
  const size_t image_floats = size_t(out_c_) * out_h_ * out_w_;
  std::vector<int> bad;
  int good = -1;
  for (int i = 0; i < count; ++i) {
    Status s = LoadRecord(first + i, txn, datum, scratch, batch, i);
    if (s.ok()) {
      good = i;
      continue;
    }
    // Only a bad record (kCorrupt) is skipped; LMDB failures (not the record's fault) and a
    // label outside the model's classes always stop the loader.
    if (options_.on_bad_record == BadRecordPolicy::kFail || s.code() != StatusCode::kCorrupt) {
      return s;
    }
    bad.push_back(i);
    const int64_t k = skipped_.fetch_add(1) + 1;
    if (k <= kWarnOneByOne || k % 1000 == 0) {
      spdlog::warn("data loader: skipping bad record ({} so far): {}", k, s.message());
    }
  }
  if (good < 0) {
    return Corrupt("LMDB {}: every record of batch {} (positions {}..{}) is bad",
                   options_.db_path, b, first, last - 1);
  }
  for (int i : bad) {
    if (options_.byte_batches) {
      std::memcpy(batch->bytes + i * image_floats, batch->bytes + good * image_floats, image_floats);
      batch->windows[i] = batch->windows[good];
    } else {
      std::memcpy(batch->data + i * image_floats, batch->data + good * image_floats, image_floats * sizeof(float));
    }
    batch->labels[i] = batch->labels[good];
  }
  batch->n = count;
  batch->index = b;
  batch->epoch = first / n;
  batch->skipped = static_cast<int>(bad.size());
  return Status::Ok();
}

const Batch* Loader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.ok() || slots_.empty()) return nullptr;
  if (total_batches_ >= 0 && next_consume_ >= total_batches_) return nullptr;
  Slot& slot = slots_[next_consume_ % slots_.size()];
  if (slot.state == SlotState::kTaken) {
    Fail(
        FailedPrecondition("loader: Next() with all {} batches of the ring unreleased; "
                           "Release() a batch first",
                           slots_.size()));
    return nullptr;
  }
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] {
    return !error_.ok() || (slot.state == SlotState::kReady && slot.batch.index == next_consume_);
  });
  stats_.consumer_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error_.ok()) return nullptr;
  slot.state = SlotState::kTaken;
  ++next_consume_;
  ++stats_.batches;
  stats_.images += slot.batch.n;
  return &slot.batch;
}

void Loader::Release(const Batch* batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot* found = nullptr;
    for (auto& slot : slots_) {
      if (&slot.batch == batch) found = &slot;
    }
    DP_CHECK(found != nullptr);
    DP_CHECK(found->state == SlotState::kTaken);
    found->state = SlotState::kFree;
  }
  cv_.notify_all();
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s = stats_;
  s.skipped_records = skipped_.load();
  s.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_at_).count();
  return s;
}

Status Loader::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace downpour::data
