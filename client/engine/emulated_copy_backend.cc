// emulated_copy_backend.cc — see emulated_copy_backend.h.
#include "client/engine/emulated_copy_backend.h"

#include <cstring>

namespace downpour::engine {
namespace {

// An event of the log, its other fields at their defaults.
CopyEvent Event(CopyEvent::Kind kind, uint64_t ticket = 0, const float* device = nullptr, int64_t count = 0,
                int layer = -1) {
  CopyEvent e;
  e.kind = kind;
  e.ticket = ticket;
  e.device = device;
  e.count = count;
  e.layer = layer;
  return e;
}

// A layer of the inner backend that first waits for the copies its run depends on.
class CopyOrderedLayer : public Layer {
 public:
  CopyOrderedLayer(std::unique_ptr<Layer> inner, EmulatedCopyBackend* backend, int index, std::vector<ParamSlot> params)
      : inner_(std::move(inner)), backend_(backend), index_(index), params_(std::move(params)) {}
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    return inner_->Reshape(bottom, top);
  }
  void Forward(Phase phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    backend_->BeforeForward(index_, params_);
    inner_->Forward(phase, bottom, top);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                const std::vector<Blob*>& bottom) override {
    backend_->BeforeBackward(index_, params_);
    inner_->set_skip_weight_grad(skip_weight_grad_);
    inner_->Backward(top, propagate_down, bottom);
  }
  bool HasBackward() const override { return inner_->HasBackward(); }
  void SetStep(int64_t step) override { inner_->SetStep(step); }
  std::string KernelNames() const override { return inner_->KernelNames(); }

 private:
  std::unique_ptr<Layer> inner_;
  EmulatedCopyBackend* backend_;
  int index_;
  std::vector<ParamSlot> params_;
};

}  // namespace

EmulatedCopyBackend::EmulatedCopyBackend(std::unique_ptr<Backend> inner, std::chrono::microseconds delay)
    : inner_(std::move(inner)), delay_(delay), thread_([this] { CopyLoop(); }) {}

EmulatedCopyBackend::~EmulatedCopyBackend() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EmulatedCopyBackend::CopyLoop() {
  auto due = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const Copy c = queue_.front();
    lock.unlock();
    // One copy engine: each copy ends `delay` after the previous one, or after it was queued.
    due = std::max(due, std::chrono::steady_clock::now()) + delay_;
    std::this_thread::sleep_until(due);
    if (c.widen != DType::kF32) {
      WidenTo(static_cast<const uint16_t*>(c.from), c.widen,
              std::span<float>(static_cast<float*>(c.to), static_cast<size_t>(c.device_count)));
    } else {
      std::memcpy(c.to, c.from, static_cast<size_t>(c.bytes));
    }
    lock.lock();
    queue_.pop_front();
    completed_ = c.ticket;
    const CopyEvent::Kind done = c.direction == Direction::kUpload  ? CopyEvent::kUploadDone
                                 : c.direction == Direction::kInput ? CopyEvent::kInputDone
                                                                    : CopyEvent::kDownloadDone;
    log_.push_back(Event(done, c.ticket, c.device, c.device_count));
    cv_.notify_all();
  }
}

uint64_t EmulatedCopyBackend::Queue(Direction direction, const void* from, void* to, int64_t bytes, const float* device,
                                    int64_t device_count, std::shared_ptr<const void> keep, DType widen) {
  if (bytes <= 0) return 0;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    const Copy c{ticket, direction, from, to, bytes, device, device_count, std::move(keep), widen};
    queue_.push_back(c);
    if (direction != Direction::kInput) recent_.push_back(c);
    const CopyEvent::Kind kind = direction == Direction::kUpload  ? CopyEvent::kUploadQueued
                                 : direction == Direction::kInput ? CopyEvent::kInputQueued
                                                                  : CopyEvent::kDownloadQueued;
    log_.push_back(Event(kind, ticket, device, device_count));
  }
  cv_.notify_all();
  return ticket;
}

void EmulatedCopyBackend::CopyToDevice(const float* host, float* device, int64_t count) {
  QueueFloats(true, host, device, count, device);
}

uint64_t EmulatedCopyBackend::CopyToHostAsync(const float* device, float* host, int64_t count) {
  return QueueFloats(false, device, host, count, device);
}

void EmulatedCopyBackend::UploadWeightsCast(const uint16_t* host, float* device, int64_t count, DType dtype) {
  Queue(Direction::kUpload, host, device, count * int64_t{sizeof(uint16_t)}, device, count, nullptr, dtype);
}

uint64_t EmulatedCopyBackend::CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, DType dtype) {
  auto cast = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(count));
  CastFloats(std::span<const float>(device, static_cast<size_t>(count)), dtype, cast->data());
  return Queue(Direction::kDownload, cast->data(), host, count * int64_t{sizeof(uint16_t)}, device, count, cast);
}

void EmulatedCopyBackend::CopyToHost(const float* device, float* host, int64_t count) {
  WaitCopy(CopyToHostAsync(device, host, count));
}

bool EmulatedCopyBackend::CopyDone(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket <= completed_;
}

void EmulatedCopyBackend::WaitCopy(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ticket <= completed_; });
}

void EmulatedCopyBackend::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty(); });
}

void EmulatedCopyBackend::ReadBlob(const Blob& blob, float* host) {
  Synchronize();
  inner_->ReadBlob(blob, host);
}

void EmulatedCopyBackend::ReadBlobGrad(const Blob& blob, float* host) {
  Synchronize();
  inner_->ReadBlobGrad(blob, host);
}

uint64_t EmulatedCopyBackend::ReadBlobAsync(const Blob& blob, float* host) {
  auto copy = std::make_shared<std::vector<float>>(static_cast<size_t>(blob.count()));
  inner_->ReadBlob(blob, copy->data());
  return QueueFloats(false, copy->data(), host, blob.count(), blob.data, copy);
}

uint64_t EmulatedCopyBackend::ReadBlobGradAsync(const Blob& blob, float* host) {
  auto copy = std::make_shared<std::vector<float>>(static_cast<size_t>(blob.count()));
  inner_->ReadBlobGrad(blob, copy->data());
  return QueueFloats(false, copy->data(), host, blob.count(), blob.grad, copy);
}

uint64_t EmulatedCopyBackend::ReadBlobGradBlocksAsync(const Blob& blob, std::span<const RowSpan> blocks, float* scratch,
                                                      float* host) {
  const int64_t batch = blob.shape.at(0);
  std::vector<float> canonical(static_cast<size_t>(blob.count()));
  inner_->ReadBlobGrad(blob, canonical.data());
  PackRowBlocks(canonical.data(), batch, blob.count() / batch, blocks, scratch);
  return QueueFloats(false, scratch, host, batch * PackedRows(blocks), scratch);
}

uint64_t EmulatedCopyBackend::ReadFactorsCastAsync(const Blob& top, std::span<const RowSpan> blocks, const Blob& bottom,
                                                   float* window, uint16_t* host, DType dtype) {
  const int64_t batch = top.shape.at(0), rows = PackedRows(blocks);
  const int64_t count = batch * rows + bottom.count();
  std::vector<float> canonical(static_cast<size_t>(top.count()));
  inner_->ReadBlobGrad(top, canonical.data());
  PackRowBlocks(canonical.data(), batch, top.count() / batch, blocks, window);
  inner_->ReadBlob(bottom, window + batch * rows);
  auto cast = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(count));
  CastFloats(std::span<const float>(window, static_cast<size_t>(count)), dtype, cast->data());
  return Queue(Direction::kDownload, cast->data(), host, count * int64_t{sizeof(uint16_t)}, window, count, cast);
}

Status EmulatedCopyBackend::CreateLayer(const LayerContext& context, std::unique_ptr<Layer>* layer) {
  std::unique_ptr<Layer> inner;
  DP_RETURN_IF_ERROR(inner_->CreateLayer(context, &inner));
  *layer = std::make_unique<CopyOrderedLayer>(std::move(inner), this, context.index, context.params);
  return Status::Ok();
}

uint64_t EmulatedCopyBackend::LastOverlapping(bool upload, const float* begin, int64_t count) {
  uint64_t last = 0;
  for (const Copy& c : recent_) {
    if ((c.direction == Direction::kUpload) == upload && c.device < begin + count && begin < c.device + c.device_count)
      last = std::max(last, c.ticket);
  }
  return last;
}

void EmulatedCopyBackend::BeforeForward(int layer, const std::vector<ParamSlot>& params) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t wait = 0;
  for (const ParamSlot& p : params) wait = std::max(wait, LastOverlapping(true, p.data, p.spec.numel()));
  cv_.wait(lock, [&] { return wait <= completed_; });
  std::erase_if(recent_, [&](const Copy& c) { return c.ticket <= completed_; });  // nothing to wait for
  log_.push_back(Event(CopyEvent::kForward, 0, nullptr, 0, layer));
}

void EmulatedCopyBackend::BeforeBackward(int layer, const std::vector<ParamSlot>& params) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t wait = 0;
  for (const ParamSlot& p : params) wait = std::max(wait, LastOverlapping(false, p.grad, p.spec.numel()));
  cv_.wait(lock, [&] { return wait <= completed_; });
  std::erase_if(recent_, [&](const Copy& c) { return c.ticket <= completed_; });  // nothing to wait for
  log_.push_back(Event(CopyEvent::kBackward, 0, nullptr, 0, layer));
}

void EmulatedCopyBackend::Note(std::string note) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.push_back(CopyEvent{CopyEvent::kNote, 0, nullptr, 0, -1, std::move(note)});
}

std::vector<CopyEvent> EmulatedCopyBackend::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void EmulatedCopyBackend::StageInput(const ByteBatch& batch) {
  DP_CHECK_GT(image_bytes_, 0);  // PrepareInput came first
  const int k = last_read_ == 0 ? 1 : 0;
  InputSlot& slot = input_slots_[k];
  // The last normalisation read the other slot, and it ran synchronously: this one is free.
  slot.source = batch.pixels;
  slot.pixels.resize(static_cast<size_t>(int64_t{batch.n} * image_bytes_));
  slot.windows.resize(static_cast<size_t>(batch.n));
  Queue(Direction::kInput, batch.pixels, slot.pixels.data(), static_cast<int64_t>(slot.pixels.size()), nullptr, 0);
  slot.ticket = Queue(Direction::kInput, batch.windows, slot.windows.data(),
                      static_cast<int64_t>(batch.n * sizeof(CropWindow)), nullptr, 0);
  staged_ = k;
}

void EmulatedCopyBackend::NormalizeInput(const InputNormalization& norm, const ByteBatch& batch, Blob* blob) {
  if (staged_ < 0 || input_slots_[staged_].source != batch.pixels) StageInput(batch);
  InputSlot& slot = input_slots_[staged_];
  WaitCopy(slot.ticket);
  {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back(Event(CopyEvent::kInputNormalized, slot.ticket));
  }
  // From the device's copy only: bytes the caller changed after staging would not show. The inner
  // (host) backend normalises as a device kernel would.
  inner_->NormalizeInput(norm, ByteBatch{slot.pixels.data(), slot.windows.data(), batch.n}, blob);
  last_read_ = staged_;
  staged_ = -1;
}

}  // namespace downpour::engine
