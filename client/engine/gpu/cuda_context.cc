// cuda_context.cc — see cuda_context.h.
#include "client/engine/gpu/cuda_context.h"

#include <algorithm>

#include "client/engine/gpu/cuda_check.h"
#include "client/engine/gpu/cuda_kernels.h"

namespace downpour::engine::gpu {

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // errors here have nowhere to go; the memory is gone either way
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Status DeviceBuffer::Resize(size_t bytes, const char* what) {
  if (bytes == bytes_) return Status::Ok();
  if (ptr_) {
    DP_CUDA_RETURN(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  if (bytes == 0) return Status::Ok();
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return Internal("cudaMalloc of {} bytes for {} failed: {} ({} MiB free of {} MiB)", bytes, what,
                    cudaGetErrorString(e), free_b >> 20, total_b >> 20);
  }
  bytes_ = bytes;
  return Status::Ok();
}

Status CudaContext::Create(const CudaOptions& options, std::shared_ptr<CudaContext>* context) {
  std::shared_ptr<CudaContext> c(new CudaContext(options));
  DP_RETURN_IF_ERROR(c->Init());
  *context = std::move(c);
  return Status::Ok();
}

Status CudaContext::Init() {
  DP_CUDA_RETURN(cudaSetDevice(options_.gpu_id));
  DP_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DP_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  DP_CUDA_RETURN(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  DP_CUDA_RETURN(cudaEventCreateWithFlags(&grads_event_, cudaEventDisableTiming));
  DP_CUDNN_RETURN(cudnnCreate(&cudnn_));
  DP_CUDNN_RETURN(cudnnSetStream(cudnn_, stream_));
  DP_CUBLAS_RETURN(cublasCreate(&cublas_));
  DP_CUBLAS_RETURN(cublasSetStream(cublas_, stream_));
  DP_CUBLAS_RETURN(cublasSetMathMode(cublas_, options_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                            : CUBLAS_DEFAULT_MATH));
  return Status::Ok();
}

CudaContext::~CudaContext() {
  MakeCurrent();
  if (stream_) cudaStreamSynchronize(stream_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (auto& a : allocations_) {
    if (a->pinned) cudaHostUnregister(const_cast<float*>(a->host_mirror));
    for (cudaEvent_t e : a->event_pool) cudaEventDestroy(e);
    cudaFree(a->device);
  }
  workspace_ = DeviceBuffer();
  ones_ = DeviceBuffer();
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  for (auto& [ticket, e] : downloads_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_download_events_) cudaEventDestroy(e);
  if (grads_event_) cudaEventDestroy(grads_event_);
  if (compute_done_) cudaEventDestroy(compute_done_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaContext::MakeCurrent() const { DP_CUDA_THROW(cudaSetDevice(options_.gpu_id)); }

Status CudaContext::EnsureWorkspace(size_t bytes) {
  if (bytes <= workspace_.bytes()) return Status::Ok();
  // The old workspace may still be in use by queued kernels.
  DP_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return workspace_.Resize(bytes, "the convolution workspace");
}

Status CudaContext::EnsureOnes(int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (bytes <= ones_.bytes()) return Status::Ok();
  DP_CUDA_RETURN(cudaStreamSynchronize(stream_));
  DP_RETURN_IF_ERROR(ones_.Resize(bytes, "the bias ones vector"));
  DP_CUDA_RETURN(Fill(stream_, n, 1.0f, ones_.floats()));
  return Status::Ok();
}

float* CudaContext::Allocate(int64_t count) {
  MakeCurrent();
  auto a = std::make_unique<Allocation>();
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  DP_CUDA_THROW(cudaMalloc(reinterpret_cast<void**>(&a->device), bytes));
  DP_CUDA_THROW(cudaMemsetAsync(a->device, 0, bytes, stream_));
  DP_CUDA_THROW(cudaStreamSynchronize(stream_));
  a->count = count;
  allocations_.push_back(std::move(a));
  return allocations_.back()->device;
}

void CudaContext::Free(float* ptr) {
  MakeCurrent();
  auto it = std::find_if(allocations_.begin(), allocations_.end(),
                         [ptr](const auto& a) { return a->device == ptr; });
  DP_CHECK(it != allocations_.end());  // Free of a pointer Allocate did not return
  Synchronize();
  Allocation& a = **it;
  if (a.pinned) DP_CUDA_THROW(cudaHostUnregister(const_cast<float*>(a.host_mirror)));
  for (cudaEvent_t e : a.event_pool) DP_CUDA_THROW(cudaEventDestroy(e));
  DP_CUDA_THROW(cudaFree(a.device));
  allocations_.erase(it);
}

CudaContext::Allocation* CudaContext::FindAllocation(const float* device) {
  for (auto& a : allocations_)
    if (device >= a->device && device < a->device + a->count) return a.get();
  return nullptr;
}

// The net copies between one host mirror and one device buffer at matching offsets; the first
// copy tells us where the mirror starts. Page-locking it turns every later copy into a true
// asynchronous DMA. A range that cannot be registered (not one mapping) is simply left
// pageable: copies stay correct, only slower.
void CudaContext::MaybePin(Allocation* a, const float* host, int64_t offset) {
  if (a->host_mirror != nullptr) return;
  a->host_mirror = host - offset;
  if (!options_.pin_host_mirrors) return;
  const cudaError_t e = cudaHostRegister(const_cast<float*>(a->host_mirror),
                                         static_cast<size_t>(a->count) * sizeof(float),
                                         cudaHostRegisterDefault);
  if (e == cudaSuccess) a->pinned = true;
  else cudaGetLastError();
}

cudaEvent_t CudaContext::PoolEvent(Allocation* a, size_t i) {
  while (a->event_pool.size() <= i) {
    cudaEvent_t e = nullptr;
    DP_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    a->event_pool.push_back(e);
  }
  return a->event_pool[i];
}

void CudaContext::CopyToDevice(const float* host, float* device, int64_t count, bool after_compute) {
  MakeCurrent();
  Allocation* a = FindAllocation(device);
  if (a == nullptr || count <= 0) {
    UploadBlob(host, device, count);
    return;
  }
  const int64_t offset = device - a->device;
  DP_CHECK_LE(offset + count, a->count);
  MaybePin(a, host, offset);
  if (after_compute) {
    // Queued kernels may still read these floats (a gradient check's perturbed weights).
    DP_CUDA_THROW(cudaEventRecord(compute_done_, stream_));
    DP_CUDA_THROW(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
  }
  QueueChunkedUpload(a, offset, count, [&](int64_t done, int64_t n) {
    DP_CUDA_THROW(cudaMemcpyAsync(device + done, host + done, static_cast<size_t>(n) * sizeof(float),
                                  cudaMemcpyHostToDevice, copy_stream_));
  });
  if (!a->pinned) {
    // Pageable source: cudaMemcpyAsync has staged it already, but keep the contract simple —
    // the caller may overwrite `host` as soon as we return.
    DP_CUDA_THROW(cudaStreamSynchronize(copy_stream_));
  }
}

void CudaContext::CopyToDeviceCast(const uint16_t* host, float* device, int64_t count, bool bf16) {
  MakeCurrent();
  Allocation* a = FindAllocation(device);
  DP_CHECK(a != nullptr);  // the net's parameter buffer
  if (count <= 0) return;
  const int64_t offset = device - a->device;
  DP_CHECK_LE(offset + count, a->count);
  if (a->cast.bytes() == 0)
    ThrowIfError(a->cast.Resize(static_cast<size_t>(a->count) * sizeof(uint16_t), "16-bit weights"));
  uint16_t* twin = static_cast<uint16_t*>(a->cast.get()) + offset;
  // No wait behind queued compute (UploadWeights' contract); the twin's previous bytes were widened
  // by earlier work on this same stream.
  QueueChunkedUpload(a, offset, count, [&](int64_t done, int64_t n) {
    DP_CUDA_THROW(cudaMemcpyAsync(twin + done, host + done, static_cast<size_t>(n) * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice, copy_stream_));
    DP_CUDA_THROW(WidenFrom16(copy_stream_, n, bf16, twin + done, device + done));
  });
}

Status CudaContext::PrepareCast(const float* device) {
  MakeCurrent();
  Allocation* a = FindAllocation(device);
  if (a == nullptr || a->cast.bytes() != 0) return Status::Ok();
  return a->cast.Resize(static_cast<size_t>(a->count) * sizeof(uint16_t),
                        "16-bit copies of the net's parameters or gradients");
}

uint16_t* CudaContext::CastTwin(Allocation* a) {
  if (a->cast.bytes() == 0)
    ThrowIfError(a->cast.Resize(static_cast<size_t>(a->count) * sizeof(uint16_t),
                                "16-bit copies of the net's parameters or gradients"));
  return static_cast<uint16_t*>(a->cast.get());
}

// Cuts [offset, +count) of `a` into upload chunks on the copy stream, `copy` queueing each, with
// an event per chunk that a layer's forward waits on (WaitForParams).
void CudaContext::QueueChunkedUpload(Allocation* a, int64_t offset, int64_t count,
                                     const std::function<void(int64_t done, int64_t n)>& copy) {
  const int64_t chunk = std::max<int64_t>(options_.upload_chunk_floats, 1);
  a->chunks.clear();
  a->upload_begin = offset;
  a->upload_end = offset + count;
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t n = std::min(chunk, count - done);
    copy(done, n);
    cudaEvent_t e = PoolEvent(a, a->chunks.size());
    DP_CUDA_THROW(cudaEventRecord(e, copy_stream_));
    a->chunks.push_back({offset + done + n, e});
  }
  a->last_upload = a->chunks.back().event;
}

void CudaContext::WaitForParams(const float* device, int64_t count) {
  Allocation* a = FindAllocation(device);
  if (a == nullptr || a->last_upload == nullptr || count <= 0) return;
  const int64_t begin = device - a->device, end = begin + count;
  cudaEvent_t wait = a->last_upload;
  if (begin >= a->upload_begin && end <= a->upload_end) {
    // The copy stream is in order: the chunk holding our last float covers everything before.
    for (const UploadChunk& c : a->chunks)
      if (c.end >= end) { wait = c.event; break; }
  }
  DP_CUDA_THROW(cudaStreamWaitEvent(stream_, wait, 0));
}

void CudaContext::MarkParamGradsReady(const std::vector<ParamSlot>& params) {
  DP_CUDA_THROW(cudaEventRecord(grads_event_, stream_));
  grads_ready_ranges_.clear();
  for (const ParamSlot& p : params) grads_ready_ranges_.emplace_back(p.grad, p.spec.numel());
}

void CudaContext::CopyToHost(const float* device, float* host, int64_t count) {
  WaitCopy(CopyToHostAsync(device, host, count));
}

uint64_t CudaContext::CopyToHostAsync(const float* device, float* host, int64_t count) {
  MakeCurrent();
  if (count <= 0) return 0;
  Allocation* a = FindAllocation(device);
  if (a != nullptr) MaybePin(a, host, device - a->device);
  return QueueDownload(device, host, count, DownloadAfter(device, count));
}

cudaEvent_t CudaContext::DownloadAfter(const float* device, int64_t count) const {
  // Inside the current layer's parameter-gradient windows only the kernels up to its grads-ready
  // event are waited for; its data-gradient kernels keep running while the bytes move.
  // Anything else waits for all work queued so far.
  const bool ready = std::any_of(grads_ready_ranges_.begin(), grads_ready_ranges_.end(), [&](const auto& r) {
    return device >= r.first && device + count <= r.first + r.second;
  });
  return ready ? grads_event_ : nullptr;
}

uint64_t CudaContext::CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, bool bf16) {
  MakeCurrent();
  if (count <= 0) return 0;
  Allocation* a = FindAllocation(device);
  DP_CHECK(a != nullptr);  // the net's gradient buffer
  uint16_t* twin = CastTwin(a) + (device - a->device);
  CopyStreamAfter(DownloadAfter(device, count));
  // The cast runs on the copy stream: beside the compute stream's layers below, as the copy does.
  DP_CUDA_THROW(CastTo16(copy_stream_, count, bf16, device, twin));
  DP_CUDA_THROW(
      cudaMemcpyAsync(host, twin, static_cast<size_t>(count) * sizeof(uint16_t), cudaMemcpyDeviceToHost, copy_stream_));
  return RecordDownload();
}

uint64_t CudaContext::DownloadBlobAsync(const float* device, float* host, int64_t count) {
  MakeCurrent();
  if (count <= 0) return 0;
  return QueueDownload(device, host, count, nullptr);
}

void CudaContext::QueuePack(const float* device, int64_t batch, int64_t width, std::span<const RowSpan> blocks,
                            float* out) {
  std::vector<int64_t> first, rows;
  for (const RowSpan& k : blocks) {
    DP_CHECK(k.first >= 0 && k.rows >= 0 && k.first + k.rows <= width);
    first.push_back(k.first);
    rows.push_back(k.rows);
  }
  // On the copy stream, as the cast is: beside the compute stream's layers below.
  for (const PackBlocks& launch : PlanPackLaunches(batch, first.data(), rows.data(), blocks.size()))
    DP_CUDA_THROW(PackRowBlocksOnDevice(copy_stream_, batch, width, launch, device, out));
}

uint64_t CudaContext::DownloadPackedAsync(const float* device, int64_t batch, int64_t width,
                                          std::span<const RowSpan> blocks, float* scratch, float* host) {
  MakeCurrent();
  const int64_t floats = batch * PackedRows(blocks);
  if (floats <= 0) return 0;
  CopyStreamAfter(nullptr);
  QueuePack(device, batch, width, blocks, scratch);
  DP_CUDA_THROW(cudaMemcpyAsync(host, scratch, static_cast<size_t>(floats) * sizeof(float), cudaMemcpyDeviceToHost,
                                copy_stream_));
  return RecordDownload();
}

uint64_t CudaContext::DownloadFactorsCastAsync(const float* delta, int64_t batch, int64_t width,
                                               std::span<const RowSpan> blocks, const float* a, int64_t a_count,
                                               float* window, uint16_t* host, bool bf16) {
  MakeCurrent();
  const int64_t packed = batch * PackedRows(blocks), count = packed + a_count;
  if (count <= 0) return 0;
  Allocation* alloc = FindAllocation(window);
  DP_CHECK(alloc != nullptr && window + count <= alloc->device + alloc->count);  // the net's gradient buffer
  uint16_t* twin = CastTwin(alloc) + (window - alloc->device);
  CopyStreamAfter(nullptr);
  QueuePack(delta, batch, width, blocks, window);
  DP_CUDA_THROW(cudaMemcpyAsync(window + packed, a, static_cast<size_t>(a_count) * sizeof(float),
                                cudaMemcpyDeviceToDevice, copy_stream_));
  DP_CUDA_THROW(CastTo16(copy_stream_, count, bf16, window, twin));
  DP_CUDA_THROW(
      cudaMemcpyAsync(host, twin, static_cast<size_t>(count) * sizeof(uint16_t), cudaMemcpyDeviceToHost, copy_stream_));
  return RecordDownload();
}

void CudaContext::CopyStreamAfter(cudaEvent_t after) {
  if (after == nullptr) {
    DP_CUDA_THROW(cudaEventRecord(compute_done_, stream_));
    after = compute_done_;
  }
  DP_CUDA_THROW(cudaStreamWaitEvent(copy_stream_, after, 0));
}

// The copy stream waits for `after` (null: every kernel queued so far), copies, and records the
// end event a ticket stands for.
uint64_t CudaContext::QueueDownload(const float* device, float* host, int64_t count, cudaEvent_t after) {
  CopyStreamAfter(after);
  DP_CUDA_THROW(cudaMemcpyAsync(host, device, static_cast<size_t>(count) * sizeof(float),
                                cudaMemcpyDeviceToHost, copy_stream_));
  return RecordDownload();
}

uint64_t CudaContext::RecordDownload() {
  cudaEvent_t done = nullptr;
  if (free_download_events_.empty()) {
    DP_CUDA_THROW(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  } else {
    done = free_download_events_.back();
    free_download_events_.pop_back();
  }
  DP_CUDA_THROW(cudaEventRecord(done, copy_stream_));
  const uint64_t ticket = next_download_++;
  downloads_.emplace(ticket, done);
  return ticket;
}

bool CudaContext::CopyDone(uint64_t ticket) {
  const auto it = downloads_.find(ticket);
  if (it == downloads_.end()) return true;
  MakeCurrent();
  const cudaError_t r = cudaEventQuery(it->second);
  if (r == cudaErrorNotReady) return false;
  DP_CUDA_THROW(r);
  return true;
}

void CudaContext::WaitCopy(uint64_t ticket) {
  const auto it = downloads_.find(ticket);
  if (it == downloads_.end()) return;
  MakeCurrent();
  DP_CUDA_THROW(cudaEventSynchronize(it->second));
  // Tickets complete in issue order (one copy stream): every earlier one is done too. Retiring
  // them here keeps a ticket nobody waits for (a factored layer's δ, read with its `a`) from
  // holding its event for ever.
  const auto end = std::next(it);
  for (auto e = downloads_.begin(); e != end; ++e) free_download_events_.push_back(e->second);
  downloads_.erase(downloads_.begin(), end);
}

void CudaContext::UploadBlob(const float* host, float* device, int64_t count) {
  MakeCurrent();
  DP_CUDA_THROW(cudaMemcpyAsync(device, host, static_cast<size_t>(count) * sizeof(float),
                                cudaMemcpyHostToDevice, stream_));
}

void CudaContext::DownloadBlob(const float* device, float* host, int64_t count) {
  MakeCurrent();
  DP_CUDA_THROW(cudaMemcpyAsync(host, device, static_cast<size_t>(count) * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
  DP_CUDA_THROW(cudaStreamSynchronize(stream_));
  // After a read-back every upload has landed too, so the caller may refill its host mirror
  // (a pull) without racing a pinned copy still in flight.
  DP_CUDA_THROW(cudaStreamSynchronize(copy_stream_));
}

void CudaContext::Synchronize() {
  MakeCurrent();
  DP_CUDA_THROW(cudaStreamSynchronize(stream_));
  DP_CUDA_THROW(cudaStreamSynchronize(copy_stream_));
}

void CudaContext::RecordConvChoice(const ConvAlgoChoice& choice) {
  for (auto& c : conv_choices_)
    if (c.layer == choice.layer) {
      c = choice;
      return;
    }
  conv_choices_.push_back(choice);
}

std::string CudaContext::Describe() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, options_.gpu_id) != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("gpu:{} (properties unavailable)", options_.gpu_id);
  }
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return fmt::format("gpu:{} {} (sm_{}{}, {} MiB), CUDA runtime {} driver {}, cuDNN {}, TF32 {}, "
                     "conv algorithms: {}",
                     options_.gpu_id, prop.name, prop.major, prop.minor, prop.totalGlobalMem >> 20,
                     runtime, driver, cudnnGetVersion(), options_.tf32 ? "on" : "off",
                     ConvAlgoModeName(options_.conv_algo));
}

}  // namespace downpour::engine::gpu
