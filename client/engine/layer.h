// layer.h — the layer contract shared by every engine backend (reference, oneDNN, CUDA),
// modelled on Caffe's layer.hpp: a layer is built from its LayerSpec and its parameter
// slots, reshapes its tops from its bottoms, runs forward, and runs backward (data
// gradients for the bottoms that need them, parameter gradients into its slots).
//
// Memory and ownership:
//  * A Blob is a logical tensor (canonical shape, e.g. N,C,H,W). Its storage lives on the
//    backend's device and is owned by the layer that produces it (Reshape allocates it;
//    the net's input blobs are owned by the Backend). `format` is backend-private: a
//    backend may keep activations in a layout it prefers (oneDNN: blocked / nhwc) between
//    its own layers; a null format means dense canonical row-major. Only the backend reads
//    or writes blob memory; the host crosses that boundary through the Backend: SetInput (or
//    NormalizeInput, from bytes) and ReadBlob for blob data (WriteBlobGrad / ReadBlobGrad for
//    blob gradients), and CopyToDevice / CopyToHost for the parameter and gradient buffers.
//  * Parameters are NOT owned by layers: every layer's weights and biases are windows
//    (ParamSlot) into the net's one contiguous parameter buffer and one contiguous gradient
//    buffer, in canonical layout (conv OIHW, inner product out×in). A backend that prefers
//    another weight layout reorders inside the layer, on every step.
//  * Backward OVERWRITES parameter gradients and bottom gradients (no accumulation): the
//    net guarantees each blob has at most one consumer that sends a gradient back.
//
// Thread-safety: a Layer / Backend is used by one thread at a time (the net's caller);
// backends may parallelise inside a call (OpenMP, CUDA streams).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/engine/net_spec.h"
#include "common/byte_batch.h"
#include "common/device.h"
#include "common/grad_codec.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/tensor_spec.h"

namespace downpour::engine {

using ::downpour::DeviceKind;  // common/device.h

enum class Phase { kTrain, kTest };

struct Blob {
  std::string name;
  std::vector<int> shape;          // logical canonical shape
  float* data = nullptr;           // backend memory
  float* grad = nullptr;           // same count as data; null when no gradient flows here
  std::shared_ptr<void> format;    // backend-private layout tag; null = dense canonical
  int64_t count() const { return ShapeCount(shape); }
};

// One learnable tensor as a layer sees it: windows into the net's contiguous buffers
// (backend memory), canonical layout.
struct ParamSlot {
  TensorSpec spec;
  float* data = nullptr;
  float* grad = nullptr;
};

// What a backend needs to build a layer.
struct LayerContext {
  const LayerSpec* spec = nullptr;
  int index = 0;                       // position in NetSpec::layers
  std::vector<ParamSlot> params;       // weight then bias (0..2 entries)
  uint64_t seed = 0;                   // per-layer seed (dropout masks), from the net's seed
};

class Layer {
 public:
  virtual ~Layer() = default;

  // (Re)allocates the tops for the bottoms' shapes/formats and prepares whatever the
  // backend needs (primitives, descriptors). Called once after construction and again
  // whenever the batch size changes. Bad shapes → InvalidArgument naming the layer.
  virtual Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) = 0;

  virtual void Forward(Phase phase, const std::vector<Blob*>& bottom,
                       const std::vector<Blob*>& top) = 0;

  // Reads top[i]->grad (for loss layers the implicit top gradient is 1), writes
  // bottom[i]->grad where propagate_down[i], and writes every ParamSlot::grad.
  virtual void Backward(const std::vector<Blob*>& top, const std::vector<bool>& propagate_down,
                        const std::vector<Blob*>& bottom) = 0;

  // Layers without gradient (Accuracy) say so; the net then skips Backward.
  virtual bool HasBackward() const { return true; }

  // Dropout-style layers draw a fresh mask per training step: the net calls this with the
  // step number before Forward so masks are a pure function of (seed, step, layer).
  virtual void SetStep(int64_t /*step*/) {}

  // Which backend kernels this layer runs, e.g. "fwd jit:avx2, bwd_data jit:avx2, bwd_weights
  // gemm:jit" for a oneDNN convolution; empty where the backend has only one. For tests that
  // no layer fell back to a naive kernel (downpour-time does not print it yet).
  virtual std::string KernelNames() const { return {}; }

  // Sufficient factors (Net::SetFactoredParams): while set, an inner-product layer's Backward
  // leaves its weight gradient (params[0].grad) unwritten — the net sends the layer's top
  // gradient and input instead, and the server forms the product. Bias and bottom gradients
  // are written as always. Other layers ignore it. Default off.
  void set_skip_weight_grad(bool skip) { skip_weight_grad_ = skip; }

 protected:
  bool skip_weight_grad_ = false;
};

// A backend: a device, its memory, and a layer factory. Chosen explicitly by the net
// factory (net.h); no registration, no fallback.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind device() const = 0;
  virtual std::string name() const = 0;  // "reference", "onednn", "cuda"

  // Memory for the net's parameter and gradient buffers (count floats, zeroed); freed by
  // Free. For host backends these are the very buffers Net::params()/grads() expose.
  virtual float* Allocate(int64_t count) = 0;
  virtual void Free(float* ptr) = 0;
  virtual bool memory_is_host() const = 0;
  // Host ↔ device copies of `count` floats (plain memcpy on the CPU). CopyToDevice may return
  // before the bytes have moved: a layer reading the range waits for them (backend-internal),
  // and `host` must stay as it is until the next Synchronize or blob read-back. CopyToHost
  // returns with the bytes in `host`.
  virtual void CopyToDevice(const float* host, float* device, int64_t count) = 0;
  virtual void CopyToHost(const float* device, float* host, int64_t count) = 0;
  // The net's weight upload at the start of a layer's forward (or of a step): the same as
  // CopyToDevice, but the caller guarantees that no queued kernel reads the range (every earlier
  // step ended with a read-back, and this step's kernels so far read other layers' weights), so
  // the copy need not wait behind the compute already queued. Default: CopyToDevice.
  virtual void UploadWeights(const float* host, float* device, int64_t count) { CopyToDevice(host, device, count); }
  // The same download without waiting: it starts after the queued work that writes the range
  // and returns a ticket at once; `host` holds the bytes once CopyDone(ticket) is true or
  // WaitCopy(ticket) returned. Tickets complete in the order they were issued. Default: the
  // blocking copy, done at once (ticket 0 is always done).
  virtual uint64_t CopyToHostAsync(const float* device, float* host, int64_t count) {
    CopyToHost(device, host, count);
    return 0;
  }
  virtual bool CopyDone(uint64_t ticket) {
    (void)ticket;
    return true;
  }
  virtual void WaitCopy(uint64_t ticket) { (void)ticket; }
  // ReadBlob / ReadBlobGrad without waiting, for a blob the queued work has finished writing and
  // will not write again before the ticket completes (a layer's input and top gradient after
  // its backward: the net's sufficient factors). Tickets as CopyToHostAsync's. Default: the
  // blocking read, done at once.
  virtual uint64_t ReadBlobAsync(const Blob& blob, float* host) {
    ReadBlob(blob, host);
    return 0;
  }
  virtual uint64_t ReadBlobGradAsync(const Blob& blob, float* host) {
    ReadBlobGrad(blob, host);
    return 0;
  }
  // ReadBlobGradAsync of a layer's top gradient δ (batch × width, batch = blob.shape[0]) packed in
  // row blocks on the way (common/layout.h PackRowBlocks: the wire's per-chunk blocks of a
  // factored tensor), so the bus carries the packed floats and the host copies none of them.
  // `scratch` is device memory of at least batch × PackedRows(blocks) floats that nothing reads
  // or writes until the ticket completes (the factored tensor's own gradient window, dW being
  // skipped). Default: the blocking read into a temporary, packed by the host, done at once.
  virtual uint64_t ReadBlobGradBlocksAsync(const Blob& blob, std::span<const RowSpan> blocks, float* scratch,
                                           float* host) {
    (void)scratch;
    std::vector<float> canonical(static_cast<size_t>(blob.count()));
    ReadBlobGrad(blob, canonical.data());
    const int64_t batch = blob.shape.at(0);
    PackRowBlocks(canonical.data(), batch, blob.count() / batch, blocks, host);
    return 0;
  }

  // A gradient download in 16 bits (`dtype` kF16 or kBf16, rounded as common/grad_codec.h's
  // FloatsToHalf / FloatsToBf16, bit for bit): the device casts, so the bus carries half the bytes
  // and the host converts nothing; started and ticketed as CopyToHostAsync. casts_on_device()
  // says whether a worker should ask for it (host backends: no, their gradient is host memory).
  // Default: the float download, then the host's conversion, done at once. `host` from
  // AllocateHost is page-locked where that matters (default: plain memory; FreeHost frees it).
  virtual bool casts_on_device() const { return false; }
  // Reserves what the 16-bit copies of the buffer `device` (from Allocate) need on the device,
  // before the first one (CUDA: its 16-bit twin); out of memory → an error naming it. Default:
  // nothing to reserve.
  virtual Status PrepareCast(const float* device) {
    (void)device;
    return Status::Ok();
  }
  virtual uint64_t CopyToHostCastAsync(const float* device, uint16_t* host, int64_t count, DType dtype) {
    std::vector<float> floats(static_cast<size_t>(count));
    CopyToHost(device, floats.data(), count);
    CastFloats(floats, dtype, host);
    return 0;
  }
  // A factored layer's sufficient factors in 16 bits, cast by the device: `top`'s gradient δ
  // (batch × width) packed in `blocks` (ReadBlobGradBlocksAsync's), then `bottom`'s data a
  // (batch × in), cast to `dtype` (kF16 / kBf16, CopyToHostCastAsync's rounding) into
  // host[0 .. batch × (PackedRows(blocks) + in)). `window`: device memory of that many floats
  // inside a buffer PrepareCast reserved for (the factored tensor's own gradient window) that
  // nothing reads or writes until the ticket completes. Ticketed as CopyToHostAsync. Default: the
  // blocking reads, packed and cast by the host, done at once.
  virtual uint64_t ReadFactorsCastAsync(const Blob& top, std::span<const RowSpan> blocks, const Blob& bottom,
                                        float* window, uint16_t* host, DType dtype) {
    (void)window;
    const int64_t batch = top.shape.at(0), rows = PackedRows(blocks);
    std::vector<float> canonical(static_cast<size_t>(top.count()));
    ReadBlobGrad(top, canonical.data());
    std::vector<float> factors(static_cast<size_t>(batch * rows + bottom.count()));
    PackRowBlocks(canonical.data(), batch, top.count() / batch, blocks, factors.data());
    ReadBlob(bottom, factors.data() + batch * rows);
    CastFloats(factors, dtype, host);
    return 0;
  }
  // The weight upload in 16 bits (UploadWeights' contract; `dtype` kF16 / kBf16): half the bytes
  // cross, and the device widens them into the f32 range (common/grad_codec.h's HalfToFloats /
  // Bf16ToFloats, exact). Default: widened on the host, then a blocking copy.
  virtual void UploadWeightsCast(const uint16_t* host, float* device, int64_t count, DType dtype) {
    std::vector<float> floats(static_cast<size_t>(count));
    WidenTo(host, dtype, floats);
    CopyToDevice(floats.data(), device, count);
    Synchronize();  // `floats` goes away
  }
  virtual void* AllocateHost(size_t bytes) { return ::operator new(bytes); }
  virtual void FreeHost(void* ptr) { ::operator delete(ptr); }

  // Input edge: make `blob` (shape already set by the net) hold host data in canonical
  // layout (images N,C,H,W; labels as float class indices). Allocates on first use.
  virtual void SetInput(const float* host, Blob* blob) = 0;
  // Output edge: copy a blob's data to host in canonical layout (undoing any private format).
  virtual void ReadBlob(const Blob& blob, float* host) = 0;
  // Release blob storage the backend allocated for an input blob.
  virtual void ReleaseInput(Blob* blob) = 0;
  // Gradient edges, for checks and tools that drive a layer directly (the net itself never
  // needs them): write `blob->grad` from host data in canonical layout (applying the blob's
  // private format), and read it back to the host in canonical layout. `blob->grad` must be
  // set (a layer's top after Reshape, or a buffer from Allocate for a dense input blob).
  virtual void WriteBlobGrad(const float* host, Blob* blob) = 0;
  virtual void ReadBlobGrad(const Blob& blob, float* host) = 0;

  // Input as bytes (common/byte_batch.h): a batch of uint8 crop windows, a quarter of the floats'
  // bytes, normalised by the backend; on a device its upload can start a step ahead.
  //  * normalizes_input(): whether a worker should feed this backend bytes. Host backends say no:
  //    the loader's threads normalise in parallel, the training thread would do it alone.
  //  * PrepareInput(norm, batch) once before the first batch of up to `batch` images (a device
  //    copies the mean image over and allocates its two staging buffers; out of memory → an error
  //    naming them, before training starts).
  //  * StageInput(batch) may start the upload of the batch's pixels and windows and return at once.
  //    Both must stay as they are until the step that normalises them has ended (a read-back). At
  //    most two batches are staged and not yet normalised.
  //  * NormalizeInput(norm, batch, blob) writes the blob (shape set by the net) from a batch,
  //    staged or not, waiting only for that batch's upload.
  // Defaults: nothing staged; the host's NormalizeByteBatch, then SetInput.
  virtual bool normalizes_input() const { return false; }
  virtual Status PrepareInput(const InputNormalization& norm, int batch) {
    (void)norm;
    (void)batch;
    return Status::Ok();
  }
  virtual void StageInput(const ByteBatch& batch) { (void)batch; }
  virtual void NormalizeInput(const InputNormalization& norm, const ByteBatch& batch, Blob* blob) {
    std::vector<float> host(static_cast<size_t>(batch.n * norm.image_bytes()));
    NormalizeByteBatch(norm, batch, host.data());
    SetInput(host.data(), blob);
  }

  // Threads for compute inside calls (OpenMP on the CPU); 0 = library default.
  virtual void SetThreads(int threads) = 0;

  virtual Status CreateLayer(const LayerContext& context, std::unique_ptr<Layer>* layer) = 0;

  // Waits for queued device work (no-op on the CPU).
  virtual void Synchronize() {}
};

}  // namespace downpour::engine
