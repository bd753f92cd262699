// net.h — a trainable network: layers from a NetSpec, run on one explicitly chosen Backend.
//
// The worker's view of the engine:
//  * param_specs(): the learnable tensors in net order (per layer weight then bias), Caffe
//    multipliers; the same list the parameter layout of common/ is built from.
//  * params() / grads(): ALL parameters in ONE contiguous host float buffer, and all their
//    gradients in another, in param_specs() order and canonical layout (conv OIHW, inner
//    product out×in). A pull writes straight into params(); a push reads straight out of
//    grads(). On a GPU backend these are host mirrors: params() is uploaded at the start of
//    each step and each tensor's gradient is downloaded before its callback fires.
//  * ForwardBackward(images N×C×H×W, labels N) → loss, and parameter gradients. The
//    grad-ready callback fires during backward as soon as a tensor's gradient is final
//    (later layers first) so pushes overlap the rest of backward. On a device backend each
//    download is started without waiting (Backend::CopyToHostAsync) and the layers below are
//    queued at once; the callbacks fire in order as the downloads land (checked after each
//    layer is queued, then waited for at the end of backward). The loss and the batch's
//    accuracy are read back only at the end of the step.
//  * Forward(...) for evaluation: loss, top-1 and top-k accuracy.
//  * SetBeforeLayerCallback(f): forward (training and evaluation) calls f(i) right before layer
//    i runs, so a caller whose pulls land layer by layer waits only for layer i's weights
//    (layer_param_tensors(i)) before the layer reads them; on a GPU backend the layer's host
//    weights are uploaded after f(i) returns instead of all at once at the start.
//  * CheckLabels(labels, n) first: labels come from data files, and one outside the classes is
//    an error Status (bad input); ForwardBackward / Forward only CHECK it as an invariant.
//
// Ownership: the Net owns its Backend, layers, blobs and buffers. Thread-safety: one
// thread at a time; the callback runs on the calling thread, inside ForwardBackward.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/engine/layer.h"
#include "client/engine/net_spec.h"
#include "common/config/worker.h"
#include "common/status.h"

namespace downpour {
class UpdateRule;  // common/solver/update_rule.h
}
#include "common/tensor_spec.h"

namespace downpour::engine {

struct NetOptions {
  // The run's [worker] as it gives it (common/config/worker.h); the net reads its compute keys:
  //   device     kCpu → oneDNN (or reference), kGpu → CUDA on gpu_index
  //   threads    CPU compute threads (OpenMP); 0 = library default
  //   tf32       GPU only: TF32 tensor cores for fp32 conv/GEMM (off = exact fp32)
  //   conv_algo  GPU only: search | heuristic | gemm | implicit_gemm | fft | winograd
  WorkerConfig worker;
  bool reference = false;  // CPU only: the plain naive-loop backend (the source of truth)
  int batch = 64;          // initial batch size; Reshape() changes it (not worker.batch_size: an
                           // evaluation net has its own)
  int top_k = 5;           // k of the top-k accuracy Forward() reports
};

// Host memory for buffers a device uploads from (data batches): page-locked on a GPU in a CUDA
// build (allocate returns nullptr when pinning fails, e.g. no driver); empty functions, meaning
// "the caller's default", for the CPU or a build without CUDA.
struct HostAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void*)> deallocate;
};
HostAllocator HostAllocatorFor(DeviceKind device);

// Explicit backend choice; kGpu without a CUDA build is an error, never a fallback.
Status CreateBackend(const NetOptions& options, std::unique_ptr<Backend>* backend);

struct EvalResult {
  float loss = 0.0f;
  float top1 = 0.0f;  // fraction of the batch whose arg-max is the label
  float topk = 0.0f;  // fraction with the label among the k largest scores (k = top_k)
};

class Net {
 public:
  // Builds the backend from options and the net on it (parameters zeroed; call InitParams
  // or LoadWeights next).
  static Status Create(const NetSpec& spec, const NetOptions& options, std::unique_ptr<Net>* net);
  // Same, with a backend built by the caller.
  static Status CreateWithBackend(const NetSpec& spec, const NetOptions& options,
                                  std::unique_ptr<Backend> backend, std::unique_ptr<Net>* net);
  ~Net();
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  const NetSpec& spec() const { return spec_; }
  const NetShapes& shapes() const { return shapes_; }
  Backend& backend() { return *backend_; }
  const std::vector<TensorSpec>& param_specs() const { return shapes_.params; }
  // Offset of tensor i in params()/grads().
  int64_t param_offset(int i) const { return param_offsets_[i]; }
  std::span<float> params() { return {host_params_, static_cast<size_t>(num_params_)}; }
  std::span<float> grads() { return {host_grads_, static_cast<size_t>(num_params_)}; }
  std::span<float> param(int i);
  std::span<float> grad(int i);

  int input_channels() const { return spec_.input_channels; }
  int input_height() const { return spec_.input_height; }
  int input_width() const { return spec_.input_width; }
  int64_t input_count() const;  // batch × C × H × W
  int batch_size() const { return batch_; }
  int num_classes() const { return shapes_.num_classes; }
  Status Reshape(int batch);

  // Seeded initialisation with each layer's fillers; identical on every backend. The seed
  // also drives dropout masks: a mask is a pure function of (seed, step, layer).
  void InitParams(uint64_t seed);
  // The training-step counter (ForwardBackward increments it before use). Set it to
  // reproduce a step's dropout masks (resumed runs, gradient checks).
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // Labels come from data files, so a label outside [0, num_classes) is bad input: call this
  // before ForwardBackward / Forward (which CHECK the range as an invariant). Checks
  // labels[0..n); the error (InvalidArgument) names the position in the batch, the label,
  // num_classes, the loss layer and its label bottom, and the net.
  Status CheckLabels(const int* labels, int n) const;

  // One training step's computation (no update): returns the mean loss and fills grads().
  // Also computes the batch's top-1 accuracy (last_accuracy()). `images` is N×C×H×W float,
  // `labels` N class indices in [0, num_classes) (see CheckLabels).
  float ForwardBackward(const float* images, const int* labels);
  float last_accuracy() const { return last_accuracy_; }
  // Input as bytes (common/byte_batch.h; Backend::NormalizeInput): a GPU uploads a quarter of the
  // floats' bytes, a step ahead, and normalises them with a kernel. SetInputNormalization once:
  // its crop must be the net's input c × h × w (InvalidArgument naming `what`, the net and both
  // shapes otherwise). Then ForwardBackward on a byte batch of batch_size() images computes exactly
  // what it computes on their normalised floats; `next` (null: none), the next step's batch, is
  // staged once this step's forward is queued, so its upload overlaps this step's backward (it must
  // stay as it is until the next step has ended).
  Status SetInputNormalization(InputNormalization norm, const std::string& what);
  bool has_input_normalization() const { return input_norm_.channels > 0; }
  float ForwardBackward(const ByteBatch& batch, const int* labels, const ByteBatch* next = nullptr);
  // Evaluation (test phase: no dropout).
  EvalResult Forward(const float* images, const int* labels);
  // The same on a byte batch of batch_size() images (after SetInputNormalization), staging `next`
  // (null: none; it may be of another size, up to the largest batch this net was shaped for)
  // once this batch's forward is queued, as the byte ForwardBackward does.
  EvalResult Forward(const ByteBatch& batch, const int* labels, const ByteBatch* next = nullptr);

  // Called during backward with the index (into param_specs()) of each tensor whose
  // gradient is final; later layers first, bias before weight within a layer.
  void SetGradReadyCallback(std::function<void(int tensor_index)> callback) {
    grad_ready_ = std::move(callback);
  }

  // Gradients downloaded in 16 bits (Backend::CopyToHostCastAsync): with kF16 or kBf16, backward
  // writes each tensor's gradient, cast on the device (common/grad_codec.h's rounding), into
  // grads16() instead of grads(), which keeps what it held; a factored tensor's factors, [δ
  // packed | a], likewise go to the start of its span in grads16(), packed and cast on the device
  // (Backend::ReadFactorsCastAsync). For a worker whose push codec is fp16 / bf16: PCIe carries the wire's
  // bytes and the host converts nothing. kF32 (the default) turns it off. A host backend (whose
  // gradients are host memory already) → InvalidArgument naming the net and the backend; too
  // little device memory for the 16-bit copy → the backend's error (Backend::PrepareCast).
  Status SetGradDType(DType dtype);
  DType grad_dtype() const { return grad_dtype_; }
  // 16-bit gradients, in params() order (valid from the first SetGradDType(kF16 / kBf16) on;
  // empty before): tensor t's at [param_offset(t), +numel).
  std::span<const uint16_t> grads16() const {
    return host_grads16_ == nullptr ? std::span<const uint16_t>{}
                                    : std::span<const uint16_t>(host_grads16_, static_cast<size_t>(num_params_));
  }

  // Weights uploaded in 16 bits (Backend::UploadWeightsCast): with kF16 or kBf16, forward uploads
  // each layer's weights from params16() (the pulls' 16-bit values) instead of params(), and the
  // device widens them; params() is then not what the net computes on (the caller keeps the
  // pulls' values there only) until kF32 turns it off, which widens params16() into params().
  // For a worker whose pull codec is fp16 / bf16: PCIe carries the wire's bytes and the host
  // widens nothing. A host backend → InvalidArgument naming the net and the backend.
  Status SetWeightDType(DType dtype);
  DType weight_dtype() const { return weight_dtype_; }
  std::span<uint16_t> params16() {
    return host_params16_ == nullptr ? std::span<uint16_t>{}
                                     : std::span<uint16_t>(host_params16_, static_cast<size_t>(num_params_));
  }

  // Sufficient factors (docs/factors.md). For each tensor listed (an inner-product weight,
  // out×in; anything else is an InvalidArgument naming it), backward writes its factors
  // instead of dW at the START of grad(t): δ (B×out, the layer's top gradient, carrying the
  // loss's 1/B) then a (B×in, the layer's input flattened, after dropout), so that
  // dW = δᵀ·a. δ is packed in `blocks[i]`'s row blocks for tensors[i] (common/layout.h
  // PackRowBlocks: the push's per-chunk blocks, FactorRowBlocks), by the device on the way down;
  // with no blocks given it is B×out as it is. The blocks must lie in [0, out) and cover every row
  // in order (each starts no later than the last one ended), else an InvalidArgument naming the
  // tensor. That happens only in a step where B×(packed rows + in) < out×in (it fits in the span
  // and is fewer floats; the layer then skips computing dW); otherwise grad(t) holds dW as usual.
  // grad_is_factored(t) says which, inside the grad-ready callback and after ForwardBackward.
  // An empty list turns it off.
  Status SetFactoredParams(const std::vector<int>& tensors, const std::vector<std::vector<RowSpan>>& blocks = {});
  bool grad_is_factored(int tensor) const {
    return !factored_now_.empty() && factored_now_[static_cast<size_t>(tensor)];
  }
  // out (rows of δ) and in (columns of a) of an inner-product weight tensor; false for any
  // other tensor.
  bool InnerProductDims(int tensor, int64_t* out, int64_t* in) const;

  // Emulated compute (worker.emulate_ms; the scaling model's validation with GPU-like steps on a
  // CPU host): `ms` holds a forward and a backward milliseconds per layer, in net order
  // (2 × num_layers() values, each finite and >= 0; otherwise an InvalidArgument naming
  // worker.emulate_ms and the counts). Training steps then run no kernel: each layer's forward
  // sleeps its time after its before-layer callback, each backward sleeps before the layer's
  // grad-ready callbacks, in a real step's order, and factors are chosen as in a real step;
  // gradients and factors keep what they hold (zeros after InitParams) and the loss is 0.
  // Evaluation (Forward) still computes. An empty `ms` turns it off.
  Status SetEmulatedCompute(std::vector<float> ms);
  bool emulated() const { return !emulate_ms_.empty(); }

  // Called during forward (both phases) with layer index i before layer i runs; the layer's
  // parameters (layer_param_tensors(i)) are read only after it returns. Empty = none.
  void SetBeforeLayerCallback(std::function<void(int layer)> callback) { before_layer_ = std::move(callback); }
  // Called during backward with layer index i before layer i overwrites its parameter gradients
  // (grad(t) for t in layer_param_tensors(i)), so a caller whose pushes still read the previous
  // step's gradients there waits for them first. Empty = none.
  void SetBeforeBackwardCallback(std::function<void(int layer)> callback) { before_backward_ = std::move(callback); }
  // The parameter tensors (indices into param_specs(), weight then bias) layer i reads; their
  // floats are [param_offset(t), +param_specs()[t].numel()) in params().
  const std::vector<int>& layer_param_tensors(int i) const { return shapes_.layer_params[static_cast<size_t>(i)]; }

  // One update of params() by grads() with `rule` and the per-tensor multipliers: the servers'
  // own arithmetic (common/solver/update_rule.h, bit for bit), for training on the engine alone
  // (local steps, --local runs, tests, benchmarks). `state` is the caller's buffer of the rule's
  // per-weight state (momentum, AdaGrad's squares), started at rule.initial_state().
  void Update(const UpdateRule& rule, float lr, float momentum, float weight_decay, std::span<float> state);
  // Update with SGD with momentum and weight decay (MomentumRule); `history` is the momentum.
  void SgdUpdate(float lr, float momentum, float weight_decay, std::span<float> history);

  // Checkpoints in common/tensor_file.h format; names = param_specs() names.
  Status SaveWeights(const std::string& path) const;
  Status LoadWeights(const std::string& path);

  // Per-layer timing support for `downpour-time`: run layer i forward / backward alone
  // (after a full ForwardBackward set up the blobs).
  int num_layers() const { return static_cast<int>(layers_.size()); }
  void ForwardLayer(int i, Phase phase);
  void BackwardLayer(int i);
  bool LayerHasBackward(int i) const { return layers_[i]->HasBackward(); }
  std::string LayerKernelNames(int i) const { return layers_[i]->KernelNames(); }
  // The class scores of the last forward (N × num_classes), host copy.
  std::vector<float> ReadScores();
  // Any blob of the last forward by name ("data", a layer's top), host copy in canonical
  // layout (shape shapes().blobs.at(name)); NotFound naming the blob and the net otherwise. For
  // checks and tools (the whole-net gradient check reads ReLU and pooling inputs with it).
  Status ReadBlob(const std::string& name, std::vector<float>* host);

 private:
  Net(NetSpec spec, NetOptions options, std::unique_ptr<Backend> backend);
  Status Build();
  Status SetupBlobs();
  void SetInputs(const float* images, const int* labels);
  void SetLabels(const int* labels);
  // The training step after its inputs are set.
  float TrainStep(const int* labels, const ByteBatch* next);
  // The evaluation after its inputs are set; `next` staged once the forward is queued.
  EvalResult Evaluate(const int* labels, const ByteBatch* next);
  void RunForward(Phase phase);
  float ReadScalar(const Blob& blob);
  bool FactorsPay(int layer, int tensor) const;
  uint64_t WriteFactors(int layer, int tensor);
  // Backward of layer li, its gradients' downloads started, not waited for.
  void QueueBackward(int li);
  void DeliverGrads(bool wait);
  struct PendingGrad {
    int tensor;
    uint64_t ticket;  // Backend::CopyToHostAsync's; 0 = nothing to wait for
  };
  std::deque<PendingGrad> pending_grads_;  // queued by backward, not yet handed to grad_ready_
  void AccuracyFromScores(const int* labels, int k, float* top1, float* topk);

  NetSpec spec_;
  NetOptions options_;
  std::unique_ptr<Backend> backend_;
  NetShapes shapes_;
  int batch_ = 0;
  int64_t step_ = 0;
  uint64_t seed_ = 0;

  // Sufficient factors: per tensor, the inner-product layer whose weight is factored (-1 =
  // dense), and whether this step's grad(t) holds factors.
  std::vector<int> factor_layer_;
  std::vector<bool> factored_now_;
  std::vector<std::vector<RowSpan>> factor_blocks_;  // per tensor: δ's row blocks (one = as it is)
  std::vector<int64_t> param_offsets_;
  int64_t num_params_ = 0;
  float* device_params_ = nullptr;  // backend memory (== host_* on host backends)
  float* device_grads_ = nullptr;
  float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  std::vector<float> host_params_storage_, host_grads_storage_;  // GPU mirrors only
  DType grad_dtype_ = DType::kF32;
  uint16_t* host_grads16_ = nullptr;  // SetGradDType's buffer (Backend::AllocateHost)
  DType weight_dtype_ = DType::kF32;
  uint16_t* host_params16_ = nullptr;  // SetWeightDType's buffer (Backend::AllocateHost)
  // One layer's (or every) weight upload, in the weights' dtype.
  void UploadParams(int64_t offset, int64_t count);
  void UploadAllParams();  // InitParams / LoadWeights: every weight up, waited for
  Status Prepare16(const char* what, const float* device, uint16_t** host);

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::unique_ptr<Blob>> blobs_;                 // all blobs, owned here
  std::vector<std::vector<Blob*>> bottoms_, tops_;           // per layer
  std::vector<std::vector<bool>> propagate_down_;            // per layer, per bottom
  Blob* data_blob_ = nullptr;
  Blob* label_blob_ = nullptr;
  std::vector<float> label_staging_;
  InputNormalization input_norm_;  // byte input; channels 0 = not set
  int input_batch_ = 0;            // the most images a byte batch may have (Backend::PrepareInput's)
  std::function<void(int)> grad_ready_;
  std::function<void(int)> before_layer_;
  std::function<void(int)> before_backward_;
  float last_accuracy_ = 0.0f;
  // Emulated compute: forward, backward ms per layer; the time the previous emulated kernel was
  // due to end (a late wake-up is not added to the next one).
  void EmulateKernel(float ms);
  std::vector<float> emulate_ms_;
  std::chrono::steady_clock::time_point emulate_due_{};
};

}  // namespace downpour::engine
