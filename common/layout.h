// layout.h — the parameter layout: how a model's learnable tensors map onto S shard servers.
//
// All learnable tensors, in model order, form one flat float address space of N floats.
// The flat space is split into S contiguous server ranges of floor/ceil(N/S) floats (so every
// server holds within one float of N/S, even when one tensor such as fc6 (4096x9216 = 37.7M
// floats) is larger than a server's share), and each server range is cut into chunks that
// never straddle a tensor boundary or a server boundary and hold at most chunk_elems floats.
// A chunk is the unit of the wire: one payload frame per chunk (frames must stay a few MiB,
// docs/config.md `cluster.chunk_elems`; the default 1<<20 floats = 4 MiB).
//
// The layout is a pure function of (specs, servers, chunk_elems); every process computes the
// same one, and Hash() (names, shapes, S, chunk_elems and all chunks) is compared at
// rendezvous and carried in every message.
//
// Thread-safety: immutable after Build(); safe to share between threads by const reference.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor_spec.h"

namespace downpour {

// Default chunk size: 1<<20 floats = 4 MiB frames (below glibc's mmap threshold trouble).
inline constexpr int64_t kDefaultChunkElems = int64_t{1} << 20;

struct Chunk {
  int32_t id = 0;             // index into ParamLayout::chunks(), dense 0..C-1
  int32_t tensor = 0;         // index into ParamLayout::tensors()
  int64_t tensor_offset = 0;  // first float of the chunk within its tensor
  int64_t flat_offset = 0;    // first float of the chunk in the flat address space
  int64_t count = 0;          // floats in the chunk, 1..chunk_elems
  int32_t server = 0;         // owning server, 0..S-1
};

// The rows [first, first + rows) of a row-major tensor with `in` floats a row (an inner-product
// weight, out × in) that a chunk touches; a chunk may start and end inside a row. Sufficient
// factors are sent and formed row by row (server/factor_push.h).
struct RowSpan {
  int64_t first = 0;
  int64_t rows = 0;
};
inline RowSpan RowsOf(const Chunk& c, int64_t in) {
  const int64_t r0 = c.tensor_offset / in, r1 = (c.tensor_offset + c.count - 1) / in;
  return RowSpan{r0, r1 - r0 + 1};
}

class ParamLayout {
 public:
  ParamLayout() = default;

  // Builds the layout. Errors (InvalidArgument): servers < 1, chunk_elems < 1, an empty or
  // negative shape dimension, duplicate tensor names, or fewer floats than servers.
  static Status Build(std::vector<TensorSpec> specs, int servers, int64_t chunk_elems,
                      ParamLayout* out);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  const Chunk& chunk(int32_t id) const { return chunks_[static_cast<size_t>(id)]; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  int servers() const { return servers_; }
  int64_t chunk_elems() const { return chunk_elems_; }
  int64_t total_elems() const { return total_elems_; }
  uint64_t hash() const { return hash_; }

  // Flat offset of tensor t's first float.
  int64_t tensor_flat_offset(int t) const { return tensor_offsets_[static_cast<size_t>(t)]; }
  // Chunk ids owned by server s, ascending (= ascending flat offset).
  std::span<const int32_t> ServerChunks(int s) const { return server_chunks_[static_cast<size_t>(s)]; }
  // Floats owned by server s.
  int64_t ServerElems(int s) const;
  // Chunk ids overlapping the flat range [begin, end), ascending. Chunks never straddle a tensor,
  // so a tensor range [tensor_flat_offset(a), tensor_flat_offset(b)) maps to whole chunks.
  std::vector<int32_t> ChunksInRange(int64_t begin, int64_t end) const;
  // Index of the tensor named `name`, or -1.
  int TensorIndex(const std::string& name) const;

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<int64_t> tensor_offsets_;  // size T+1; last = total_elems_
  std::vector<Chunk> chunks_;
  std::vector<std::vector<int32_t>> server_chunks_;
  int servers_ = 0;
  int64_t chunk_elems_ = 0;
  int64_t total_elems_ = 0;
  uint64_t hash_ = 0;
};

// Floats on the wire when a push sends the gradient of tensor `tensor` (an inner-product weight,
// out × in, rank >= 2) as sufficient factors of batch `batch` (docs/factors.md): per chunk,
// batch × the rows it touches (a row cut by a chunk boundary goes with both chunks), and per
// server holding some of the tensor, the layer's input activations, batch × in, once. With many
// servers the activations' copies can outweigh the gradient itself. `servers`, when given, gets
// how many servers hold some of the tensor.
int64_t FactorWireFloats(const ParamLayout& layout, int tensor, int64_t batch, int* servers = nullptr);

// How a factored tensor's δ (batch × out, row b contiguous) is laid out in a push's buffer:
// packed by the wire's blocks, one per chunk of the tensor in flat order (FactorRowBlocks), block
// k (rows [first_k, first_k + rows_k)) holding δ[:, first_k..] as batch × rows_k at float
// batch × (rows_0 + … + rows_{k−1}); a row cut by a chunk boundary is in both blocks. So each
// chunk's frame is one contiguous range of the buffer and the client copies nothing
// (docs/factors.md). A device packs it before the download (engine Backend::
// ReadBlobGradBlocksAsync); one block [0, out) is δ as it is.
std::vector<RowSpan> FactorRowBlocks(const ParamLayout& layout, int tensor);
// Rows of δ the blocks hold together (batch × that many floats packed).
int64_t PackedRows(std::span<const RowSpan> blocks);
// The packing on the host: dst as above from src (batch × width, row b contiguous; every block
// inside [0, width)).
void PackRowBlocks(const float* src, int64_t batch, int64_t width, std::span<const RowSpan> blocks, float* dst);

// The layout hash a multi-model run's processes compare at rendezvous (server/model_host.h):
// one layout's own hash, or for K > 1 a hash of every model's layout hash in model-id order.
uint64_t CombinedLayoutHash(std::span<const ParamLayout> layouts);

// The learnable tensors of AlexNet (Caffe's bvlc_alexnet, grouped conv2/4/5): 16 tensors,
// 60,965,224 floats. Weights lr_mult 1 decay 1, biases lr_mult 2 decay 0. Used by tests,
// benchmarks and `--model alexnet-shapes`.
std::vector<TensorSpec> AlexNetTensorSpecs();

// Parses a tensor list file: one tensor per non-empty, non-# line:
//   <name> <dim0>x<dim1>x... [lr_mult [decay_mult]]
// e.g. "fc6.weight 4096x9216 1 1". Errors name the file, line and the bad token.
Status ParseTensorList(const std::string& text, const std::string& source_name,
                       std::vector<TensorSpec>* out);
Status LoadTensorList(const std::string& path, std::vector<TensorSpec>* out);

}  // namespace downpour

namespace downpour {

// The model's tensor list for processes that do not build the net (servers, coordinator):
// `tensors_file` (ParseTensorList format) if non-empty, else the built-in `model` ("alexnet-shapes").
// Exactly one of them must be given; errors name the flag.
Status ResolveTensorList(const std::string& tensors_file, const std::string& model,
                         std::vector<TensorSpec>* out);

// A multi-model run's tensor lists ([[models]]): model k's is <dir>/tensors-model-<k>.txt, which
// downpour-launch writes into the run directory (downpour-worker --write-tensors per model config).
std::string ModelTensorListPath(const std::string& dir, int model);
Status LoadModelTensorLists(const std::string& dir, int models, std::vector<std::vector<TensorSpec>>* out);

}  // namespace downpour
