// grad_codec.cc — see grad_codec.h.
#include "common/grad_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/finite.h"

namespace downpour {

// ---------------------------------------------------------------------------------------------
// Conversions.

uint16_t FloatToHalf(float f) {
  // Round to nearest even (after F. Giesen's float_to_half_fast3_rtne): normal results by
  // integer rounding of the mantissa, subnormal ones by letting the FPU round an addition.
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: from here on Inf (or NaN)
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= kF16Overflow) {
    // NaN stays NaN, quiet, with the top of its payload (as F16C's vcvtps2ph); else Inf.
    o = x > kF32Inf ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < (113u << 23)) {          // below 2^-14: a half subnormal or zero
    const float r = std::bit_cast<float>(x) + std::bit_cast<float>(kDenormMagic);
    o = std::bit_cast<uint32_t>(r) - kDenormMagic;
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xfffu;  // rebias the exponent, round half up ...
    x += mant_odd;                       // ... or to even on a tie
    o = x >> 13;                         // 65520 and up carry into the exponent: Inf
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  // Inf, or a NaN made quiet with its payload kept (as F16C's vcvtph2ps).
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);  // FLT_MAX and near round up to Inf
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

void FloatsToHalf(std::span<const float> in, uint16_t* out) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= in.size(); i += 8) {
    const __m256 v = _mm256_loadu_ps(in.data() + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < in.size(); ++i) out[i] = FloatToHalf(in[i]);
}

void HalfToFloats(const uint16_t* in, std::span<float> out) {
  HalfBytesToFloats(reinterpret_cast<const std::byte*>(in), out);
}

void HalfBytesToFloats(const std::byte* in, std::span<float> out) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= out.size(); i += 8) {  // unaligned loads: frames need not be aligned
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * sizeof(uint16_t)));
    _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(v));
  }
#endif
  for (; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, in + i * sizeof(uint16_t), sizeof(h));
    out[i] = HalfToFloat(h);
  }
}

void FloatsToBf16(std::span<const float> in, uint16_t* out) {
  for (size_t i = 0; i < in.size(); ++i) {  // FloatToBf16 as a select, so the loop vectorises
    const uint32_t x = std::bit_cast<uint32_t>(in[i]);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t nan = (x >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

void CastFloats(std::span<const float> in, DType dtype, uint16_t* out) {
  DP_CHECK(dtype == DType::kF16 || dtype == DType::kBf16);
  if (dtype == DType::kF16) {
    FloatsToHalf(in, out);
  } else {
    FloatsToBf16(in, out);
  }
}

void WidenTo(const uint16_t* in, DType dtype, std::span<float> out) {
  DP_CHECK(dtype == DType::kF16 || dtype == DType::kBf16);
  if (dtype == DType::kF16) {
    HalfToFloats(in, out);
  } else {
    Bf16ToFloats(in, out);
  }
}

void Bf16ToFloats(const uint16_t* in, std::span<float> out) {
  Bf16BytesToFloats(reinterpret_cast<const std::byte*>(in), out);
}

void Bf16BytesToFloats(const std::byte* in, std::span<float> out) {
  float* o = out.data();
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, in + i * sizeof(uint16_t), sizeof(b));
    const uint32_t v = static_cast<uint32_t>(b) << 16;
    std::memcpy(o + i, &v, sizeof(v));
  }
}

// ---------------------------------------------------------------------------------------------
// Sizes.

size_t TopKCount(double fraction, size_t n) {
  if (n == 0) return 0;
  const double k = std::ceil(fraction * static_cast<double>(n));
  if (!(k >= 1)) return 1;
  return std::min(n, static_cast<size_t>(k));
}

double TopKWarmupFraction(double fraction, uint64_t push, uint64_t warmup) {
  if (warmup == 0 || push >= warmup || fraction >= kTopKWarmupStart) return fraction;
  const double t = static_cast<double>(push) / static_cast<double>(warmup);
  return std::max(fraction, kTopKWarmupStart * std::pow(fraction / kTopKWarmupStart, t));
}

size_t EncodedBytes(Encoding encoding, DType dtype, size_t n, size_t k) {
  switch (encoding) {
    case Encoding::kDense:
      return n * DTypeSize(dtype);
    case Encoding::kTopK:
      return k * (sizeof(uint32_t) + DTypeSize(dtype));
    case Encoding::kOneBit:
      return sizeof(float) + (n + 7) / 8;
    case Encoding::kFactors:
      break;
  }
  return 0;
}

DType CodecDType(WireCodec codec) {
  if (codec == WireCodec::kFp16) return DType::kF16;
  if (codec == WireCodec::kBf16) return DType::kBf16;
  return DType::kF32;
}

Encoding CodecEncoding(WireCodec codec) {
  if (codec == WireCodec::kTopK) return Encoding::kTopK;
  if (codec == WireCodec::kOneBit) return Encoding::kOneBit;
  return Encoding::kDense;
}

// ---------------------------------------------------------------------------------------------
// Encoders.

namespace {

std::byte* Grow(std::vector<std::byte>* out, size_t bytes) {
  const size_t at = out->size();
  out->resize(at + bytes);
  return out->data() + at;
}

// Values of `dtype` from floats, written at `dst` (unaligned).
// Halves are converted through a small aligned block on the stack: frames need not be aligned
// and a chunk-sized temporary would cost an allocation (and its page faults) per chunk.
constexpr size_t kBlock = 4096;

void PutValues(std::span<const float> x, DType dtype, std::byte* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, x.data(), x.size_bytes());
    return;
  }
  uint16_t block[kBlock];
  for (size_t at = 0; at < x.size(); at += kBlock) {
    const auto part = x.subspan(at, std::min(kBlock, x.size() - at));
    if (dtype == DType::kF16) {
      FloatsToHalf(part, block);
    } else {
      FloatsToBf16(part, block);
    }
    std::memcpy(dst + at * sizeof(uint16_t), block, part.size() * sizeof(uint16_t));
  }
}

// Floats from values of `dtype` at `src` (unaligned).
void GetValues(const std::byte* src, DType dtype, std::span<float> out) {
  if (dtype == DType::kF32) {
    std::memcpy(out.data(), src, out.size_bytes());
    return;
  }
  if (dtype == DType::kF16) {
    HalfBytesToFloats(src, out);
  } else {
    Bf16BytesToFloats(src, out);
  }
}

// The k-th largest |x_i| (1 <= k <= n). Exact. For large chunks and small k (the top-k case)
// a strided sample gives a lower bound t0 first, and the selection runs only over the |x_i| >=
// t0: when at least k of them are, the k-th largest of all is among them. Otherwise (an unlucky
// sample) it selects over all n.
float KthLargestMagnitude(std::span<const float> x, size_t k) {
  const size_t n = x.size();
  std::vector<float> pool;
  constexpr size_t kSamples = 8192;
  if (n >= 8 * kSamples && k * 8 <= n) {
    std::vector<float> sample(kSamples);
    const size_t stride = n / kSamples;
    for (size_t j = 0; j < kSamples; ++j) sample[j] = std::fabs(x[j * stride]);
    // About 2k of the n elements expected above t0 (+16 samples of margin).
    const size_t rank = std::min(kSamples - 1, 2 * k * kSamples / n + 16);
    std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank), sample.end(),
                     std::greater<>());
    const float t0 = sample[rank];
    pool.reserve(4 * k);
    for (float v : x) {
      const float a = std::fabs(v);
      if (a >= t0) pool.push_back(a);
    }
    if (pool.size() < k) pool.clear();
  }
  if (pool.empty()) {
    pool.resize(n);
    for (size_t i = 0; i < n; ++i) pool[i] = std::fabs(x[i]);
  }
  std::nth_element(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(k - 1), pool.end(), std::greater<>());
  return pool[k - 1];
}

}  // namespace

void EncodeDense(std::span<const float> x, DType dtype, std::vector<std::byte>* out) {
  PutValues(x, dtype, Grow(out, x.size() * DTypeSize(dtype)));
}

void EncodeTopK(std::span<const float> x, size_t k, DType dtype, std::vector<std::byte>* out) {
  k = std::min(k, x.size());
  // The k-th largest |x| by selection on a copy of the magnitudes (linear, contiguous), not a
  // sort; then one pass in index order takes every |x| above it and the first ties at it, so
  // the indices come out ascending and equal magnitudes go to the lower index (deterministic).
  const float threshold = k > 0 ? KthLargestMagnitude(x, k) : 0.0f;
  size_t above = 0;
  for (float v : x) above += std::fabs(v) > threshold;
  size_t ties = k - above;  // at the threshold, taken lowest index first
  std::vector<uint32_t> idx;
  std::vector<float> values;
  idx.reserve(k);
  values.reserve(k);
  for (size_t i = 0; i < x.size() && idx.size() < k; ++i) {
    const float a = std::fabs(x[i]);
    if (a > threshold || (a == threshold && ties > 0)) {
      if (a == threshold) --ties;
      idx.push_back(static_cast<uint32_t>(i));
      values.push_back(x[i]);
    }
  }
  std::byte* dst = Grow(out, EncodedBytes(Encoding::kTopK, dtype, x.size(), k));
  std::memcpy(dst, idx.data(), k * sizeof(uint32_t));
  PutValues(values, dtype, dst + k * sizeof(uint32_t));
}

void EncodeOneBit(std::span<const float> x, std::vector<std::byte>* out) {
  double sum = 0;
  for (float v : x) sum += std::fabs(v);
  const float scale = x.empty() ? 0.0f : static_cast<float>(sum / static_cast<double>(x.size()));
  std::byte* dst = Grow(out, EncodedBytes(Encoding::kOneBit, DType::kF32, x.size()));
  std::memcpy(dst, &scale, sizeof(float));
  auto* bits = reinterpret_cast<uint8_t*>(dst + sizeof(float));
  const size_t full = x.size() / 8;
  for (size_t b = 0; b < full; ++b) {  // 8 signs per byte (-0 counts as positive)
    unsigned byte = 0;
    for (unsigned j = 0; j < 8; ++j) byte |= static_cast<unsigned>(x[b * 8 + j] < 0) << j;
    bits[b] = static_cast<uint8_t>(byte);
  }
  if (x.size() % 8 != 0) {
    unsigned byte = 0;
    for (size_t i = full * 8; i < x.size(); ++i) byte |= static_cast<unsigned>(x[i] < 0) << (i % 8);
    bits[full] = static_cast<uint8_t>(byte);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoder.

namespace {

Status Refuse(CodecFault* fault, CodecFault kind, Status s) {
  *fault = kind;
  return s;
}

const char* EncodingName(Encoding e) {
  switch (e) {
    case Encoding::kDense:
      return "dense";
    case Encoding::kTopK:
      return "topK";
    case Encoding::kOneBit:
      return "oneBit";
    case Encoding::kFactors:
      return "factors";
  }
  return "?";
}

}  // namespace

int64_t FirstNonFinite(const std::byte* src, DType dtype, size_t n) {
  // Block by block: a branch-free test of the whole block (vectorised), then the index only in
  // a block that has one.
  const size_t size = DTypeSize(dtype);
  const uint32_t inf = dtype == DType::kF32 ? kF32InfBits : dtype == DType::kF16 ? 0x7c00u : 0x7f80u;
  auto magnitude = [&](const std::byte* p, size_t m) -> uint32_t {
    return size == sizeof(uint32_t) ? MaxMagnitudeBits<uint32_t>(p, m) : MaxMagnitudeBits<uint16_t>(p, m);
  };
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    if (magnitude(src + at * size, m) < inf) continue;
    for (size_t i = 0; i < m; ++i) {
      if (magnitude(src + (at + i) * size, 1) >= inf) return static_cast<int64_t>(at + i);
    }
  }
  return -1;
}

Status CheckChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, size_t count, uint32_t chunk_id,
                  CodecFault* fault) {
  *fault = CodecFault::kNone;
  const size_t size = payload.size();
  const size_t vsize = DTypeSize(dtype);
  switch (encoding) {
    case Encoding::kDense: {
      if (size != count * vsize) {
        return Refuse(fault, CodecFault::kLength,
                      InvalidArgument("chunk {}: dense {} frame has {} bytes, {} elements need {}", chunk_id,
                                      DTypeName(dtype), size, count, count * vsize));
      }
      const int64_t bad = FirstNonFinite(payload.data(), dtype, count);
      if (bad >= 0) {
        return Refuse(fault, CodecFault::kNonFinite,
                      InvalidArgument("chunk {}: dense {} element {} is NaN or Inf", chunk_id, DTypeName(dtype), bad));
      }
      return Status::Ok();
    }
    case Encoding::kTopK: {
      const size_t entry = sizeof(uint32_t) + vsize;
      if (size == 0 || size % entry != 0) {
        return Refuse(fault, CodecFault::kLength,
                      InvalidArgument("chunk {}: topK frame of {} bytes is not k >= 1 entries of {} bytes (u32 index + "
                                      "{} value)",
                                      chunk_id, size, entry, DTypeName(dtype)));
      }
      const size_t k = size / entry;
      if (k > count) {
        return Refuse(fault, CodecFault::kIndex,
                      InvalidArgument("chunk {}: topK frame holds k = {} entries, more than the chunk's {} elements",
                                      chunk_id, k, count));
      }
      int64_t prev = -1;
      for (size_t i = 0; i < k; ++i) {
        uint32_t ix;
        std::memcpy(&ix, payload.data() + i * sizeof(uint32_t), sizeof(uint32_t));
        if (ix >= count) {
          return Refuse(
              fault, CodecFault::kIndex,
              InvalidArgument("chunk {}: topK index {} (entry {}) is outside 0..{}", chunk_id, ix, i, count - 1));
        }
        if (static_cast<int64_t>(ix) <= prev) {
          return Refuse(fault, CodecFault::kIndex,
                        InvalidArgument("chunk {}: topK index {} (entry {}) follows {}: indices must be strictly "
                                        "ascending (no duplicates)",
                                        chunk_id, ix, i, prev));
        }
        prev = ix;
      }
      const int64_t bad = FirstNonFinite(payload.data() + k * sizeof(uint32_t), dtype, k);
      if (bad >= 0) {
        return Refuse(fault, CodecFault::kNonFinite,
                      InvalidArgument("chunk {}: topK value of entry {} is NaN or Inf", chunk_id, bad));
      }
      return Status::Ok();
    }
    case Encoding::kOneBit: {
      const size_t want = EncodedBytes(Encoding::kOneBit, dtype, count);
      if (size != want) {
        return Refuse(fault, CodecFault::kLength,
                      InvalidArgument("chunk {}: oneBit frame has {} bytes, {} elements need {} (f32 scale + {} sign "
                                      "bytes)",
                                      chunk_id, size, count, want, (count + 7) / 8));
      }
      float scale;
      std::memcpy(&scale, payload.data(), sizeof(float));
      if (!std::isfinite(scale) || scale < 0) {
        return Refuse(fault, CodecFault::kNonFinite,
                      InvalidArgument("chunk {}: oneBit scale {} must be finite and >= 0", chunk_id, scale));
      }
      if (count % 8 != 0) {
        const auto last = static_cast<uint8_t>(payload[size - 1]);
        if ((last >> (count % 8)) != 0) {
          return Refuse(
              fault, CodecFault::kLength,
              InvalidArgument("chunk {}: oneBit sign bits past element {} are set (must be 0)", chunk_id, count - 1));
        }
      }
      return Status::Ok();
    }
    case Encoding::kFactors:
      break;
  }
  return Refuse(fault, CodecFault::kUnsupported,
                InvalidArgument("chunk {}: encoding {} is not decoded here", chunk_id, EncodingName(encoding)));
}

Status DecodeChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, std::span<float> out,
                   uint32_t chunk_id, CodecFault* fault) {
  DP_RETURN_IF_ERROR(CheckChunk(encoding, dtype, payload, out.size(), chunk_id, fault));
  DecodeCheckedChunk(encoding, dtype, payload, out);
  return Status::Ok();
}

void DecodeCheckedChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, std::span<float> out) {
  switch (encoding) {
    case Encoding::kDense:
      GetValues(payload.data(), dtype, out);
      break;
    case Encoding::kTopK: {
      const size_t k = payload.size() / (sizeof(uint32_t) + DTypeSize(dtype));
      std::vector<uint32_t> idx(k);
      std::vector<float> values(k);
      std::memcpy(idx.data(), payload.data(), k * sizeof(uint32_t));
      GetValues(payload.data() + k * sizeof(uint32_t), dtype, values);
      std::fill(out.begin(), out.end(), 0.0f);
      for (size_t i = 0; i < k; ++i) out[idx[i]] = values[i];
      break;
    }
    case Encoding::kOneBit: {
      float scale;
      std::memcpy(&scale, payload.data(), sizeof(float));
      const auto* bits = reinterpret_cast<const uint8_t*>(payload.data() + sizeof(float));
      const float value[2] = {scale, -scale};
      for (size_t i = 0; i < out.size(); ++i) out[i] = value[(bits[i / 8] >> (i % 8)) & 1u];
      break;
    }
    case Encoding::kFactors:
      break;  // refused by CheckChunk
  }
}

// ---------------------------------------------------------------------------------------------
// ChunkEncoder.

void ChunkEncoder::Encode(uint32_t chunk_id, std::span<const float> g, EncodedChunk* out) {
  out->bytes.clear();
  const WireCodec codec = settings_.push;
  const DType dtype = CodecDType(codec);
  const size_t n = g.size();
  if (!AllFinite(g)) {  // the server refuses it as it is; the residual stays clean
    out->encoding = Encoding::kDense;
    EncodeDense(g, dtype, &out->bytes);
    return;
  }
  if (codec != WireCodec::kTopK && codec != WireCodec::kOneBit) {  // fp32 / fp16 / bf16: no residual
    out->encoding = Encoding::kDense;
    EncodeDense(g, dtype, &out->bytes);
    return;
  }
  const bool ef = settings_.error_feedback;
  std::span<const float> x = g;
  std::vector<float>* r = nullptr;
  if (ef) {
    r = &residual_[chunk_id];
    r->resize(n, 0.0f);  // a first encode: zero residual
    work_.resize(n);
    for (size_t i = 0; i < n; ++i) work_[i] = g[i] + (*r)[i];
    x = work_;
  }
  size_t k = 0;
  if (codec == WireCodec::kTopK) {
    const auto warmup = static_cast<uint64_t>(std::max<int64_t>(0, settings_.top_k_warmup_pushes));
    const uint64_t push = warmup > 0 ? pushes_[chunk_id]++ : 0;
    k = TopKCount(TopKWarmupFraction(settings_.top_k_fraction, push, warmup), n);
  }
  if (codec == WireCodec::kTopK && 2 * k >= n) {  // indices + values cost as much as dense f32
    out->encoding = Encoding::kDense;
    EncodeDense(x, dtype, &out->bytes);  // topk values are f32
    if (r) std::fill(r->begin(), r->end(), 0.0f);
    return;
  }
  if (codec == WireCodec::kTopK) {
    out->encoding = Encoding::kTopK;
    EncodeTopK(x, k, dtype, &out->bytes);
  } else {
    out->encoding = Encoding::kOneBit;
    EncodeOneBit(x, &out->bytes);
  }
  if (!r) return;
  // r = g' - decode(C(g')): exactly what the receiver will add, so nothing is lost or doubled.
  decoded_.resize(n);
  CodecFault fault;
  const Status s = DecodeChunk(out->encoding, dtype, out->bytes, decoded_, chunk_id, &fault);
  if (!s.ok()) {  // g' overflowed to Inf (|g'| near FLT_MAX): send g as it is, as above
    out->encoding = Encoding::kDense;
    out->bytes.clear();
    EncodeDense(g, dtype, &out->bytes);
    return;
  }
  for (size_t i = 0; i < n; ++i) (*r)[i] = work_[i] - decoded_[i];
}

std::span<const float> ChunkEncoder::residual(uint32_t chunk_id) const {
  auto it = residual_.find(chunk_id);
  if (it == residual_.end()) return {};
  return it->second;
}

}  // namespace downpour
