// factor_push.cc — see factor_push.h.
#include "server/factor_push.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/finite.h"
#include "common/grad_codec.h"

namespace downpour {
namespace {

// Rows r of G = δᵀ (rows×B) · a (B×in) into g (rows×in, row-major), by one sgemm.
// beta = 0: sgemm writes every element, so g needs no zeroing.
void FormRows(RowSpan r, int64_t in, int64_t batch, const float* delta, const float* a, float* g) {
  const dnnl_status_t st = dnnl_sgemm('T', 'N', r.rows, in, batch, 1.0f, delta, r.rows, a, in, 0.0f, g, in);
  DP_CHECK_EQ(static_cast<int>(st), static_cast<int>(dnnl_success));
}

// Each sgemm on one thread. Outside a parallel region dnnl takes the calling thread's OpenMP team
// size, by default nproc, and on a host whose other cores run workers that team spends its time
// waiting for them at its barriers: the servers' CPU per worker step was far more than with one
// thread (bench/RESULTS.md §11.5.1). omp_set_num_threads sets the calling thread's own team size
// only; inside the chunks' parallel loop dnnl runs each sgemm on the thread that calls it.
void OneThreadPerSgemm() {
  static thread_local const bool one_thread = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)one_thread;
}

// True when no element of δᵀ·a over these rows can be Inf: the largest Σ_b |δ[b][row]| times
// max |a| stays within kFactorProductBound (factor_push.h). A sum that overflows fails it.
bool ProductCannotOverflow(const float* delta, uint32_t batch, int64_t rows, float a_max, std::vector<float>* sums) {
  sums->assign(static_cast<size_t>(rows), 0.0f);
  for (uint32_t b = 0; b < batch; ++b) {
    const float* d = delta + static_cast<size_t>(b) * static_cast<size_t>(rows);
    for (size_t r = 0; r < sums->size(); ++r) (*sums)[r] += std::fabs(d[r]);
  }
  const float s_max = std::bit_cast<float>(MaxAbsBits(*sums));
  return static_cast<double>(s_max) * static_cast<double>(a_max) <= kFactorProductBound;
}

// The floats of a frame of `dtype` values (its length checked): f32 in place when aligned, else
// copied or widened into `scratch`.
const float* FloatsOf(const Frame& f, DType dtype, std::vector<float>* scratch) {
  if (dtype == DType::kF32) return AlignedFloats(f, scratch);
  scratch->resize(f.size() / DTypeSize(dtype));
  DecodeCheckedChunk(Encoding::kDense, dtype, std::span<const std::byte>(f.data(), f.size()), *scratch);
  return scratch->data();
}

Status Refuse(RejectReason why, RejectReason* reason, Status s) {
  *reason = why;
  return s;
}

}  // namespace

bool HasFactorChunks(const MessageHeader& h) {
  return std::find(h.encodings.begin(), h.encodings.end(), Encoding::kFactors) != h.encodings.end();
}

Status ExpandFactorPush(const ParamLayout& layout, MessageHeader* h, Frames* frames, RejectReason* reason,
                        BufferPool<float>* scratch, int threads, std::vector<bool>* expanded) {
  if (expanded != nullptr) expanded->assign(h->chunk_ids.size(), false);
  if (!HasFactorChunks(*h)) return Status::Ok();
  const size_t n = h->chunk_ids.size();
  const bool wide = h->dtype == DType::kF32;
  if ((h->flags & kFlagInit) != 0 || !(wide || h->dtype == DType::kF16 || h->dtype == DType::kBf16))
    return Refuse(RejectReason::kDType, reason,
                  InvalidArgument("push: factor chunks need an f32, f16 or bf16 gradient push (dtype {}, init {})",
                                  DTypeName(h->dtype), (h->flags & kFlagInit) != 0));
  if (h->encodings.size() != n || h->elem_counts.size() != n || h->byte_lengths.size() != n ||
      frames->size() != n + 2)
    return Refuse(RejectReason::kFrameCount, reason,
                  InvalidArgument("push with factor chunks: {} chunk ids need {} encodings, elemCounts and "
                                  "byteLengths and {} payload frames (chunks + the activations); got {}, {}, {} "
                                  "and {}", n, n, n + 1, h->encodings.size(), h->elem_counts.size(),
                                  h->byte_lengths.size(), frames->size() - 1));
  // A 16-bit message carries factor chunks only: the dtype is the message's, and the dense
  // push it becomes is f32.
  if (!wide) {
    for (size_t i = 0; i < n; ++i) {
      if (h->encodings[i] != Encoding::kFactors)
        return Refuse(RejectReason::kDType, reason,
                      InvalidArgument("push: chunk {} is dense in a {} message of factor chunks (a 16-bit "
                                      "message of factors holds factor chunks only)",
                                      h->chunk_ids[i], DTypeName(h->dtype)));
    }
  }
  const size_t elem = DTypeSize(h->dtype);
  const uint32_t batch = h->factor_batch;
  if (batch < 1 || batch > kMaxFactorBatch)
    return Refuse(RejectReason::kElemCount, reason,
                  InvalidArgument("push: factorBatch {} is outside 1..{}", batch, kMaxFactorBatch));
  if (!h->checksums.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t crc = Crc32c((*frames)[i + 1].data(), (*frames)[i + 1].size());
      if (crc != h->checksums[i])
        return Refuse(RejectReason::kChecksum, reason,
                      Corrupt("push: chunk {} CRC-32C {:#010x}, header says {:#010x}", h->chunk_ids[i], crc,
                              h->checksums[i]));
    }
  }
  // Every factor chunk: known, of one tensor, of the layout's size, with a frame of B×rows floats.
  int32_t tensor = -1;
  for (size_t i = 0; i < n; ++i) {
    if (h->encodings[i] != Encoding::kFactors) continue;
    const uint32_t id = h->chunk_ids[i];
    if (id >= static_cast<uint32_t>(layout.num_chunks()))
      return Refuse(RejectReason::kUnknownChunk, reason,
                    InvalidArgument("push: factor chunk id {} is unknown (layout has {} chunks)", id,
                                    layout.num_chunks()));
    const Chunk& c = layout.chunk(static_cast<int32_t>(id));
    const TensorSpec& t = layout.tensors()[static_cast<size_t>(c.tensor)];
    if (tensor >= 0 && c.tensor != tensor)
      return Refuse(RejectReason::kDType, reason,
                    InvalidArgument("push: factor chunks of two tensors ('{}' and '{}') in one message",
                                    layout.tensors()[static_cast<size_t>(tensor)].name, t.name));
    tensor = c.tensor;
    if (t.shape.size() < 2)
      return Refuse(RejectReason::kDType, reason,
                    InvalidArgument("push: chunk {} of tensor '{}' (rank {}) cannot carry factors: only an "
                                    "inner-product weight (out × in) can", id, t.name, t.shape.size()));
    if (h->elem_counts[i] != static_cast<uint64_t>(c.count))
      return Refuse(RejectReason::kElemCount, reason,
                    InvalidArgument("push: chunk {} has {} elements in the layout, header says {}", id, c.count,
                                    h->elem_counts[i]));
    const uint64_t bytes = static_cast<uint64_t>(batch) * RowsOf(c, t.numel() / t.shape[0]).rows * elem;
    if (h->byte_lengths[i] != bytes || (*frames)[i + 1].size() != bytes)
      return Refuse(RejectReason::kByteLength, reason,
                    InvalidArgument("push: factor chunk {} of '{}' needs {} bytes of delta (factorBatch {} × {} "
                                    "rows × {}); header says {}, frame has {}",
                                    id, t.name, bytes, batch, bytes / batch / elem, elem, h->byte_lengths[i],
                                    (*frames)[i + 1].size()));
  }
  const TensorSpec& t = layout.tensors()[static_cast<size_t>(tensor)];
  const int64_t in = t.numel() / t.shape[0];
  const Frame& a_frame = frames->back();
  const uint64_t a_bytes = static_cast<uint64_t>(batch) * static_cast<uint64_t>(in) * elem;
  if (a_frame.size() != a_bytes)
    return Refuse(RejectReason::kByteLength, reason,
                  InvalidArgument("push: the activations frame of '{}' needs {} bytes (factorBatch {} × in {} × "
                                  "{}), frame has {}",
                                  t.name, a_bytes, batch, in, elem, a_frame.size()));
  // Valid lengths: δ and a as f32, widened from 16 bits exactly (every half and bfloat16 is a
  // float), so the product is the one an f32 push of the widened values forms, bit for bit.
  std::vector<float> a_scratch;
  const float* a = FloatsOf(a_frame, h->dtype, &a_scratch);
  const uint32_t a_max = MaxAbsBits(std::span<const float>(a, static_cast<size_t>(a_bytes / elem)));
  if (a_max >= kF32InfBits)
    return Refuse(RejectReason::kNonFinite, reason,
                  InvalidArgument("push: the activations of '{}' hold NaN or Inf", t.name));
  std::vector<std::vector<float>> delta_scratch(n);
  std::vector<const float*> deltas(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (h->encodings[i] != Encoding::kFactors) continue;
    deltas[i] = FloatsOf((*frames)[i + 1], h->dtype, &delta_scratch[i]);
    if (!AllFinite(std::span<const float>(deltas[i], (*frames)[i + 1].size() / elem)))
      return Refuse(RejectReason::kNonFinite, reason,
                    InvalidArgument("push: factor chunk {} (tensor '{}') holds NaN or Inf", h->chunk_ids[i], t.name));
  }
  // Valid: every factor chunk's rows of δᵀ·a, the chunks side by side on `threads` threads (the
  // buffers taken first, here: the pool belongs to this thread), then the push rewritten with
  // each chunk's window of its rows (no copy: the frame starts inside them).
  struct Work {
    size_t i;  // the chunk's index in the message
    const Chunk* chunk;
    RowSpan span;
    int64_t skip;                   // where the chunk starts in its rows
    std::shared_ptr<float[]> rows;  // span.rows × in
    bool proven;                    // finite by the bound: not scanned
    bool overflowed = false;        // scanned, and an Inf found
  };
  std::vector<Work> work;
  std::vector<float> sums;
  for (size_t i = 0; i < n; ++i) {
    if (h->encodings[i] != Encoding::kFactors) continue;
    const Chunk& c = layout.chunk(static_cast<int32_t>(h->chunk_ids[i]));
    const RowSpan span = RowsOf(c, in);
    const auto elems = static_cast<size_t>(span.rows * in);
    std::shared_ptr<float[]> rows =
        scratch != nullptr ? scratch->Take(elems) : std::shared_ptr<float[]>(new float[elems]);
    const bool proven = ProductCannotOverflow(deltas[i], batch, span.rows, std::bit_cast<float>(a_max), &sums);
    work.push_back({i, &c, span, c.tensor_offset - span.first * in, std::move(rows), proven});
  }
  OneThreadPerSgemm();
  const int team = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), work.size()));
#pragma omp parallel for num_threads(team) schedule(dynamic, 1) if (team > 1)
  for (size_t k = 0; k < work.size(); ++k) {
    Work& w = work[k];
    FormRows(w.span, in, batch, deltas[w.i], a, w.rows.get());
    if (!w.proven)  // scanned while its rows are warm in this thread's cache
      w.overflowed = !AllFinite(std::span<const float>(w.rows.get() + w.skip, static_cast<size_t>(w.chunk->count)));
  }
  for (const Work& w : work) {
    if (w.overflowed)
      return Refuse(RejectReason::kNonFinite, reason,
                    InvalidArgument("push: factor chunk {} (tensor '{}'): the product of δ and a overflows to Inf",
                                    h->chunk_ids[w.i], t.name));
  }
  for (const Work& w : work) {
    if (expanded != nullptr) (*expanded)[w.i] = true;
    const auto bytes = static_cast<size_t>(w.chunk->count) * sizeof(float);
    (*frames)[w.i + 1] = Frame::Borrow(w.rows.get() + w.skip, bytes, w.rows);
    h->byte_lengths[w.i] = bytes;
    h->encodings[w.i] = Encoding::kDense;
  }
  frames->pop_back();
  h->checksums.clear();
  h->factor_batch = 0;
  h->dtype = DType::kF32;
  if (std::all_of(h->encodings.begin(), h->encodings.end(), [](Encoding e) { return e == Encoding::kDense; }))
    h->encodings.clear();
  return Status::Ok();
}

}  // namespace downpour
