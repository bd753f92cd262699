// emulated_copy_backend.h — a device backend's transfer contract on the CPU, for tests: another
// backend's kernels run on "device" buffers of their own, and host ↔ device copies are done later
// by a copy-engine thread, one after another, each `delay` after the previous, as a GPU's copy
// stream does them. So the asynchronous path a GPU worker runs (Backend::CopyToHostAsync, layers
// waiting only for their own uploads, gradients handed over as their downloads land) is exercised
// where no GPU is, and a net that read a host mirror too early, or a layer that ran before its
// weights arrived, computes with stale floats and differs from the blocking path.
//
// Ordering (what a GPU guarantees by streams and events): a layer's Forward waits for the
// uploads overlapping its parameters that were queued before it; its Backward for the downloads
// of its gradient windows (it overwrites them); a blob read-back or Synchronize for every copy.
// Byte input (Backend::NormalizeInput) is a device's too: StageInput queues the batch's pixels and
// windows into the staging slot the last normalisation did not read, and NormalizeInput waits for
// that batch's copies only (a batch not staged last goes up then), then normalises from the slot,
// never from the caller's memory.
// Downloads are queued when asked (the layer that wrote them has run: CPU kernels are
// synchronous). Every copy, layer run and Note goes to an event log, in order, for tests.
//
// Ownership: owns the inner backend and the copy thread (joined by the destructor, after the
// queued copies). Thread-safety: one caller thread, like every backend; the log may be read from
// it at any time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/engine/layer.h"

namespace downpour::engine {

struct CopyEvent {
  enum Kind {
    kUploadQueued,
    kUploadDone,
    kDownloadQueued,
    kDownloadDone,
    kForward,
    kBackward,
    kNote,
    kInputQueued,  // a byte batch's upload (its windows' copy, the later ticket)
    kInputDone,
    kInputNormalized,  // ticket: the input upload it waited for
  };
  Kind kind;
  uint64_t ticket = 0;          // copies
  const float* device = nullptr;  // copies: the device range
  int64_t count = 0;
  int layer = -1;               // kForward / kBackward
  std::string note;             // kNote
};

class EmulatedCopyBackend : public Backend {
 public:
  EmulatedCopyBackend(std::unique_ptr<Backend> inner, std::chrono::microseconds delay);
  ~EmulatedCopyBackend() override;

  DeviceKind device() const override { return inner_->device(); }
  std::string name() const override { return "emulated-copies(" + inner_->name() + ")"; }
  float* Allocate(int64_t count) override { return inner_->Allocate(count); }
  void Free(float* ptr) override { inner_->Free(ptr); }
  bool memory_is_host() const override { return false; }
  void CopyToDevice(const float* host, float* device, int64_t count) override;
  void CopyToHost(const float* device, float* host, int64_t count) override;
  uint64_t CopyToHostAsync(const float* device, float* host, int64_t count) override;
  // The device's cast kernel is the host's conversion, done at once (CPU kernels are done); the
  // 16-bit bytes are handed to the host by the copy engine later.
  bool casts_on_device() const override { return true; }
  // The device's widening is the host's, done by the copy engine as the bytes land.
  void UploadWeightsCast(const uint16_t* host, float* device, int64_t count, DType dtype) override;
  uint64_t CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, DType dtype) override;
  bool CopyDone(uint64_t ticket) override;
  void WaitCopy(uint64_t ticket) override;
  void SetInput(const float* host, Blob* blob) override { inner_->SetInput(host, blob); }
  void ReadBlob(const Blob& blob, float* host) override;
  void ReleaseInput(Blob* blob) override { inner_->ReleaseInput(blob); }
  void WriteBlobGrad(const float* host, Blob* blob) override { inner_->WriteBlobGrad(host, blob); }
  void ReadBlobGrad(const Blob& blob, float* host) override;
  // The blob in canonical layout at once (CPU kernels are done), handed to the host by the copy
  // engine later.
  uint64_t ReadBlobAsync(const Blob& blob, float* host) override;
  uint64_t ReadBlobGradAsync(const Blob& blob, float* host) override;
  // The device's packing writes `scratch` at once; the copy engine hands scratch to the host
  // later, so whatever overwrote scratch before that would show in the floats.
  uint64_t ReadBlobGradBlocksAsync(const Blob& blob, std::span<const RowSpan> blocks, float* scratch,
                                   float* host) override;
  // The device's packing and cast write `window` and their 16-bit bytes at once; the copy engine
  // hands the bytes to the host later.
  uint64_t ReadFactorsCastAsync(const Blob& top, std::span<const RowSpan> blocks, const Blob& bottom, float* window,
                                uint16_t* host, DType dtype) override;
  void SetThreads(int threads) override { inner_->SetThreads(threads); }
  Status CreateLayer(const LayerContext& context, std::unique_ptr<Layer>* layer) override;
  void Synchronize() override;
  bool normalizes_input() const override { return true; }
  Status PrepareInput(const InputNormalization& norm, int batch) override {
    image_bytes_ = norm.image_bytes();
    return inner_->PrepareInput(norm, batch);
  }
  void StageInput(const ByteBatch& batch) override;
  void NormalizeInput(const InputNormalization& norm, const ByteBatch& batch, Blob* blob) override;

  // A test's own mark in the log (e.g. "tensor 3 handed over").
  void Note(std::string note);
  std::vector<CopyEvent> events() const;

  // For the layers: wait for the copies that must precede their run, then log it.
  void BeforeForward(int layer, const std::vector<ParamSlot>& params);
  void BeforeBackward(int layer, const std::vector<ParamSlot>& params);

 private:
  enum class Direction { kUpload, kDownload, kInput };
  struct Copy {
    uint64_t ticket;
    Direction direction;
    const void* from;
    void* to;
    int64_t bytes;
    const float* device;               // the device end of float copies, for overlap checks and the log
    int64_t device_count;              // its floats
    std::shared_ptr<const void> keep;  // a blob read's canonical copy or a cast, while queued
    DType widen = DType::kF32;         // an upload of 16-bit values widened into `to` (floats)
  };
  uint64_t Queue(Direction direction, const void* from, void* to, int64_t bytes, const float* device,
                 int64_t device_count, std::shared_ptr<const void> keep = nullptr, DType widen = DType::kF32);
  uint64_t QueueFloats(bool upload, const float* from, float* to, int64_t count, const float* device,
                       std::shared_ptr<const void> keep = nullptr) {
    return Queue(upload ? Direction::kUpload : Direction::kDownload, from, to, count * int64_t{sizeof(float)}, device,
                 count, std::move(keep));
  }
  // A staged byte batch: the device's copy of its pixels and windows, and the caller's pointer it
  // came from.
  struct InputSlot {
    const uint8_t* source = nullptr;
    std::vector<uint8_t> pixels;
    std::vector<CropWindow> windows;
    uint64_t ticket = 0;  // its last copy
  };
  InputSlot input_slots_[2];
  int staged_ = -1, last_read_ = -1;  // as CudaInput's (gpu/cuda_input.h)
  int64_t image_bytes_ = 0;           // PrepareInput's
  // The newest queued copy (of `upload`'s direction) overlapping [begin, begin + count); 0 = none.
  uint64_t LastOverlapping(bool upload, const float* begin, int64_t count);
  void CopyLoop();

  std::unique_ptr<Backend> inner_;
  std::chrono::microseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Copy> queue_;        // guarded by mu_: not yet done, in ticket order
  std::vector<Copy> recent_;      // guarded by mu_: every copy queued (for overlap lookups)
  uint64_t next_ticket_ = 1;      // guarded by mu_
  uint64_t completed_ = 0;        // guarded by mu_: every ticket <= it is done
  bool stop_ = false;             // guarded by mu_
  std::vector<CopyEvent> log_;    // guarded by mu_
  std::thread thread_;            // last: starts after everything it reads
};

}  // namespace downpour::engine
