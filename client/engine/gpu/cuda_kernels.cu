// cuda_kernels.cu — see cuda_kernels.h. Kept small: nvcc is the slow part of the build.
#include "client/engine/gpu/cuda_kernels.h"

#include <cfloat>

namespace downpour::engine::gpu {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// Must match fillers.h SplitMix64 / CounterUniform bit for bit (the agreement tests check it
// through dropout layers).
__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ float CounterUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = SplitMix64(SplitMix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

__global__ void DropoutForwardKernel(int64_t n, uint64_t seed, uint64_t step, float ratio,
                                     float keep_scale, const float* x, float* mask, float* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float m = CounterUniform(seed, step, static_cast<uint64_t>(i)) < ratio ? 0.0f : keep_scale;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void MulKernel(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] * b[i];
}

__global__ void FillKernel(int64_t n, float value, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

// Block-wide sum over kThreads threads; the result is valid in thread 0.
__device__ double BlockSum(double v) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  return partial[0];
}

// One block: the batch is at most a few thousand rows, the sum is done in double.
__global__ void SoftmaxLossKernel(int n, int k, const float* prob, const float* labels, float* loss) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int l = static_cast<int>(labels[i]);
    sum -= log(fmax(static_cast<double>(prob[int64_t(i) * k + l]), static_cast<double>(FLT_MIN)));
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) *loss = static_cast<float>(total / n);
}

__global__ void SoftmaxLossBackwardKernel(int n, int k, const float* prob, const float* labels,
                                          float* dx) {
  const int64_t total = int64_t(n) * k;
  const float inv_n = 1.0f / n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / k), col = static_cast<int>(i % k);
    dx[i] = (prob[i] - (col == static_cast<int>(labels[row]) ? 1.0f : 0.0f)) * inv_n;
  }
}

__global__ void AccuracyKernel(int n, int k, const float* scores, const float* labels, int top_k,
                               float* accuracy) {
  double correct = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float* row = scores + int64_t(i) * k;
    const float label_score = row[static_cast<int>(labels[i])];
    int better = 0;
    for (int j = 0; j < k; ++j) better += !(row[j] <= label_score);  // a NaN ranks above: never correct
    correct += better < top_k ? 1.0 : 0.0;
  }
  const double total = BlockSum(correct);
  if (threadIdx.x == 0) *accuracy = static_cast<float>(total / n);
}

__global__ void MaxPoolForwardKernel(PoolShape s, const float* x, float* y, int* argmax) {
  const int64_t total = int64_t(s.n) * s.c * s.ho * s.wo;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int ow = o % s.wo, oh = (o / s.wo) % s.ho;
    const int64_t nc = o / (int64_t(s.wo) * s.ho);
    const int hs = max(oh * s.sh - s.ph, 0), ws = max(ow * s.sw - s.pw, 0);
    const int he = min(oh * s.sh - s.ph + s.kh, s.h), we = min(ow * s.sw - s.pw + s.kw, s.w);
    const int64_t base = nc * s.h * s.w;
    float best = -FLT_MAX;
    int best_i = -1;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) {
        const int i = ih * s.w + iw;
        if (x[base + i] > best) { best = x[base + i]; best_i = i; }
      }
    y[o] = best;
    argmax[o] = best_i;  // index within the (h,w) plane; -1 for an empty window
  }
}

// For input (ih, iw), the outputs whose window can contain it: oh in
// [ceil((ih+ph-kh+1)/sh), floor((ih+ph)/sh)] clipped to [0, ho).
__global__ void MaxPoolBackwardKernel(PoolShape s, const int* argmax, const float* dy, float* dx) {
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int iw = i % s.w, ih = (i / s.w) % s.h;
    const int64_t nc = i / (int64_t(s.w) * s.h);
    const int plane_i = ih * s.w + iw;
    const int oh0 = ih + s.ph < s.kh ? 0 : (ih + s.ph - s.kh) / s.sh + 1;
    const int ow0 = iw + s.pw < s.kw ? 0 : (iw + s.pw - s.kw) / s.sw + 1;
    const int oh1 = min((ih + s.ph) / s.sh + 1, s.ho), ow1 = min((iw + s.pw) / s.sw + 1, s.wo);
    const int64_t obase = nc * s.ho * s.wo;
    float sum = 0.0f;
    for (int oh = oh0; oh < oh1; ++oh)
      for (int ow = ow0; ow < ow1; ++ow) {
        const int64_t o = obase + int64_t(oh) * s.wo + ow;
        if (argmax[o] == plane_i) sum += dy[o];
      }
    dx[i] = sum;
  }
}

// Caffe's AVE window of output (oh, ow): the divisor is counted over the padded input before
// the window is clipped to the image.
struct AveWindow {
  int hs, he, ws, we, pool_size;
};
__device__ AveWindow AveWindowAt(const PoolShape& s, int oh, int ow) {
  int hs = oh * s.sh - s.ph, ws = ow * s.sw - s.pw;
  int he = min(hs + s.kh, s.h + s.ph), we = min(ws + s.kw, s.w + s.pw);
  const int pool_size = (he - hs) * (we - ws);
  return {max(hs, 0), min(he, s.h), max(ws, 0), min(we, s.w), pool_size};
}

__global__ void AvePoolForwardKernel(PoolShape s, const float* x, float* y) {
  const int64_t total = int64_t(s.n) * s.c * s.ho * s.wo;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    const int ow = o % s.wo, oh = (o / s.wo) % s.ho;
    const int64_t nc = o / (int64_t(s.wo) * s.ho);
    const AveWindow win = AveWindowAt(s, oh, ow);
    const float* plane = x + nc * s.h * s.w;
    float sum = 0.0f;
    for (int ih = win.hs; ih < win.he; ++ih)
      for (int iw = win.ws; iw < win.we; ++iw) sum += plane[ih * s.w + iw];
    y[o] = sum / win.pool_size;
  }
}

// For input (ih, iw), the outputs whose (unclipped) window contains it: oh in
// [ceil((ih+ph-kh+1)/sh), floor((ih+ph)/sh)] clipped to [0, ho); an input inside the image is
// in the clipped window exactly when it is in the unclipped one.
__global__ void AvePoolBackwardKernel(PoolShape s, const float* dy, float* dx) {
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int iw = i % s.w, ih = (i / s.w) % s.h;
    const int64_t nc = i / (int64_t(s.w) * s.h);
    const int oh0 = ih + s.ph < s.kh ? 0 : (ih + s.ph - s.kh) / s.sh + 1;
    const int ow0 = iw + s.pw < s.kw ? 0 : (iw + s.pw - s.kw) / s.sw + 1;
    const int oh1 = min((ih + s.ph) / s.sh + 1, s.ho), ow1 = min((iw + s.pw) / s.sw + 1, s.wo);
    const float* dplane = dy + nc * s.ho * s.wo;
    float sum = 0.0f;
    for (int oh = oh0; oh < oh1; ++oh)
      for (int ow = ow0; ow < ow1; ++ow) sum += dplane[oh * s.wo + ow] / AveWindowAt(s, oh, ow).pool_size;
    dx[i] = sum;
  }
}

}  // namespace

cudaError_t DropoutForward(cudaStream_t stream, int64_t n, uint64_t seed, uint64_t step, float ratio,
                           const float* x, float* mask, float* y) {
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(n, seed, step, ratio,
                                                           1.0f / (1.0f - ratio), x, mask, y);
  return cudaGetLastError();
}

cudaError_t DropoutBackward(cudaStream_t stream, int64_t n, const float* mask, const float* dy,
                            float* dx) {
  MulKernel<<<Blocks(n), kThreads, 0, stream>>>(n, dy, mask, dx);
  return cudaGetLastError();
}

cudaError_t SoftmaxLossForward(cudaStream_t stream, int n, int k, const float* prob,
                               const float* labels, float* loss) {
  SoftmaxLossKernel<<<1, kThreads, 0, stream>>>(n, k, prob, labels, loss);
  return cudaGetLastError();
}

cudaError_t SoftmaxLossBackward(cudaStream_t stream, int n, int k, const float* prob,
                                const float* labels, float* dx) {
  SoftmaxLossBackwardKernel<<<Blocks(int64_t(n) * k), kThreads, 0, stream>>>(n, k, prob, labels, dx);
  return cudaGetLastError();
}

cudaError_t Accuracy(cudaStream_t stream, int n, int k, const float* scores, const float* labels,
                     int top_k, float* accuracy) {
  AccuracyKernel<<<1, kThreads, 0, stream>>>(n, k, scores, labels, top_k, accuracy);
  return cudaGetLastError();
}

cudaError_t MaxPoolForward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                           int* argmax) {
  MaxPoolForwardKernel<<<Blocks(int64_t(s.n) * s.c * s.ho * s.wo), kThreads, 0, stream>>>(s, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t MaxPoolBackward(cudaStream_t stream, const PoolShape& s, const int* argmax,
                            const float* dy, float* dx) {
  MaxPoolBackwardKernel<<<Blocks(int64_t(s.n) * s.c * s.h * s.w), kThreads, 0, stream>>>(s, argmax, dy, dx);
  return cudaGetLastError();
}

cudaError_t AvePoolForward(cudaStream_t stream, const PoolShape& s, const float* x, float* y) {
  AvePoolForwardKernel<<<Blocks(int64_t(s.n) * s.c * s.ho * s.wo), kThreads, 0, stream>>>(s, x, y);
  return cudaGetLastError();
}

cudaError_t AvePoolBackward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx) {
  AvePoolBackwardKernel<<<Blocks(int64_t(s.n) * s.c * s.h * s.w), kThreads, 0, stream>>>(s, dy, dx);
  return cudaGetLastError();
}

__global__ void NormalizeBytesKernel(int64_t total, int c, int h, int w, const uint8_t* pixels, const int32_t* windows,
                                     const float* mean_image, int mean_h, int mean_w, const float* mean_values,
                                     int mean_values_count, float scale, float* out) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(idx % w);
    const int y = static_cast<int>((idx / w) % h);
    const int ch = static_cast<int>((idx / (int64_t(w) * h)) % c);
    const int64_t i = idx / (int64_t(w) * h * c);
    const int32_t* win = windows + 5 * i;  // y0, x0, record_h, record_w, mirror
    const int xs = win[4] ? w - 1 - x : x;
    const int sy = win[0] + y, sx = win[1] + xs;
    if (sy < 0 || sy >= win[2] || sx < 0 || sx >= win[3]) {
      out[idx] = 0.0f;
      continue;
    }
    const float m = mean_image != nullptr    ? mean_image[(int64_t(ch) * mean_h + sy) * mean_w + sx]
                    : mean_values != nullptr ? mean_values[mean_values_count == 1 ? 0 : ch]
                                             : 0.0f;
    const float p = static_cast<float>(pixels[idx - x + xs]);
    // Rounded as the host's (p - m) * scale, never contracted into an FMA.
    out[idx] = __fmul_rn(__fsub_rn(p, m), scale);
  }
}

cudaError_t NormalizeBytes(cudaStream_t stream, int n, int c, int h, int w, const uint8_t* pixels,
                           const int32_t* windows, const float* mean_image, int mean_h, int mean_w,
                           const float* mean_values, int mean_values_count, float scale, float* out) {
  const int64_t total = int64_t(n) * c * h * w;
  NormalizeBytesKernel<<<Blocks(total), kThreads, 0, stream>>>(total, c, h, w, pixels, windows, mean_image, mean_h,
                                                               mean_w, mean_values, mean_values_count, scale, out);
  return cudaGetLastError();
}

// common/grad_codec.cc's FloatToHalf and FloatsToBf16, bit for bit (a NaN keeps its sign and the top
// of its payload, made quiet, as F16C does; not CUDA's canonical NaN), so a push cast here equals
// one the host encoder would send.
__device__ uint16_t HalfOf(float f) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t x = __float_as_uint(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= kF16Overflow) {
    o = x > kF32Inf ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;  // quiet NaN, payload kept
  } else if (x < (113u << 23)) {
    const float r = __fadd_rn(__uint_as_float(x), __uint_as_float(kDenormMagic));
    o = __float_as_uint(r) - kDenormMagic;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xfffu;
    x += mant_odd;
    o = x >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}
__device__ uint16_t Bf16Of(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

__global__ void CastKernel(int64_t n, bool bf16, const float* in, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16 ? Bf16Of(in[i]) : HalfOf(in[i]);
}

cudaError_t CastTo16(cudaStream_t stream, int64_t n, bool bf16, const float* in, uint16_t* out) {
  CastKernel<<<Blocks(n), kThreads, 0, stream>>>(n, bf16, in, out);
  return cudaGetLastError();
}

// common/grad_codec.cc's HalfToFloat (exact; every half is a float) and Bf16ToFloat (the high half).
__device__ float FloatOfHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;  // zero or subnormal, exact
    return sign != 0 ? -v : v;
  }
  if (exp == 31)
    return __uint_as_float(sign | 0x7f800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));  // Inf / quiet NaN
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__global__ void WidenKernel(int64_t n, bool bf16, const uint16_t* in, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16 ? __uint_as_float(static_cast<uint32_t>(in[i]) << 16) : FloatOfHalf(in[i]);
}

cudaError_t WidenFrom16(cudaStream_t stream, int64_t n, bool bf16, const uint16_t* in, float* out) {
  WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(n, bf16, in, out);
  return cudaGetLastError();
}

// One thread block per (batch row b = blockIdx.x, block k = blockIdx.y): a plain copy, so the
// packed floats are the host's bit for bit.
__global__ void PackRowBlocksKernel(int64_t width, PackBlocks blocks, const float* in, float* out) {
  const int64_t b = blockIdx.x;
  const int k = static_cast<int>(blockIdx.y);
  for (int64_t j = threadIdx.x; j < blocks.rows[k]; j += blockDim.x) PackOneFloat(b, k, j, width, blocks, in, out);
}

std::vector<PackBlocks> PlanPackLaunches(int64_t batch, const int64_t* first, const int64_t* rows, size_t n) {
  std::vector<PackBlocks> launches;
  int64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    if (launches.empty() || launches.back().count == kMaxPackBlocks) launches.emplace_back();
    PackBlocks& g = launches.back();
    g.first[g.count] = first[i];
    g.rows[g.count] = rows[i];
    g.at[g.count] = at;
    ++g.count;
    at += batch * rows[i];
  }
  return launches;
}

cudaError_t PackRowBlocksOnDevice(cudaStream_t stream, int64_t batch, int64_t width, const PackBlocks& blocks,
                                  const float* in, float* out) {
  if (batch <= 0 || blocks.count <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(blocks.count));
  PackRowBlocksKernel<<<grid, kThreads, 0, stream>>>(width, blocks, in, out);
  return cudaGetLastError();
}

cudaError_t Fill(cudaStream_t stream, int64_t n, float value, float* ptr) {
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(n, value, ptr);
  return cudaGetLastError();
}

}  // namespace downpour::engine::gpu
