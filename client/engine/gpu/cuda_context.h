// cuda_context.h — the GPU backend's context object (STYLE.md §7: no singletons): the device,
// a compute stream and a copy stream, the cuDNN and cuBLAS handles bound to the compute stream,
// the ONE convolution workspace every layer shares (layers run in order on one stream, so one
// buffer sized to the largest need is enough), a ones vector for bias GEMMs, and the net's
// parameter/gradient allocations with their transfer bookkeeping (see cuda_backend.h).
//
// Ownership: created by the backend, shared (shared_ptr) with its layers; it owns every handle,
// stream, event and device buffer it creates. DeviceBuffer is a move-only RAII cudaMalloc.
// Thread-safety: one thread at a time, like the net.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/engine/gpu/cuda_backend.h"
#include "client/engine/layer.h"
#include "common/status.h"

namespace downpour::engine::gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Exactly `bytes` (contents undefined after a size change); 0 frees. Out of memory → a
  // Status naming `what` and the size.
  Status Resize(size_t bytes, const char* what);
  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaContext {
 public:
  static Status Create(const CudaOptions& options, std::shared_ptr<CudaContext>* context);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  const CudaOptions& options() const { return options_; }
  // Makes this context's device current on the calling thread (cheap; every entry point calls it).
  void MakeCurrent() const;
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnMathType_t conv_math() const { return options_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH; }

  // The shared convolution workspace: grown (never shrunk) to the largest request.
  Status EnsureWorkspace(size_t bytes);
  void* workspace() const { return workspace_.get(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // A device vector of at least n ones (bias GEMMs: y += b·1ᵀ, db = dy·1).
  Status EnsureOnes(int64_t n);
  const float* ones() const { return ones_.floats(); }

  // The net's parameter / gradient buffers (zeroed). Backend::Allocate has no error channel:
  // out of memory throws downpour::Error naming the size and the device.
  float* Allocate(int64_t count);
  void Free(float* ptr);
  // `after_compute`: the copy stream first waits for every kernel queued so far (they may read
  // the range); false for the net's weight uploads, whose range no queued kernel reads.
  void CopyToDevice(const float* host, float* device, int64_t count, bool after_compute = true);
  // CopyToDevice of 16-bit values (Backend::UploadWeightsCast): each chunk goes up into the
  // allocation's 16-bit twin and a kernel widens it into the floats, on the copy stream, with
  // the chunk events a layer waits on; never after queued compute.
  void CopyToDeviceCast(const uint16_t* host, float* device, int64_t count, bool bf16);
  void CopyToHost(const float* device, float* host, int64_t count);
  // CopyToHost without the wait: a ticket (Backend::CopyToHostAsync), done when its event is.
  uint64_t CopyToHostAsync(const float* device, float* host, int64_t count);
  bool CopyDone(uint64_t ticket);
  void WaitCopy(uint64_t ticket);
  // CopyToHostAsync in 16 bits (Backend::CopyToHostCastAsync): on the copy stream, after the same
  // wait, a cast kernel into the allocation's 16-bit twin (allocated on first use), then the
  // half-size download; a ticket as above.
  uint64_t CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, bool bf16);
  // The 16-bit twin of the allocation holding `device`, allocated now (Backend::PrepareCast).
  Status PrepareCast(const float* device);
  // A blob's download on the copy stream after every kernel queued so far; a ticket as above.
  uint64_t DownloadBlobAsync(const float* device, float* host, int64_t count);
  // The same for a batch × width matrix packed in row blocks (Backend::ReadBlobGradBlocksAsync):
  // on the copy stream, after every kernel queued so far, a kernel packs it into `scratch` (device
  // memory nothing else touches until the ticket completes) and one download of the packed floats
  // follows; a ticket as above.
  uint64_t DownloadPackedAsync(const float* device, int64_t batch, int64_t width, std::span<const RowSpan> blocks,
                               float* scratch, float* host);
  // Sufficient factors in 16 bits (Backend::ReadFactorsCastAsync): on the copy stream, after every
  // kernel queued so far, `delta` (batch × width) packed in `blocks` into `window`, `a` (a_count
  // floats) copied after it, both cast into the window's 16-bit twin (`window` lies in an
  // allocation, PrepareCast's) and one half-size download of the batch × PackedRows + a_count
  // values; a ticket as above.
  uint64_t DownloadFactorsCastAsync(const float* delta, int64_t batch, int64_t width, std::span<const RowSpan> blocks,
                                    const float* a, int64_t a_count, float* window, uint16_t* host, bool bf16);
  // Host ↔ device for blobs (inputs, read-backs): on the compute stream; ToHost waits.
  void UploadBlob(const float* host, float* device, int64_t count);
  void DownloadBlob(const float* device, float* host, int64_t count);

  // Compute stream waits until [device, device+count) of the last parameter upload has landed.
  void WaitForParams(const float* device, int64_t count);
  // A layer starts: forget the previous layer's grads-ready event.
  void BeginLayer() { grads_ready_ranges_.clear(); }
  // A layer's parameter gradients (these slots' grad windows) are enqueued, its data gradient
  // is not yet: downloads of exactly those windows may start now, on the copy stream,
  // overlapping the rest of the layer's backward. Any other download waits for all queued work.
  void MarkParamGradsReady(const std::vector<ParamSlot>& params);
  void Synchronize();

  void RecordConvChoice(const ConvAlgoChoice& choice);
  const std::vector<ConvAlgoChoice>& conv_choices() const { return conv_choices_; }
  std::string Describe() const;

 private:
  struct UploadChunk {
    int64_t end;  // offset (floats) one past the chunk, within the allocation
    cudaEvent_t event;
  };
  struct Allocation {
    float* device = nullptr;
    int64_t count = 0;
    const float* host_mirror = nullptr;  // inferred on the first copy; page-locked when pinned
    bool pinned = false;
    int64_t upload_begin = 0, upload_end = 0;  // the range of the last upload
    std::vector<UploadChunk> chunks;           // its chunks, in order
    std::vector<cudaEvent_t> event_pool;       // reused across steps
    cudaEvent_t last_upload = nullptr;         // end of the last upload of any range
    DeviceBuffer cast;                         // 16-bit twin: cast downloads, widened uploads
  };

  explicit CudaContext(const CudaOptions& options) : options_(options) {}
  uint64_t QueueDownload(const float* device, float* host, int64_t count, cudaEvent_t after);
  // The event a download of [device, +count) waits for: the current layer's grads-ready event when
  // the range lies inside its parameter-gradient windows, else null (all work queued so far).
  cudaEvent_t DownloadAfter(const float* device, int64_t count) const;
  // The copy stream waits for `after` (null: every kernel queued so far).
  void CopyStreamAfter(cudaEvent_t after);
  uint64_t RecordDownload();  // the end event of what the copy stream has queued: a ticket
  Status Init();
  Allocation* FindAllocation(const float* device);
  void MaybePin(Allocation* a, const float* host, int64_t offset);
  cudaEvent_t PoolEvent(Allocation* a, size_t i);
  uint16_t* CastTwin(Allocation* a);  // allocated on first use (throws when it cannot be)
  // Kernels on the copy stream packing `device` (batch × width) in `blocks` into `out`.
  void QueuePack(const float* device, int64_t batch, int64_t width, std::span<const RowSpan> blocks, float* out);
  void QueueChunkedUpload(Allocation* a, int64_t offset, int64_t count,
                          const std::function<void(int64_t done, int64_t n)>& copy);

  CudaOptions options_;
  cudaStream_t stream_ = nullptr;       // compute: every kernel, cuDNN and cuBLAS call
  cudaStream_t copy_stream_ = nullptr;  // parameter uploads and gradient downloads
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;  // scratch: "compute stream reached here"
  cudaEvent_t grads_event_ = nullptr;
  std::vector<std::pair<const float*, int64_t>> grads_ready_ranges_;  // covered by grads_event_
  std::map<uint64_t, cudaEvent_t> downloads_;  // tickets not yet waited: their end events
  std::vector<cudaEvent_t> free_download_events_;
  uint64_t next_download_ = 1;
  DeviceBuffer workspace_, ones_;
  std::vector<std::unique_ptr<Allocation>> allocations_;
  std::vector<ConvAlgoChoice> conv_choices_;
};

}  // namespace downpour::engine::gpu
