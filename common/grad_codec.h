// grad_codec.h — the lossy wire codecs of a payload chunk (common/messages.capnp, Encoding):
// fp16 / bf16 conversion, top-k and 1-bit sign with error feedback (ChunkEncoder), and the one
// decoder both ends use (DecodeChunk), which validates a frame whole before writing a float.
//
// Byte formats of one chunk of `count` floats (little-endian, the machine's order):
//   dense   count elements of the message's dtype (f32: 4 bytes, f16 / bf16: 2 bytes)
//   topK    k uint32 indices, strictly ascending and < count, then k values of dtype
//           (k is the frame length / (4 + dtype size); 1 <= k <= count)
//   oneBit  one f32 scale (finite, >= 0), then ceil(count/8) bytes of sign bits, element i in
//           bit (i % 8) of byte i / 8, 1 = negative; the unused high bits of the last byte are 0
//
// Round-trip bounds (x = the f32 sent, y = what the receiver decodes):
//   f32 dense  exact.
//   f16 dense  |y - x| <= 2^-11 |x| for |x| in the normal half range [2^-14, 65504]; below it
//              |y - x| <= 2^-25 (subnormal spacing / 2); |x| > 65504 (after rounding) becomes
//              ±Inf, which the decoder refuses as non-finite. Round to nearest even.
//   bf16 dense |y - x| <= 2^-8 |x| for normal x (f32's range, so no overflow below FLT_MAX
//              rounding up); NaN stays NaN (quieted). Round to nearest even.
//   topK       exact on the k kept entries (values in f32), 0 elsewhere.
//   oneBit     y = scale * (x_i < 0 ? -1 : +1) exactly, scale = mean |x| (EF-SGD's scaled sign).
// With error feedback (ChunkEncoder), what a chunk's encoder has sent plus its residual equals
// the sum of the gradients it was given, to f32 rounding (EF-SGD, Karimireddy et al. 2019).
//
// Thread-safety: the free functions are pure. A ChunkEncoder is used by one thread at a time
// (the PS client: the I/O thread of the link that owns the chunk); it owns its residuals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/codec.h"
#include "common/config/compression.h"
#include "common/status.h"

namespace downpour {

// ---- Scalar and bulk conversions (round to nearest even; bulk f16 uses F16C when compiled
// with it, -march=native on an x86 that has it, and equals the scalar code bit for bit).
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
void FloatsToHalf(std::span<const float> in, uint16_t* out);  // out: in.size() halves
void HalfToFloats(const uint16_t* in, std::span<float> out);
void FloatsToBf16(std::span<const float> in, uint16_t* out);
void Bf16ToFloats(const uint16_t* in, std::span<float> out);
// FloatsToHalf for kF16, FloatsToBf16 for kBf16 (any other dtype is a caller's bug).
void CastFloats(std::span<const float> in, DType dtype, uint16_t* out);
// HalfToFloats for kF16, Bf16ToFloats for kBf16 (likewise).
void WidenTo(const uint16_t* in, DType dtype, std::span<float> out);
// The same from bytes at any alignment (a received frame), out.size() values.
void HalfBytesToFloats(const std::byte* in, std::span<float> out);
void Bf16BytesToFloats(const std::byte* in, std::span<float> out);
// First non-finite value among n values of `dtype` at src (any alignment), or -1. A value is NaN
// or Inf when its magnitude bits reach the all-ones exponent: f32 0x7f800000, f16 0x7c00, bf16
// 0x7f80.
int64_t FirstNonFinite(const std::byte* src, DType dtype, size_t n);

// ---- Sizes.
// k of top-k for a chunk of n floats: max(1, ceil(fraction * n)), at most n (fraction in (0, 1]).
size_t TopKCount(double fraction, size_t n);
// Top-k's warm-up (Deep Gradient Compression, Lin et al. 2018, warms up from 75% sparsity): the
// fraction kept at a chunk's push number `push` (0 = its first) of a warm-up of `warmup` pushes
// decays exponentially from kTopKWarmupStart to `fraction`, then stays there. `fraction` itself
// when warmup is 0 or fraction >= kTopKWarmupStart.
inline constexpr double kTopKWarmupStart = 0.25;
double TopKWarmupFraction(double fraction, uint64_t push, uint64_t warmup);
// Bytes of one encoded chunk of n floats (k: entries kept by top-k, unused otherwise).
size_t EncodedBytes(Encoding encoding, DType dtype, size_t n, size_t k = 0);

// The wire form a codec gives a gradient push: dtype of the message, encoding of its chunks.
DType CodecDType(WireCodec codec);        // fp16 -> f16, bf16 -> bf16, else f32
Encoding CodecEncoding(WireCodec codec);  // topk -> topK, onebit -> oneBit, else dense
// True for every codec but fp32 (the push or pull is not f32 dense).
inline bool IsLossy(WireCodec codec) { return codec != WireCodec::kFp32; }

// ---- Plain encoders of one chunk (no state): append the chunk's bytes to `out`.
void EncodeDense(std::span<const float> x, DType dtype, std::vector<std::byte>* out);
// The k largest |x_i| (ties: any of them), indices ascending; values in `dtype`.
void EncodeTopK(std::span<const float> x, size_t k, DType dtype, std::vector<std::byte>* out);
// scale = mean |x|, then the sign bits.
void EncodeOneBit(std::span<const float> x, std::vector<std::byte>* out);

// ---- The decoder. What is wrong with a refused frame (the server maps it to a RejectReason).
enum class CodecFault {
  kNone,
  kUnsupported,  // an encoding / dtype pair this decoder does not take (factors: not here)
  kLength,       // the frame length does not fit count / k / dtype
  kIndex,        // top-k: k > count, an index >= count, indices not strictly ascending
  kNonFinite,    // a NaN / Inf value or scale, or a negative scale
};
// Checks that `payload` is a valid encoding of a chunk of out.size() floats, then (only then)
// decodes it into `out`. Errors name `chunk_id` and what is wrong; `fault` says which kind.
Status DecodeChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, std::span<float> out,
                   uint32_t chunk_id, CodecFault* fault);
// The checks of DecodeChunk without writing anything (for "check all, then write all").
Status CheckChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, size_t count, uint32_t chunk_id,
                  CodecFault* fault);
// The writing of DecodeChunk alone, for a payload CheckChunk accepted with count = out.size() (the
// "write all" half: nothing is checked again). Any other payload is a caller's bug.
void DecodeCheckedChunk(Encoding encoding, DType dtype, std::span<const std::byte> payload, std::span<float> out);

// ---- The stateful encoder of a client's gradient pushes. It reads [compression]'s push,
// top_k_fraction, top_k_warmup_pushes and error_feedback (fp16/bf16 keep no residual).

struct EncodedChunk {
  Encoding encoding = Encoding::kDense;  // the chunk's own encoding (may differ from the codec's)
  std::vector<std::byte> bytes;
};

class ChunkEncoder {
 public:
  explicit ChunkEncoder(CompressionConfig settings) : settings_(settings) {}

  // Encodes chunk `chunk_id`'s gradient g. With error feedback: g' = g + r (the chunk's
  // residual, 0 at first), send C(g'), r = g' - decode(C(g')). Top-k of a chunk so small that
  // k indices and values cost as much as dense f32 (2k >= n) goes dense f32 (residual 0). A
  // gradient holding NaN / Inf goes dense f32 as it is, residual untouched: the server refuses
  // it as non-finite, as it would the uncompressed push. Top-k with a warm-up counts the chunk's
  // finite encodes and keeps TopKWarmupFraction of it.
  void Encode(uint32_t chunk_id, std::span<const float> g, EncodedChunk* out);

  DType dtype() const { return CodecDType(settings_.push); }
  const CompressionConfig& settings() const { return settings_; }
  // The chunk's residual (empty before its first encode, or without error feedback).
  std::span<const float> residual(uint32_t chunk_id) const;

 private:
  CompressionConfig settings_;
  std::unordered_map<uint32_t, std::vector<float>> residual_;
  std::unordered_map<uint32_t, uint64_t> pushes_;  // top-k warm-up: encodes of each chunk so far
  std::vector<float> work_, decoded_;  // g' and decode(C(g')), reused
};

}  // namespace downpour
