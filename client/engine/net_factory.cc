// net_factory.cc — the explicit backend choice (STYLE.md §9): no registration, no fallback.
#include "client/engine/net.h"
#include "client/engine/onednn_backend.h"
#include "client/engine/reference_backend.h"
#include "downpour_config.h"

#if DOWNPOUR_HAVE_CUDA
#include "client/engine/gpu/cuda_backend.h"  // CudaOptions, CreateCudaBackend
#endif

namespace downpour::engine {

Status CreateBackend(const NetOptions& options, std::unique_ptr<Backend>* backend) {
  switch (options.worker.device) {
    case DeviceKind::kCpu:
      *backend = options.reference ? MakeReferenceBackend() : MakeOneDnnBackend();
      return Status::Ok();
    case DeviceKind::kGpu:
      if (options.reference)
        return InvalidArgument("the reference backend runs on the CPU only (device gpu was asked)");
#if DOWNPOUR_HAVE_CUDA
    {
      CudaOptions cuda;
      cuda.gpu_id = options.worker.gpu_index;
      cuda.tf32 = options.worker.tf32;
      DP_RETURN_IF_ERROR(ParseConvAlgoMode(options.worker.conv_algo, "conv_algo", &cuda.conv_algo));
      return CreateCudaBackend(cuda, backend);
    }
#else
      return FailedPrecondition(
          "device gpu was asked but this build has no CUDA backend (CUDA/cuDNN not found at configure time)");
#endif
  }
  return InvalidArgument("unknown device kind {}", static_cast<int>(options.worker.device));
}

HostAllocator HostAllocatorFor(DeviceKind device) {
  HostAllocator a;
#if DOWNPOUR_HAVE_CUDA
  if (device == DeviceKind::kGpu) {
    a.allocate = AllocPinnedHost;
    a.deallocate = FreePinnedHost;
  }
#else
  (void)device;
#endif
  return a;
}

Status Net::Create(const NetSpec& spec, const NetOptions& options, std::unique_ptr<Net>* net) {
  std::unique_ptr<Backend> backend;
  DP_RETURN_IF_ERROR(CreateBackend(options, &backend));
  return CreateWithBackend(spec, options, std::move(backend), net);
}

}  // namespace downpour::engine
