// cuda_input.cc — see cuda_input.h.
#include "client/engine/gpu/cuda_input.h"

#include "client/engine/gpu/cuda_check.h"
#include "client/engine/gpu/cuda_kernels.h"

namespace downpour::engine::gpu {

static_assert(sizeof(CropWindow) == 5 * sizeof(int32_t), "the kernel reads a window as 5 int32");

CudaInput::~CudaInput() {
  ctx_->MakeCurrent();
  if (stream_) cudaStreamSynchronize(stream_);
  for (Slot& s : slots_) {
    if (s.landed) cudaEventDestroy(s.landed);
    if (s.consumed) cudaEventDestroy(s.consumed);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaInput::Init() {
  if (stream_ != nullptr) return Status::Ok();
  DP_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (Slot& s : slots_) {
    DP_CUDA_RETURN(cudaEventCreateWithFlags(&s.landed, cudaEventDisableTiming));
    DP_CUDA_RETURN(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
  }
  return Status::Ok();
}

Status CudaInput::Prepare(const InputNormalization& norm, int batch) {
  ctx_->MakeCurrent();
  DP_RETURN_IF_ERROR(Init());
  // Nothing queued reads the old buffers once both streams are idle.
  ctx_->Synchronize();
  DP_CUDA_RETURN(cudaStreamSynchronize(stream_));
  norm_ = norm;
  DP_RETURN_IF_ERROR(mean_image_.Resize(norm.mean_image.size() * sizeof(float), "the input's mean image"));
  DP_RETURN_IF_ERROR(mean_values_.Resize(norm.mean_values.size() * sizeof(float), "the input's mean values"));
  if (!norm.mean_image.empty())
    DP_CUDA_RETURN(cudaMemcpy(mean_image_.get(), norm.mean_image.data(), mean_image_.bytes(), cudaMemcpyHostToDevice));
  if (!norm.mean_values.empty())
    DP_CUDA_RETURN(
        cudaMemcpy(mean_values_.get(), norm.mean_values.data(), mean_values_.bytes(), cudaMemcpyHostToDevice));
  // A copy from pageable memory may return before its DMA lands, and the streams do not wait
  // for the legacy stream it ran on (they are non-blocking): the first normalisation must.
  DP_CUDA_RETURN(cudaDeviceSynchronize());
  staged_ = -1;
  for (Slot& s : slots_) {
    DP_RETURN_IF_ERROR(s.pixels.Resize(static_cast<size_t>(int64_t{batch} * norm.image_bytes()),
                                       "a staged input batch (two are kept)"));
    DP_RETURN_IF_ERROR(s.windows.Resize(static_cast<size_t>(batch) * sizeof(CropWindow), "a staged batch's windows"));
  }
  return Status::Ok();
}

void CudaInput::Stage(const ByteBatch& batch) {
  DP_CHECK(stream_ != nullptr);  // Prepare came first
  const int k = last_read_ == 0 ? 1 : 0;
  Slot& s = slots_[k];
  ctx_->MakeCurrent();
  const size_t pixel_bytes = static_cast<size_t>(int64_t{batch.n} * norm_.image_bytes());
  const size_t window_bytes = static_cast<size_t>(batch.n) * sizeof(CropWindow);
  // The kernel that read this slot's previous batch must have run before its bytes change (an
  // event never recorded is no wait: cudaStreamWaitEvent then does nothing).
  DP_CUDA_THROW(cudaStreamWaitEvent(stream_, s.consumed, 0));
  if (s.pixels.bytes() < pixel_bytes || s.windows.bytes() < window_bytes) {
    DP_CUDA_THROW(cudaStreamSynchronize(stream_));
    ThrowIfError(s.pixels.Resize(pixel_bytes, "a staged input batch (two are kept)"));
    ThrowIfError(s.windows.Resize(window_bytes, "a staged batch's windows"));
  }
  DP_CUDA_THROW(cudaMemcpyAsync(s.pixels.get(), batch.pixels, pixel_bytes, cudaMemcpyHostToDevice, stream_));
  DP_CUDA_THROW(cudaMemcpyAsync(s.windows.get(), batch.windows, window_bytes, cudaMemcpyHostToDevice, stream_));
  DP_CUDA_THROW(cudaEventRecord(s.landed, stream_));
  s.source = batch.pixels;
  staged_ = k;
}

void CudaInput::Normalize(const ByteBatch& batch, float* out) {
  if (staged_ < 0 || slots_[staged_].source != batch.pixels) Stage(batch);
  Slot& s = slots_[staged_];
  ctx_->MakeCurrent();
  DP_CUDA_THROW(cudaStreamWaitEvent(ctx_->stream(), s.landed, 0));
  DP_CUDA_THROW(NormalizeBytes(
      ctx_->stream(), batch.n, norm_.channels, norm_.height, norm_.width, static_cast<const uint8_t*>(s.pixels.get()),
      static_cast<const int32_t*>(s.windows.get()), norm_.mean_image.empty() ? nullptr : mean_image_.floats(),
      norm_.mean_h, norm_.mean_w, norm_.mean_values.empty() ? nullptr : mean_values_.floats(),
      static_cast<int>(norm_.mean_values.size()), norm_.scale, out));
  DP_CUDA_THROW(cudaEventRecord(s.consumed, ctx_->stream()));
  last_read_ = staged_;
  staged_ = -1;
}

}  // namespace downpour::engine::gpu
