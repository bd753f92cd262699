// cuda_backend.h — the GPU backend of the engine: cuDNN for convolution (with groups), LRN,
// pooling, ReLU and softmax; cuBLAS for inner products; small kernels (cuda_kernels.h) for
// dropout, the loss gradient and accuracy. Same layer contract as the CPU backends
// (client/engine/layer.h): activations are dense NCHW device buffers, parameters and their
// gradients are windows into the net's two contiguous device buffers in canonical layout
// (conv OIHW, inner product out×in), so a pull's bytes land in the same order on both.
//
// Transfers (see CudaContext in cuda_context.h):
//  * The net's host mirrors of params/grads are page-locked (cudaHostRegister) on first use,
//    so copies are DMA at full bandwidth and truly asynchronous.
//  * A parameter upload (Net: every step, before forward) is cut into chunks on a copy stream,
//    each with an event; a layer's forward waits only for the chunks holding its own weights,
//    so conv1 starts while fc6's 37.7M floats are still on the bus. The net's uploads
//    (Backend::UploadWeights) do not wait behind the compute already queued: no queued kernel
//    reads the weights being uploaded (the last step ended with a read-back).
//  * Backward computes each layer's weight and bias gradients first and records an event; the
//    download of those gradients (Net → CopyToHostAsync; the grad-ready callback fires once its
//    end event has completed) waits on that event only, on the copy stream, so it overlaps the
//    layer's data-gradient kernels and the layers below, which are queued without waiting.
//  * In 16 bits (Net::SetGradDType / SetWeightDType, a worker's fp16 / bf16 codec): a gradient's
//    download is a cast kernel into the buffer's 16-bit twin and half the bytes, and a weight
//    upload is half the bytes into the twin and a widen kernel, both on the copy stream.
//  * Byte input (gpu/cuda_input.h): uint8 batches on an input stream of their own, a step ahead,
//    normalised by a kernel on the compute stream.
//
// Ownership: the backend owns a shared CudaContext (device, streams, cuDNN/cuBLAS handles,
// the one convolution workspace); layers keep a reference to it. Thread-safety: one thread at
// a time (any thread: every entry point makes the backend's device current).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/engine/layer.h"
#include "common/status.h"

namespace downpour::engine {

// How each convolution's algorithms (forward, backward-data, backward-filter) are chosen.
enum class ConvAlgoMode {
  kSearch,        // default: cuDNN benchmarks every algorithm on the layer's shapes (FindEx)
  kHeuristic,     // cuDNN's heuristics, no benchmarking (GetConvolution*Algorithm_v7)
  kGemm,          // forward GEMM (explicit im2col); backward searched
  kImplicitGemm,  // forward IMPLICIT_PRECOMP_GEMM, backward-data/filter ALGO_1; no workspace-hungry paths
  kFft,           // FFT, then FFT_TILING, in all three passes
  kWinograd,      // WINOGRAD, then WINOGRAD_NONFUSED, in all three passes
};
// "search" | "heuristic" | "gemm" | "implicit_gemm" | "fft" | "winograd"; bad names →
// InvalidArgument naming `field` and the accepted values.
Status ParseConvAlgoMode(const std::string& text, const std::string& field, ConvAlgoMode* mode);
const char* ConvAlgoModeName(ConvAlgoMode mode);

struct CudaOptions {
  int gpu_id = 0;                              // CUDA device ordinal (`--device gpu:N`)
  bool tf32 = true;                            // TF32 tensor cores for fp32 conv/GEMM (default on,
                                               // as PyTorch's cuDNN default); off = exact fp32 FMA
  ConvAlgoMode conv_algo = ConvAlgoMode::kSearch;  // default search, as torch.backends.cudnn.benchmark
  int64_t workspace_limit_mb = 1024;           // largest convolution workspace an algorithm may use
  bool pin_host_mirrors = true;                // page-lock the net's host param/grad mirrors
  int64_t upload_chunk_floats = 1 << 20;       // 4 MiB chunks for the per-layer upload overlap
};

// The explicit factory the engine's CreateBackend calls for DeviceKind::kGpu. No CUDA device,
// or gpu_id out of range → FailedPrecondition / InvalidArgument naming the ordinal and the
// number of devices; never a CPU fallback.
Status CreateCudaBackend(int gpu_id, std::unique_ptr<Backend>* backend);
Status CreateCudaBackend(const CudaOptions& options, std::unique_ptr<Backend>* backend);

// Page-locked (pinned, portable) host memory, for buffers a GPU worker uploads from (the data
// loader's batches): uploads from it are true async DMA. nullptr when cudaHostAlloc fails (no
// driver, no device, out of memory). Free with FreePinnedHost.
void* AllocPinnedHost(size_t bytes);
void FreePinnedHost(void* p);

// Number of CUDA devices visible (0 when there is no driver or device), with the reason in
// `why` when 0. For tests that skip and tools that say why.
int CudaDeviceCount(std::string* why);

// What each convolution layer runs, for timing tables and RESULTS: cuDNN algorithm names,
// the workspace they need, and how they were chosen.
struct ConvAlgoChoice {
  std::string layer;
  std::string forward, backward_data, backward_filter;
  int64_t workspace_bytes = 0;
  std::string how;  // "search", "heuristic", "forced fft", "forced fft unsupported → search", ...
};
// The choices of a CUDA backend's convolution layers so far (empty for other backends).
std::vector<ConvAlgoChoice> CudaConvAlgorithms(const Backend& backend);
// Name, compute capability, memory and library versions of the backend's device.
std::string CudaDeviceDescription(const Backend& backend);

}  // namespace downpour::engine
