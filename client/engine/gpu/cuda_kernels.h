// cuda_kernels.h — the few layer pieces that are small CUDA kernels rather than cuDNN/cuBLAS
// calls: the seeded dropout mask (bit-identical to fillers.h DropoutMask, so the GPU and CPU
// drop the same units), softmax cross-entropy loss and its gradient from cuDNN's probabilities,
// top-k accuracy, and Caffe's max and average pooling for shapes cuDNN cannot express
// (ceil-rounded output size; max with padding), max with an argmax so backward routes each
// gradient exactly as the reference.
//
// Every launcher is asynchronous on `stream`; pointers are device memory; it returns the
// launch's cudaError_t (callers wrap it in DP_CUDA_THROW, which names the launcher). This file
// and the .cu include no project headers, so nvcc compiles only the kernels. Shapes are given
// per function.
// Thread-safety: stateless.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace downpour::engine::gpu {

// mask (n) = 0 with probability ratio else 1/(1-ratio), from CounterUniform(seed, step, i);
// y = x * mask.
cudaError_t DropoutForward(cudaStream_t stream, int64_t n, uint64_t seed, uint64_t step, float ratio,
                    const float* x, float* mask, float* y);
// dx = dy * mask.
cudaError_t DropoutBackward(cudaStream_t stream, int64_t n, const float* mask, const float* dy, float* dx);

// prob (N,K) softmax rows, labels (N) float class ids → *loss = mean_i -log(max(p[i,l_i], FLT_MIN)).
cudaError_t SoftmaxLossForward(cudaStream_t stream, int n, int k, const float* prob, const float* labels,
                        float* loss);
// dx (N,K) = (prob - onehot(label)) / N.
cudaError_t SoftmaxLossBackward(cudaStream_t stream, int n, int k, const float* prob, const float* labels,
                         float* dx);

// scores (N,K), labels (N) → *accuracy = fraction of rows with fewer than top_k scores
// strictly above the label's (Caffe's tie rule).
cudaError_t Accuracy(cudaStream_t stream, int n, int k, const float* scores, const float* labels,
              int top_k, float* accuracy);

struct PoolShape {
  int n, c, h, w;           // input (N,C,H,W)
  int kh, kw, sh, sw, ph, pw;
  int ho, wo;               // output (Caffe's ceil rule, clipped)
};
// y (N,C,Ho,Wo) = max over each window clipped to the input; argmax (N,C,Ho,Wo) = flat
// input index of the first maximum (row-major scan, strict >), as ref::MaxPoolForward.
cudaError_t MaxPoolForward(cudaStream_t stream, const PoolShape& s, const float* x, float* y, int* argmax);
// dx (N,C,H,W) = sum of dy over the outputs whose argmax is that input (a gather: no atomics,
// deterministic).
cudaError_t MaxPoolBackward(cudaStream_t stream, const PoolShape& s, const int* argmax, const float* dy,
                     float* dx);

// Caffe's AVE (as ref::AvePoolForward): y (N,C,Ho,Wo) = sum over the window clipped to the
// input / pool_size, pool_size = the window's size within [-ph, h+ph) × [-pw, w+pw) (the zero
// padding counts, the ceil overhang does not).
cudaError_t AvePoolForward(cudaStream_t stream, const PoolShape& s, const float* x, float* y);
// dx (N,C,H,W) = sum of dy / pool_size over the outputs whose window contains that input (a
// gather: no atomics, deterministic).
cudaError_t AvePoolBackward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx);

// The byte input's normalisation (common/byte_batch.h, the host's arithmetic bit for bit): out
// (N,C,H,W) from pixels (N,C,H,W bytes, crop windows in the record's orientation) and windows
// (N × 5 int32: y0, x0, record_h, record_w, mirror); mean_image (C, mean_h, mean_w) or null, else
// mean_values (mean_values_count = 1 or C) or null.
cudaError_t NormalizeBytes(cudaStream_t stream, int n, int c, int h, int w, const uint8_t* pixels,
                           const int32_t* windows, const float* mean_image, int mean_h, int mean_w,
                           const float* mean_values, int mean_values_count, float scale, float* out);

// out[0..n) = in cast to IEEE half (bf16 false) or bfloat16, rounded as common/grad_codec.h's
// host conversion bit for bit.
cudaError_t CastTo16(cudaStream_t stream, int64_t n, bool bf16, const float* in, uint16_t* out);

// out[0..n) = in widened from IEEE half (bf16 false) or bfloat16 to f32, exactly (the host's
// HalfToFloats / Bf16ToFloats).
cudaError_t WidenFrom16(cudaStream_t stream, int64_t n, bool bf16, const uint16_t* in, float* out);

// Row blocks of a batch × width matrix, packed one after another (common/layout.h's
// PackRowBlocks, the host's layout: block k holds in[b·width + first[k] + j] at out[at[k] +
// b·rows[k] + j]); at most kMaxPackBlocks a launch, passed by value.
constexpr int kMaxPackBlocks = 64;
struct PackBlocks {
  int count = 0;
  int64_t first[kMaxPackBlocks];
  int64_t rows[kMaxPackBlocks];
  int64_t at[kMaxPackBlocks];
};
// The launches for blocks (first[i], rows[i]), i < n, in order: kMaxPackBlocks at a time, each
// block's `at` counted from the first (host code, so that a test without a GPU checks the plan).
std::vector<PackBlocks> PlanPackLaunches(int64_t batch, const int64_t* first, const int64_t* rows, size_t n);
// One float of a launch: row b of block k, column j < rows[k]. The kernel runs it for every
// (b, k, j); a host test does the same.
#ifdef __CUDACC__
__host__ __device__
#endif
    inline void
    PackOneFloat(int64_t b, int k, int64_t j, int64_t width, const PackBlocks& blocks, const float* in, float* out) {
  out[blocks.at[k] + b * blocks.rows[k] + j] = in[b * width + blocks.first[k] + j];
}
cudaError_t PackRowBlocksOnDevice(cudaStream_t stream, int64_t batch, int64_t width, const PackBlocks& blocks,
                                  const float* in, float* out);

// ptr[0..n) = value.
cudaError_t Fill(cudaStream_t stream, int64_t n, float value, float* ptr);

}  // namespace downpour::engine::gpu
