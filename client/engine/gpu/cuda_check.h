// cuda_check.h — turning CUDA runtime, cuDNN and cuBLAS return codes into downpour errors,
// each naming the call that failed and the library's own error string.
//
//  * DP_CUDA_RETURN(call) / DP_CUDNN_RETURN / DP_CUBLAS_RETURN: in functions returning Status
//    (backend creation, Reshape): a failure is returned as a Status (e.g. out of memory).
//  * DP_CUDA_THROW(call) / DP_CUDNN_THROW / DP_CUBLAS_THROW: inside Forward / Backward / copies,
//    whose signatures return void: a failure throws downpour::Error carrying the same message,
//    so the caller (training loop, test) sees which call failed instead of a silent bad step.
//
// Thread-safety: stateless helpers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "common/status.h"

namespace downpour::engine::gpu {

inline Status CudaError(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // clear the sticky-free error so later calls are not blamed for it
  return Internal("{}:{}: {} failed: {} ({})", file, line, call, cudaGetErrorString(e), static_cast<int>(e));
}
inline Status CudnnError(cudnnStatus_t e, const char* call, const char* file, int line) {
  if (e == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Internal("{}:{}: {} failed: {} ({})", file, line, call, cudnnGetErrorString(e), static_cast<int>(e));
}
inline Status CublasError(cublasStatus_t e, const char* call, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal("{}:{}: {} failed: {} ({})", file, line, call, cublasGetStatusString(e), static_cast<int>(e));
}

}  // namespace downpour::engine::gpu

#define DP_CUDA_RETURN(call) \
  DP_RETURN_IF_ERROR(::downpour::engine::gpu::CudaError((call), #call, __FILE__, __LINE__))
#define DP_CUDNN_RETURN(call) \
  DP_RETURN_IF_ERROR(::downpour::engine::gpu::CudnnError((call), #call, __FILE__, __LINE__))
#define DP_CUBLAS_RETURN(call) \
  DP_RETURN_IF_ERROR(::downpour::engine::gpu::CublasError((call), #call, __FILE__, __LINE__))

#define DP_CUDA_THROW(call) \
  ::downpour::ThrowIfError(::downpour::engine::gpu::CudaError((call), #call, __FILE__, __LINE__))
#define DP_CUDNN_THROW(call) \
  ::downpour::ThrowIfError(::downpour::engine::gpu::CudnnError((call), #call, __FILE__, __LINE__))
#define DP_CUBLAS_THROW(call) \
  ::downpour::ThrowIfError(::downpour::engine::gpu::CublasError((call), #call, __FILE__, __LINE__))
