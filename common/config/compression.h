// config/compression.h — [compression]: the codecs of pushes and pulls.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/table.h"

namespace downpour {

inline constexpr int kMaxFactorThreads = 64;  // compression.factor_threads

// [compression] — fewer bytes on the wire (common/grad_codec.h, docs/compression.md).
enum class WireCodec {
  kFp32,    // dense f32 (lossless)
  kFp16,    // dense IEEE half (gradients / pulled weights; masters stay f32 on the server)
  kBf16,    // dense bfloat16
  kTopK,    // the top_k_fraction largest |g| per chunk, with error feedback (push only)
  kOneBit,  // sign × per-chunk scale (mean |g|), with error feedback (push only)
};
// The wire codecs, in WireCodec's order; the first kDenseWireCodecs (fp32, fp16, bf16) are dense.
inline constexpr std::string_view kWireCodecNames[] = {"fp32", "fp16", "bf16", "topk", "onebit"};
inline constexpr size_t kDenseWireCodecs = 3;
const char* WireCodecName(WireCodec codec);  // "fp32" | "fp16" | "bf16" | "topk" | "onebit"
bool ParseWireCodec(std::string_view text, WireCodec* out);  // false if unknown

struct CompressionConfig {
  bool factors = false;
  WireCodec push = WireCodec::kFp32;
  WireCodec pull = WireCodec::kFp32;
  double top_k_fraction = 0.01;
  int64_t top_k_warmup_pushes = 0;
  bool error_feedback = true;
  int factor_threads = 1;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    v.Key("factors", s.factors, "inner-product layers push sufficient factors when fewer floats (docs/factors.md)");
    v.Named("push", s.push, Names{kWireCodecNames},
            "codec of the gradient chunks sent dense (fp16 / bf16: of sufficient factors too)");
    v.Named("pull", s.pull, Names{kWireCodecNames, kDenseWireCodecs}, "codec of pulled weights: fp32 | fp16 | bf16");
    v.Key("top_k_fraction", s.top_k_fraction,
          Must<double>([](double x) { return x > 0 && x <= 1; }, "must be in (0, 1]"),
          "push = \"topk\": fraction of each chunk sent");
    v.Key("top_k_warmup_pushes", s.top_k_warmup_pushes, AtLeast<int64_t>(0, "0 = no warm-up"),
          "push = \"topk\": pushes per chunk of decaying warm-up fraction; 0 = none");
    v.Key("error_feedback", s.error_feedback, "topk / onebit: add what was not sent to the next gradient");
    v.Key("factor_threads", s.factor_threads, InRange(1, kMaxFactorThreads),
          "factors: threads per server shard forming δᵀ·a");
  }
  bool operator==(const CompressionConfig&) const = default;
};

}  // namespace downpour
