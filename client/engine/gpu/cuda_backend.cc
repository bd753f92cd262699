// cuda_backend.cc — see cuda_backend.h.
#include "client/engine/gpu/cuda_backend.h"

#include <unordered_set>

#include "client/engine/gpu/cuda_check.h"
#include "client/engine/gpu/cuda_context.h"
#include "client/engine/gpu/cuda_input.h"
#include "client/engine/gpu/cuda_layers.h"

namespace downpour::engine {
namespace {

using gpu::CudaContext;
using gpu::DeviceBuffer;

constexpr struct {
  ConvAlgoMode mode;
  const char* name;
} kConvAlgoNames[] = {
    {ConvAlgoMode::kSearch, "search"},       {ConvAlgoMode::kHeuristic, "heuristic"},
    {ConvAlgoMode::kGemm, "gemm"},           {ConvAlgoMode::kImplicitGemm, "implicit_gemm"},
    {ConvAlgoMode::kFft, "fft"},             {ConvAlgoMode::kWinograd, "winograd"},
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(std::shared_ptr<CudaContext> context) : ctx_(std::move(context)) {}

  DeviceKind device() const override { return DeviceKind::kGpu; }
  std::string name() const override { return "cuda"; }
  float* Allocate(int64_t count) override { return ctx_->Allocate(count); }
  void Free(float* ptr) override { ctx_->Free(ptr); }
  bool memory_is_host() const override { return false; }
  void CopyToDevice(const float* host, float* device, int64_t count) override {
    ctx_->CopyToDevice(host, device, count);
  }
  void UploadWeights(const float* host, float* device, int64_t count) override {
    ctx_->CopyToDevice(host, device, count, /*after_compute=*/false);
  }
  uint64_t CopyToHostAsync(const float* device, float* host, int64_t count) override {
    return ctx_->CopyToHostAsync(device, host, count);
  }
  bool casts_on_device() const override { return true; }
  Status PrepareCast(const float* device) override { return ctx_->PrepareCast(device); }
  uint64_t CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, DType dtype) override {
    DP_CHECK(dtype == DType::kF16 || dtype == DType::kBf16);
    return ctx_->CopyToHostCastAsync(device, host, count, dtype == DType::kBf16);
  }
  void UploadWeightsCast(const uint16_t* host, float* device, int64_t count, DType dtype) override {
    DP_CHECK(dtype == DType::kF16 || dtype == DType::kBf16);
    ctx_->CopyToDeviceCast(host, device, count, dtype == DType::kBf16);
  }
  void* AllocateHost(size_t bytes) override {
    void* p = AllocPinnedHost(bytes);  // page-locked: the cast downloads are DMA
    if (p != nullptr) return p;
    p = ::operator new(bytes);  // pinning refused: still correct, copies are staged by the driver
    unpinned_.insert(p);
    return p;
  }
  void FreeHost(void* ptr) override {
    if (unpinned_.erase(ptr) > 0) {
      ::operator delete(ptr);
    } else {
      FreePinnedHost(ptr);
    }
  }
  bool CopyDone(uint64_t ticket) override { return ctx_->CopyDone(ticket); }
  void WaitCopy(uint64_t ticket) override { ctx_->WaitCopy(ticket); }
  void CopyToHost(const float* device, float* host, int64_t count) override {
    ctx_->CopyToHost(device, host, count);
  }

  void SetInput(const float* host, Blob* blob) override { ctx_->UploadBlob(host, InputStorage(blob), blob->count()); }
  // Byte input (gpu/cuda_input.h): uploaded on a stream of its own, normalised by a kernel.
  bool normalizes_input() const override { return true; }
  Status PrepareInput(const InputNormalization& norm, int batch) override {
    if (!input_) input_ = std::make_unique<gpu::CudaInput>(ctx_);
    return input_->Prepare(norm, batch);
  }
  void StageInput(const ByteBatch& batch) override { input_->Stage(batch); }
  void NormalizeInput(const InputNormalization& norm, const ByteBatch& batch, Blob* blob) override {
    DP_CHECK_EQ(blob->count(), batch.n * norm.image_bytes());
    input_->Normalize(batch, InputStorage(blob));
  }
  void ReadBlob(const Blob& blob, float* host) override {
    ctx_->DownloadBlob(blob.data, host, blob.count());
  }
  // Activations are dense NCHW on this backend: gradients cross as they are.
  void WriteBlobGrad(const float* host, Blob* blob) override { ctx_->UploadBlob(host, blob->grad, blob->count()); }
  void ReadBlobGrad(const Blob& blob, float* host) override { ctx_->DownloadBlob(blob.grad, host, blob.count()); }
  uint64_t ReadBlobAsync(const Blob& blob, float* host) override {
    return ctx_->DownloadBlobAsync(blob.data, host, blob.count());
  }
  uint64_t ReadBlobGradAsync(const Blob& blob, float* host) override {
    return ctx_->DownloadBlobAsync(blob.grad, host, blob.count());
  }
  // Packed by a kernel on the copy stream: PCIe carries the wire's blocks (docs/factors.md).
  uint64_t ReadBlobGradBlocksAsync(const Blob& blob, std::span<const RowSpan> blocks, float* scratch,
                                   float* host) override {
    const int64_t batch = blob.shape.at(0);
    return ctx_->DownloadPackedAsync(blob.grad, batch, blob.count() / batch, blocks, scratch, host);
  }
  // The same packing, `a` copied beside it, one cast and a half-size download (docs/factors.md).
  uint64_t ReadFactorsCastAsync(const Blob& top, std::span<const RowSpan> blocks, const Blob& bottom, float* window,
                                uint16_t* host, DType dtype) override {
    DP_CHECK(dtype == DType::kF16 || dtype == DType::kBf16);
    const int64_t batch = top.shape.at(0);
    return ctx_->DownloadFactorsCastAsync(top.grad, batch, top.count() / batch, blocks, bottom.data, bottom.count(),
                                          window, host, dtype == DType::kBf16);
  }
  void ReleaseInput(Blob* blob) override {
    ctx_->MakeCurrent();
    ctx_->Synchronize();  // queued kernels may still read it
    blob->format.reset();
    blob->data = nullptr;
  }
  void SetThreads(int) override {}  // device parallelism is the GPU's own

  Status CreateLayer(const LayerContext& context, std::unique_ptr<Layer>* layer) override {
    ctx_->MakeCurrent();
    return gpu::CreateCudaLayer(ctx_, context, layer);
  }
  void Synchronize() override { ctx_->Synchronize(); }

  const CudaContext& context() const { return *ctx_; }

 private:
  // Input blobs keep their device storage in the format slot (only this backend reads it); sized
  // to the blob, which it then points at.
  float* InputStorage(Blob* blob) {
    ctx_->MakeCurrent();
    auto* storage = static_cast<DeviceBuffer*>(blob->format.get());
    const size_t bytes = static_cast<size_t>(blob->count()) * sizeof(float);
    if (storage == nullptr || storage->bytes() != bytes) {
      auto owned = std::make_shared<DeviceBuffer>();
      ThrowIfError(owned->Resize(bytes, blob->name.c_str()));
      blob->format = owned;
      storage = owned.get();
    }
    blob->data = storage->floats();
    return blob->data;
  }

  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<gpu::CudaInput> input_;  // byte input, from the first PrepareInput
  std::unordered_set<void*> unpinned_;     // AllocateHost's blocks that could not be page-locked
};

}  // namespace

Status ParseConvAlgoMode(const std::string& text, const std::string& field, ConvAlgoMode* mode) {
  std::string accepted;
  for (const auto& e : kConvAlgoNames) {
    if (text == e.name) {
      *mode = e.mode;
      return Status::Ok();
    }
    accepted += accepted.empty() ? e.name : std::string(", ") + e.name;
  }
  return InvalidArgument("{}: unknown convolution algorithm mode '{}' (one of: {})", field, text, accepted);
}

const char* ConvAlgoModeName(ConvAlgoMode mode) {
  for (const auto& e : kConvAlgoNames)
    if (e.mode == mode) return e.name;
  return "?";
}

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(e), static_cast<int>(e));
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount reports 0 devices";
  return count;
}

void* AllocPinnedHost(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return nullptr;
  }
  return p;
}

void FreePinnedHost(void* p) {
  if (p != nullptr) cudaFreeHost(p);
}

Status CreateCudaBackend(int gpu_id, std::unique_ptr<Backend>* backend) {
  CudaOptions options;
  options.gpu_id = gpu_id;
  return CreateCudaBackend(options, backend);
}

Status CreateCudaBackend(const CudaOptions& options, std::unique_ptr<Backend>* backend) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (count == 0)
    return FailedPrecondition("device gpu:{} was asked but there is no CUDA device: {}", options.gpu_id, why);
  if (options.gpu_id < 0 || options.gpu_id >= count)
    return InvalidArgument("device gpu:{}: no such GPU ({} visible, ordinals 0..{})", options.gpu_id, count,
                           count - 1);
  if (options.workspace_limit_mb < 0)
    return InvalidArgument("workspace_limit_mb {} must be >= 0", options.workspace_limit_mb);
  if (options.upload_chunk_floats <= 0)
    return InvalidArgument("upload_chunk_floats {} must be > 0", options.upload_chunk_floats);
  std::shared_ptr<CudaContext> context;
  DP_RETURN_IF_ERROR(CudaContext::Create(options, &context));
  *backend = std::make_unique<CudaBackend>(std::move(context));
  return Status::Ok();
}

std::vector<ConvAlgoChoice> CudaConvAlgorithms(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda ? cuda->context().conv_choices() : std::vector<ConvAlgoChoice>{};
}

std::string CudaDeviceDescription(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda ? cuda->context().Describe() : std::string("not a CUDA backend");
}

}  // namespace downpour::engine
