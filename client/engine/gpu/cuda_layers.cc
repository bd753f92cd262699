// cuda_layers.cc — see cuda_layers.h. Shapes: x (N,C,H,W) bottom, y top, w (O,C/g,kh,kw) or
// (O,K), b (O). Row-major tensors meet column-major cuBLAS through the identity
// row-major A (m×n) == column-major Aᵀ (n×m).
#include "client/engine/gpu/cuda_layers.h"

#include <algorithm>
#include <array>
#include <vector>

#include "client/engine/gpu/cuda_check.h"
#include "client/engine/gpu/cuda_kernels.h"

namespace downpour::engine::gpu {
namespace {

const float kOne = 1.0f, kZero = 0.0f, kMinusOne = -1.0f;

// RAII cuDNN tensor descriptor over a canonical shape padded to 4-D: (N,K) → (N,K,1,1).
class TensorDesc {
 public:
  TensorDesc() { DP_CUDNN_THROW(cudnnCreateTensorDescriptor(&desc_)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  Status Set(const std::vector<int>& shape) {
    std::array<int, 4> d{1, 1, 1, 1};
    if (shape.size() > 4) return InvalidArgument("a {}-D blob; the GPU backend takes up to 4-D", shape.size());
    for (size_t i = 0; i < shape.size(); ++i) d[i] = shape[i];
    DP_CUDNN_RETURN(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d[0], d[1],
                                               d[2], d[3]));
    return Status::Ok();
  }
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

// Base: spec, parameter slots, context, and the top's device storage.
class CudaLayer : public Layer {
 public:
  CudaLayer(std::shared_ptr<CudaContext> context, const LayerContext& c)
      : ctx_(std::move(context)), spec_(*c.spec), params_(c.params), seed_(c.seed) {}

  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    ctx_->MakeCurrent();
    const size_t bytes = static_cast<size_t>(top[0]->count()) * sizeof(float);
    DP_RETURN_IF_ERROR(data_.Resize(bytes, "a layer's output"));
    DP_RETURN_IF_ERROR(grad_.Resize(bytes, "a layer's output gradient"));
    // Zeroed so that algorithm searches never time NaN/denormal garbage.
    DP_CUDA_RETURN(cudaMemsetAsync(data_.get(), 0, bytes, ctx_->stream()));
    DP_CUDA_RETURN(cudaMemsetAsync(grad_.get(), 0, bytes, ctx_->stream()));
    top[0]->data = data_.floats();
    top[0]->grad = grad_.floats();
    top[0]->format = nullptr;
    DP_RETURN_IF_ERROR(x_desc_.Set(bottom[0]->shape));
    DP_RETURN_IF_ERROR(y_desc_.Set(top[0]->shape));
    return ReshapeImpl(bottom, top);
  }

 protected:
  virtual Status ReshapeImpl(const std::vector<Blob*>&, const std::vector<Blob*>&) {
    return Status::Ok();
  }
  // Starts a layer's device work: right device, no stale grads-ready event.
  void Begin() {
    ctx_->MakeCurrent();
    ctx_->BeginLayer();
  }
  void WaitForParams() {
    for (const ParamSlot& p : params_) ctx_->WaitForParams(p.data, p.spec.numel());
  }
  float* bias_data() const { return params_.size() > 1 ? params_[1].data : nullptr; }
  float* bias_grad() const { return params_.size() > 1 ? params_[1].grad : nullptr; }

  std::shared_ptr<CudaContext> ctx_;
  LayerSpec spec_;
  std::vector<ParamSlot> params_;
  uint64_t seed_;
  DeviceBuffer data_, grad_;
  TensorDesc x_desc_, y_desc_;
};

// ---------------------------------------------------------------------------------------------
// Convolution: cuDNN with group count; algorithms per pass chosen by search, heuristics or force.

const char* FwdAlgoName(cudnnConvolutionFwdAlgo_t a) {
  static constexpr const char* kNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                           "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  return a >= 0 && a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT ? kNames[a] : "?";
}
const char* BwdDataAlgoName(cudnnConvolutionBwdDataAlgo_t a) {
  static constexpr const char* kNames[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD",
                                           "WINOGRAD_NONFUSED"};
  return a >= 0 && a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT ? kNames[a] : "?";
}
const char* BwdFilterAlgoName(cudnnConvolutionBwdFilterAlgo_t a) {
  static constexpr const char* kNames[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD",
                                           "WINOGRAD_NONFUSED", "FFT_TILING"};
  return a >= 0 && a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT ? kNames[a] : "?";
}

// The forced candidates of each pass, in preference order (empty: that pass is searched).
struct ForcedAlgos {
  std::vector<cudnnConvolutionFwdAlgo_t> fwd;
  std::vector<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  std::vector<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
};
ForcedAlgos ForcedFor(ConvAlgoMode mode) {
  switch (mode) {
    case ConvAlgoMode::kGemm:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_GEMM}, {}, {}};
    case ConvAlgoMode::kImplicitGemm:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1}};
    case ConvAlgoMode::kFft:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING}};
    case ConvAlgoMode::kWinograd:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED}};
    case ConvAlgoMode::kSearch:
    case ConvAlgoMode::kHeuristic:
      break;
  }
  return {};
}

// Picks from a cuDNN perf list (sorted best first): the first forced candidate cuDNN reports
// as supported within the workspace limit, else (no candidates) the first supported entry.
template <typename Perf, typename Algo>
bool Pick(const Perf* perf, int count, const std::vector<Algo>& candidates, size_t limit, Perf* out) {
  if (candidates.empty()) {
    for (int i = 0; i < count; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit) {
        *out = perf[i];
        return true;
      }
    return false;
  }
  for (Algo want : candidates)
    for (int i = 0; i < count; ++i)
      if (perf[i].algo == want && perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit) {
        *out = perf[i];
        return true;
      }
  return false;
}

class CudaConv : public CudaLayer {
 public:
  CudaConv(std::shared_ptr<CudaContext> context, const LayerContext& c) : CudaLayer(std::move(context), c) {
    DP_CUDNN_THROW(cudnnCreateFilterDescriptor(&w_desc_));
    DP_CUDNN_THROW(cudnnCreateConvolutionDescriptor(&conv_desc_));
  }
  ~CudaConv() override {
    cudnnDestroyConvolutionDescriptor(conv_desc_);
    cudnnDestroyFilterDescriptor(w_desc_);
  }

  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    const int g = spec_.group;
    if (x.size() != 4 || x[1] % g != 0 || spec_.num_output % g != 0)
      return InvalidArgument("convolution input {} with group {} and num_output {}: channels must "
                             "divide by the group", ShapeString(x), g, spec_.num_output);
    DP_CUDNN_RETURN(cudnnSetFilter4dDescriptor(w_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                               spec_.num_output, x[1] / g, spec_.kernel_h, spec_.kernel_w));
    DP_CUDNN_RETURN(cudnnSetConvolution2dDescriptor(conv_desc_, spec_.pad_h, spec_.pad_w, spec_.stride_h,
                                                    spec_.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT));
    DP_CUDNN_RETURN(cudnnSetConvolutionGroupCount(conv_desc_, g));
    DP_CUDNN_RETURN(cudnnSetConvolutionMathType(conv_desc_, ctx_->conv_math()));
    int n = 0, c = 0, h = 0, w = 0;
    DP_CUDNN_RETURN(cudnnGetConvolution2dForwardOutputDim(conv_desc_, x_desc_.get(), w_desc_, &n, &c, &h, &w));
    if (std::vector<int>{n, c, h, w} != y)
      return InvalidArgument("cuDNN computes output {} but the net inferred {}",
                             ShapeString({n, c, h, w}), ShapeString(y));
    if (bias_data()) DP_RETURN_IF_ERROR(bias_desc_.Set({1, spec_.num_output, 1, 1}));
    return ChooseAlgorithms(bottom[0], top[0]);
  }

  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    WaitForParams();
    DP_CUDNN_THROW(cudnnConvolutionForward(ctx_->cudnn(), &kOne, x_desc_.get(), bottom[0]->data, w_desc_,
                                           params_[0].data, conv_desc_, fwd_, ctx_->workspace(),
                                           ctx_->workspace_bytes(), &kZero, y_desc_.get(), top[0]->data));
    if (bias_data())
      DP_CUDNN_THROW(cudnnAddTensor(ctx_->cudnn(), &kOne, bias_desc_.get(), bias_data(), &kOne,
                                    y_desc_.get(), top[0]->data));
  }

  // Parameter gradients first, then the event, then the data gradient: the download of dw/db
  // overlaps the dx kernels.
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    Begin();
    if (bias_grad())
      DP_CUDNN_THROW(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kOne, y_desc_.get(), top[0]->grad,
                                                  &kZero, bias_desc_.get(), bias_grad()));
    DP_CUDNN_THROW(cudnnConvolutionBackwardFilter(ctx_->cudnn(), &kOne, x_desc_.get(), bottom[0]->data,
                                                  y_desc_.get(), top[0]->grad, conv_desc_, bwd_filter_,
                                                  ctx_->workspace(), ctx_->workspace_bytes(), &kZero,
                                                  w_desc_, params_[0].grad));
    ctx_->MarkParamGradsReady(params_);
    if (down[0])
      DP_CUDNN_THROW(cudnnConvolutionBackwardData(ctx_->cudnn(), &kOne, w_desc_, params_[0].data,
                                                  y_desc_.get(), top[0]->grad, conv_desc_, bwd_data_,
                                                  ctx_->workspace(), ctx_->workspace_bytes(), &kZero,
                                                  x_desc_.get(), bottom[0]->grad));
  }

 private:
  Status ChooseAlgorithms(Blob* bottom, Blob* top) {
    const CudaOptions& o = ctx_->options();
    const size_t limit = static_cast<size_t>(o.workspace_limit_mb) << 20;
    const ForcedAlgos forced = ForcedFor(o.conv_algo);
    const bool forcing = o.conv_algo != ConvAlgoMode::kSearch && o.conv_algo != ConvAlgoMode::kHeuristic;
    ConvAlgoChoice choice;
    choice.layer = spec_.name;
    std::vector<std::string> unsupported;

    // Heuristic lists (cheap): used by kHeuristic, and by forced modes to learn what cuDNN
    // supports for these shapes.
    constexpr int kMax = 16;
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd_h[kMax];
    cudnnConvolutionBwdDataAlgoPerf_t data_h[kMax];
    cudnnConvolutionBwdFilterAlgoPerf_t filter_h[kMax];
    cudnnConvolutionFwdAlgoPerf_t fwd{};
    cudnnConvolutionBwdDataAlgoPerf_t data{};
    cudnnConvolutionBwdFilterAlgoPerf_t filter{};
    const bool need_data = bottom->grad != nullptr;

    bool fwd_ok = false, data_ok = !need_data, filter_ok = false;
    if (o.conv_algo != ConvAlgoMode::kSearch) {
      DP_CUDNN_RETURN(cudnnGetConvolutionForwardAlgorithm_v7(ctx_->cudnn(), x_desc_.get(), w_desc_, conv_desc_,
                                                             y_desc_.get(), kMax, &got, fwd_h));
      fwd_ok = Pick(fwd_h, got, forced.fwd, limit, &fwd);
      if (forcing && !forced.fwd.empty() && !fwd_ok) unsupported.push_back("forward");
      if (need_data) {
        DP_CUDNN_RETURN(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx_->cudnn(), w_desc_, y_desc_.get(),
                                                                    conv_desc_, x_desc_.get(), kMax, &got, data_h));
        data_ok = Pick(data_h, got, forced.bwd_data, limit, &data);
        if (forcing && !forced.bwd_data.empty() && !data_ok) unsupported.push_back("backward-data");
      }
      DP_CUDNN_RETURN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx_->cudnn(), x_desc_.get(), y_desc_.get(),
                                                                    conv_desc_, w_desc_, kMax, &got, filter_h));
      filter_ok = Pick(filter_h, got, forced.bwd_filter, limit, &filter);
      if (forcing && !forced.bwd_filter.empty() && !filter_ok) unsupported.push_back("backward-filter");
      // A forced mode searches the passes it does not fix (or cannot: unsupported shapes).
      if (forcing) {
        if (forced.fwd.empty()) fwd_ok = false;
        if (forced.bwd_data.empty() && need_data) data_ok = false;
        if (forced.bwd_filter.empty()) filter_ok = false;
      }
    }
    if (!fwd_ok || !data_ok || !filter_ok) {
      // Benchmark on the real buffers (contents are overwritten before use) with a workspace
      // of the limit's size; the shared workspace is that size from here on.
      DP_RETURN_IF_ERROR(ctx_->EnsureWorkspace(limit));
      DP_CUDA_RETURN(cudaStreamSynchronize(ctx_->stream()));
      const std::vector<cudnnConvolutionFwdAlgo_t> none_f;
      const std::vector<cudnnConvolutionBwdDataAlgo_t> none_d;
      const std::vector<cudnnConvolutionBwdFilterAlgo_t> none_w;
      if (!fwd_ok) {
        DP_CUDNN_RETURN(cudnnFindConvolutionForwardAlgorithmEx(
            ctx_->cudnn(), x_desc_.get(), bottom->data, w_desc_, params_[0].data, conv_desc_, y_desc_.get(),
            top->data, kMax, &got, fwd_h, ctx_->workspace(), ctx_->workspace_bytes()));
        fwd_ok = Pick(fwd_h, got, none_f, limit, &fwd);
      }
      if (!data_ok) {
        DP_CUDNN_RETURN(cudnnFindConvolutionBackwardDataAlgorithmEx(
            ctx_->cudnn(), w_desc_, params_[0].data, y_desc_.get(), top->grad, conv_desc_, x_desc_.get(),
            bottom->grad, kMax, &got, data_h, ctx_->workspace(), ctx_->workspace_bytes()));
        data_ok = Pick(data_h, got, none_d, limit, &data);
      }
      if (!filter_ok) {
        DP_CUDNN_RETURN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            ctx_->cudnn(), x_desc_.get(), bottom->data, y_desc_.get(), top->grad, conv_desc_, w_desc_,
            params_[0].grad, kMax, &got, filter_h, ctx_->workspace(), ctx_->workspace_bytes()));
        filter_ok = Pick(filter_h, got, none_w, limit, &filter);
      }
    }
    if (!fwd_ok || !data_ok || !filter_ok)
      return FailedPrecondition(
          "cuDNN offers no {} algorithm for input {} within the workspace limit "
          "of {} MiB (workspace_limit_mb)",
          !fwd_ok    ? "forward"
          : !data_ok ? "backward-data"
                     : "backward-filter",
          ShapeString(bottom->shape), o.workspace_limit_mb);
    fwd_ = fwd.algo;
    bwd_data_ = need_data ? data.algo : CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    bwd_filter_ = filter.algo;
    // Ask for the exact sizes (heuristic perf entries only estimate them).
    size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;
    DP_CUDNN_RETURN(cudnnGetConvolutionForwardWorkspaceSize(ctx_->cudnn(), x_desc_.get(), w_desc_, conv_desc_,
                                                            y_desc_.get(), fwd_, &fwd_bytes));
    if (need_data)
      DP_CUDNN_RETURN(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_->cudnn(), w_desc_, y_desc_.get(), conv_desc_,
                                                                   x_desc_.get(), bwd_data_, &data_bytes));
    DP_CUDNN_RETURN(cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_->cudnn(), x_desc_.get(), y_desc_.get(),
                                                                   conv_desc_, w_desc_, bwd_filter_, &filter_bytes));
    const size_t need = std::max({fwd_bytes, data_bytes, filter_bytes, fwd.memory,
                                  need_data ? data.memory : size_t{0}, filter.memory});
    DP_RETURN_IF_ERROR(ctx_->EnsureWorkspace(need));

    choice.forward = FwdAlgoName(fwd_);
    choice.backward_data = need_data ? BwdDataAlgoName(bwd_data_) : "-";
    choice.backward_filter = BwdFilterAlgoName(bwd_filter_);
    choice.workspace_bytes = static_cast<int64_t>(need);
    choice.how = ConvAlgoModeName(o.conv_algo);
    if (forcing) choice.how = std::string("forced ") + choice.how;
    if (!unsupported.empty()) {
      choice.how += " (unsupported for";
      for (const auto& u : unsupported) choice.how += " " + u;
      choice.how += ": searched)";
    }
    ctx_->RecordConvChoice(choice);
    return Status::Ok();
  }

  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  TensorDesc bias_desc_;
  cudnnConvolutionFwdAlgo_t fwd_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t bwd_data_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_ = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
};

// ---------------------------------------------------------------------------------------------

// cuDNN's activation mode of each activation (activations.h); its coef is the row's alpha (ELU's
// alpha; unused by RELU).
cudnnActivationMode_t ActivationMode(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kReLU: return CUDNN_ACTIVATION_RELU;
    case ActivationKind::kELU: return CUDNN_ACTIVATION_ELU;
  }
  return CUDNN_ACTIVATION_IDENTITY;
}

class CudaActivation : public CudaLayer {
 public:
  CudaActivation(std::shared_ptr<CudaContext> context, const LayerContext& c) : CudaLayer(std::move(context), c) {
    DP_CUDNN_THROW(cudnnCreateActivationDescriptor(&act_));
    DP_CUDNN_THROW(cudnnSetActivationDescriptor(act_, ActivationMode(c.spec->activation), CUDNN_NOT_PROPAGATE_NAN,
                                                c.spec->activation_alpha));
  }
  ~CudaActivation() override { cudnnDestroyActivationDescriptor(act_); }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    DP_CUDNN_THROW(cudnnActivationForward(ctx_->cudnn(), act_, &kOne, x_desc_.get(), bottom[0]->data, &kZero,
                                          y_desc_.get(), top[0]->data));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    Begin();
    DP_CUDNN_THROW(cudnnActivationBackward(ctx_->cudnn(), act_, &kOne, y_desc_.get(), top[0]->data,
                                           y_desc_.get(), top[0]->grad, x_desc_.get(), bottom[0]->data,
                                           &kZero, x_desc_.get(), bottom[0]->grad));
  }

 private:
  cudnnActivationDescriptor_t act_ = nullptr;
};

// PReLU from cuDNN operations, with no kernel of its own: y = relu(x) + a ⊙ (x − relu(x)), the
// slopes a (1×C×1×1, or 1×1×1×1 with channel_shared) broadcast by cudnnOpTensor; dx = p + a ⊙
// (dy − p) with p = dy ⊙ [x > 0] (cuDNN's ReLU backward, given x for relu(x): the same sign);
// da = Σ over n, h, w of dy ⊙ (x − relu(x)) by cudnnReduceTensor in the shared workspace.
class CudaPrelu : public CudaLayer {
 public:
  CudaPrelu(std::shared_ptr<CudaContext> context, const LayerContext& c) : CudaLayer(std::move(context), c) {
    DP_CUDNN_THROW(cudnnCreateActivationDescriptor(&relu_));
    DP_CUDNN_THROW(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    DP_CUDNN_THROW(cudnnCreateOpTensorDescriptor(&mul_));
    DP_CUDNN_THROW(cudnnSetOpTensorDescriptor(mul_, CUDNN_OP_TENSOR_MUL, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN));
    DP_CUDNN_THROW(cudnnCreateReduceTensorDescriptor(&sum_));
    DP_CUDNN_THROW(cudnnSetReduceTensorDescriptor(sum_, CUDNN_REDUCE_TENSOR_ADD, CUDNN_DATA_FLOAT,
                                                  CUDNN_NOT_PROPAGATE_NAN, CUDNN_REDUCE_TENSOR_NO_INDICES,
                                                  CUDNN_32BIT_INDICES));
  }
  ~CudaPrelu() override {
    cudnnDestroyActivationDescriptor(relu_);
    cudnnDestroyOpTensorDescriptor(mul_);
    cudnnDestroyReduceTensorDescriptor(sum_);
  }
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>&) override {
    DP_RETURN_IF_ERROR(a_desc_.Set({1, spec_.channel_shared ? 1 : bottom[0]->shape[1], 1, 1}));
    bytes_ = static_cast<size_t>(bottom[0]->count()) * sizeof(float);
    DP_RETURN_IF_ERROR(neg_.Resize(bytes_, "PReLU's negative part"));
    DP_RETURN_IF_ERROR(tmp_.Resize(bytes_, "PReLU's gradient scratch"));
    size_t workspace = 0;
    DP_CUDNN_RETURN(cudnnGetReductionWorkspaceSize(ctx_->cudnn(), sum_, x_desc_.get(), a_desc_.get(), &workspace));
    return ctx_->EnsureWorkspace(workspace);
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    WaitForParams();
    NegativePart(bottom[0]->data);
    DP_CUDNN_THROW(cudnnActivationForward(ctx_->cudnn(), relu_, &kOne, x_desc_.get(), bottom[0]->data, &kZero,
                                          y_desc_.get(), top[0]->data));
    DP_CUDNN_THROW(cudnnOpTensor(ctx_->cudnn(), mul_, &kOne, x_desc_.get(), neg_.floats(), &kOne, a_desc_.get(),
                                 params_[0].data, &kOne, y_desc_.get(), top[0]->data));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    Begin();
    const float *x = bottom[0]->data, *dy = top[0]->grad;
    // da first, so that the slopes' gradient is ready as early as the layer allows.
    NegativePart(x);
    DP_CUDNN_THROW(cudnnOpTensor(ctx_->cudnn(), mul_, &kOne, y_desc_.get(), dy, &kOne, x_desc_.get(), neg_.floats(),
                                 &kZero, x_desc_.get(), tmp_.floats()));
    DP_CUDNN_THROW(cudnnReduceTensor(ctx_->cudnn(), sum_, nullptr, 0, ctx_->workspace(), ctx_->workspace_bytes(), &kOne,
                                     x_desc_.get(), tmp_.floats(), &kZero, a_desc_.get(), params_[0].grad));
    ctx_->MarkParamGradsReady(params_);
    if (!down[0]) return;
    float* dx = bottom[0]->grad;
    DP_CUDNN_THROW(cudnnActivationBackward(ctx_->cudnn(), relu_, &kOne, x_desc_.get(), x, y_desc_.get(), dy,
                                           x_desc_.get(), x, &kZero, x_desc_.get(), dx));
    DP_CUDA_THROW(cudaMemcpyAsync(tmp_.get(), dy, bytes_, cudaMemcpyDeviceToDevice, ctx_->stream()));
    DP_CUDNN_THROW(cudnnAddTensor(ctx_->cudnn(), &kMinusOne, x_desc_.get(), dx, &kOne, x_desc_.get(), tmp_.floats()));
    DP_CUDNN_THROW(cudnnOpTensor(ctx_->cudnn(), mul_, &kOne, x_desc_.get(), tmp_.floats(), &kOne, a_desc_.get(),
                                 params_[0].data, &kOne, x_desc_.get(), dx));
  }

 private:
  // neg_ = x − relu(x) = min(0, x).
  void NegativePart(const float* x) {
    DP_CUDNN_THROW(
        cudnnActivationForward(ctx_->cudnn(), relu_, &kOne, x_desc_.get(), x, &kZero, x_desc_.get(), neg_.floats()));
    DP_CUDNN_THROW(cudnnAddTensor(ctx_->cudnn(), &kOne, x_desc_.get(), x, &kMinusOne, x_desc_.get(), neg_.floats()));
  }

  cudnnActivationDescriptor_t relu_ = nullptr;
  cudnnOpTensorDescriptor_t mul_ = nullptr;
  cudnnReduceTensorDescriptor_t sum_ = nullptr;
  TensorDesc a_desc_;
  size_t bytes_ = 0;
  DeviceBuffer neg_, tmp_;
};

// LRN across channels. cuDNN's formula is Caffe's: y = x (k + alpha/n Σ x²)^-beta over a window
// of n channels centred on the channel (cuDNN divides alpha by n itself).
class CudaLrn : public CudaLayer {
 public:
  CudaLrn(std::shared_ptr<CudaContext> context, const LayerContext& c) : CudaLayer(std::move(context), c) {
    DP_CUDNN_THROW(cudnnCreateLRNDescriptor(&lrn_));
  }
  ~CudaLrn() override { cudnnDestroyLRNDescriptor(lrn_); }
  Status ReshapeImpl(const std::vector<Blob*>&, const std::vector<Blob*>&) override {
    if (spec_.local_size < CUDNN_LRN_MIN_N || spec_.local_size > CUDNN_LRN_MAX_N || spec_.k < CUDNN_LRN_MIN_K ||
        spec_.beta < CUDNN_LRN_MIN_BETA)
      return InvalidArgument("LRN local_size {} k {} beta {}: cuDNN needs local_size in [{}, {}], "
                             "k >= {}, beta >= {}", spec_.local_size, spec_.k, spec_.beta, CUDNN_LRN_MIN_N,
                             CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_K, CUDNN_LRN_MIN_BETA);
    DP_CUDNN_RETURN(cudnnSetLRNDescriptor(lrn_, static_cast<unsigned>(spec_.local_size), spec_.alpha,
                                          spec_.beta, spec_.k));
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    DP_CUDNN_THROW(cudnnLRNCrossChannelForward(ctx_->cudnn(), lrn_, CUDNN_LRN_CROSS_CHANNEL_DIM1, &kOne,
                                               x_desc_.get(), bottom[0]->data, &kZero, y_desc_.get(),
                                               top[0]->data));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    Begin();
    DP_CUDNN_THROW(cudnnLRNCrossChannelBackward(ctx_->cudnn(), lrn_, CUDNN_LRN_CROSS_CHANNEL_DIM1, &kOne,
                                                y_desc_.get(), top[0]->data, y_desc_.get(), top[0]->grad,
                                                x_desc_.get(), bottom[0]->data, &kZero, x_desc_.get(),
                                                bottom[0]->grad));
  }

 private:
  cudnnLRNDescriptor_t lrn_ = nullptr;
};

// Pooling. cuDNN computes floor-rounded output sizes; where that equals Caffe's ceil-rounded
// size no window reaches past in+pad, and cuDNN runs:
//  * MAX without padding (its treatment of padding is not Caffe's contract): all of AlexNet's pools;
//  * AVE with or without padding, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: every window then
//    lies inside the zero-padded input, so Caffe's divisor is kh·kw, which is what that mode uses.
// Other geometries (the ceil overhang; MAX with padding) run the kernels of cuda_kernels.h,
// which are the reference algorithm line for line (MAX with an argmax, AVE with Caffe's
// pool_size counted over the padded input before clipping).
class CudaPool : public CudaLayer {
 public:
  CudaPool(std::shared_ptr<CudaContext> context, const LayerContext& c) : CudaLayer(std::move(context), c) {
    DP_CUDNN_THROW(cudnnCreatePoolingDescriptor(&pool_));
  }
  ~CudaPool() override { cudnnDestroyPoolingDescriptor(pool_); }
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    shape_ = {x[0], x[1], x[2], x[3], spec_.kernel_h, spec_.kernel_w, spec_.stride_h, spec_.stride_w,
              spec_.pad_h, spec_.pad_w, y[2], y[3]};
    ave_ = spec_.pool == PoolMethod::kAve;
    const cudnnPoolingMode_t mode =
        ave_ ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_MAX_DETERMINISTIC;
    DP_CUDNN_RETURN(cudnnSetPooling2dDescriptor(pool_, mode, CUDNN_NOT_PROPAGATE_NAN, spec_.kernel_h, spec_.kernel_w,
                                                spec_.pad_h, spec_.pad_w, spec_.stride_h, spec_.stride_w));
    int n = 0, c = 0, h = 0, w = 0;
    DP_CUDNN_RETURN(cudnnGetPooling2dForwardOutputDim(pool_, x_desc_.get(), &n, &c, &h, &w));
    const bool floor_is_ceil = h == y[2] && w == y[3];
    use_cudnn_ = floor_is_ceil && (ave_ || (spec_.pad_h == 0 && spec_.pad_w == 0));
    if (!use_cudnn_ && !ave_)
      DP_RETURN_IF_ERROR(argmax_.Resize(static_cast<size_t>(top[0]->count()) * sizeof(int), "pooling argmax"));
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    if (use_cudnn_)
      DP_CUDNN_THROW(cudnnPoolingForward(ctx_->cudnn(), pool_, &kOne, x_desc_.get(), bottom[0]->data, &kZero,
                                         y_desc_.get(), top[0]->data));
    else if (ave_)
      DP_CUDA_THROW(AvePoolForward(ctx_->stream(), shape_, bottom[0]->data, top[0]->data));
    else
      DP_CUDA_THROW(MaxPoolForward(ctx_->stream(), shape_, bottom[0]->data, top[0]->data,
                                   static_cast<int*>(argmax_.get())));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    Begin();
    if (use_cudnn_)
      DP_CUDNN_THROW(cudnnPoolingBackward(ctx_->cudnn(), pool_, &kOne, y_desc_.get(), top[0]->data,
                                          y_desc_.get(), top[0]->grad, x_desc_.get(), bottom[0]->data, &kZero,
                                          x_desc_.get(), bottom[0]->grad));
    else if (ave_)
      DP_CUDA_THROW(AvePoolBackward(ctx_->stream(), shape_, top[0]->grad, bottom[0]->grad));
    else
      DP_CUDA_THROW(MaxPoolBackward(ctx_->stream(), shape_, static_cast<const int*>(argmax_.get()),
                                    top[0]->grad, bottom[0]->grad));
  }

 private:
  cudnnPoolingDescriptor_t pool_ = nullptr;
  PoolShape shape_{};
  bool ave_ = false;
  bool use_cudnn_ = true;
  DeviceBuffer argmax_;  // MAX on the kernel path only
};

// y (N,O) = x (N,K) · Wᵀ + b, in column-major terms yᵀ (O×N) = W (K×O)ᵀ · xᵀ (K×N).
class CudaInnerProduct : public CudaLayer {
 public:
  using CudaLayer::CudaLayer;
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>&) override {
    n_ = bottom[0]->shape[0];
    k_ = static_cast<int>(bottom[0]->count() / n_);
    o_ = spec_.num_output;
    if (params_[0].spec.numel() != int64_t(o_) * k_)
      return InvalidArgument("inner product weight of {} floats does not match input {} (O×K = {}×{})",
                             params_[0].spec.numel(), ShapeString(bottom[0]->shape), o_, k_);
    return ctx_->EnsureOnes(n_);
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    WaitForParams();
    DP_CUBLAS_THROW(cublasSgemm(ctx_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, o_, n_, k_, &kOne, params_[0].data,
                                k_, bottom[0]->data, k_, &kZero, top[0]->data, o_));
    if (bias_data())  // yᵀ (O×N) += b (O×1) · 1ᵀ (1×N)
      DP_CUBLAS_THROW(cublasSgemm(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, o_, n_, 1, &kOne, bias_data(), o_,
                                  ctx_->ones(), 1, &kOne, top[0]->data, o_));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    Begin();
    // dW (O×K row-major = K×O col-major) = xᵀ (K×N) · dy (N×O as the transpose of O×N); not
    // needed while the net sends sufficient factors for this layer.
    if (!skip_weight_grad_)
      DP_CUBLAS_THROW(cublasSgemm(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, k_, o_, n_, &kOne, bottom[0]->data,
                                  k_, top[0]->grad, o_, &kZero, params_[0].grad, k_));
    if (bias_grad())  // db (O) = dyᵀ (O×N) · 1 (N)
      DP_CUBLAS_THROW(cublasSgemv(ctx_->cublas(), CUBLAS_OP_N, o_, n_, &kOne, top[0]->grad, o_, ctx_->ones(), 1,
                                  &kZero, bias_grad(), 1));
    ctx_->MarkParamGradsReady(params_);
    if (down[0])  // dxᵀ (K×N) = W (K×O col-major) · dyᵀ (O×N)
      DP_CUBLAS_THROW(cublasSgemm(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, k_, n_, o_, &kOne, params_[0].data,
                                  k_, top[0]->grad, o_, &kZero, bottom[0]->grad, k_));
  }

 private:
  int n_ = 0, k_ = 0, o_ = 0;
};

// Inverted dropout with the same counter-based mask as the CPU backends (fillers.h).
class CudaDropout : public CudaLayer {
 public:
  using CudaLayer::CudaLayer;
  void SetStep(int64_t step) override { step_ = step; }
  Status ReshapeImpl(const std::vector<Blob*>&, const std::vector<Blob*>& top) override {
    if (!(spec_.dropout_ratio >= 0.0f && spec_.dropout_ratio < 1.0f))
      return InvalidArgument("dropout_ratio {} must be in [0, 1)", spec_.dropout_ratio);
    return mask_.Resize(static_cast<size_t>(top[0]->count()) * sizeof(float), "the dropout mask");
  }
  void Forward(Phase phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    // Test phase: ratio 0 gives a mask of ones, y = x.
    const float ratio = phase == Phase::kTrain ? spec_.dropout_ratio : 0.0f;
    DP_CUDA_THROW(DropoutForward(ctx_->stream(), bottom[0]->count(), seed_, static_cast<uint64_t>(step_),
                                 ratio, bottom[0]->data, mask_.floats(), top[0]->data));
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    Begin();
    DP_CUDA_THROW(DropoutBackward(ctx_->stream(), bottom[0]->count(), mask_.floats(), top[0]->grad,
                                  bottom[0]->grad));
  }

 private:
  int64_t step_ = 0;
  DeviceBuffer mask_;
};

// Softmax (cuDNN, max-subtracted) → mean cross-entropy (kernel). prob (N,K) kept for backward.
class CudaSoftmaxLoss : public CudaLayer {
 public:
  using CudaLayer::CudaLayer;
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>&) override {
    if (bottom[0]->shape.size() != 2)
      return InvalidArgument("softmax loss takes (N,K) scores, got {}", ShapeString(bottom[0]->shape));
    return prob_.Resize(static_cast<size_t>(bottom[0]->count()) * sizeof(float), "softmax probabilities");
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    DP_CUDNN_THROW(cudnnSoftmaxForward(ctx_->cudnn(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, &kOne,
                                       x_desc_.get(), bottom[0]->data, &kZero, x_desc_.get(), prob_.floats()));
    DP_CUDA_THROW(SoftmaxLossForward(ctx_->stream(), bottom[0]->shape[0], bottom[0]->shape[1], prob_.floats(),
                                     bottom[1]->data, top[0]->data));
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    Begin();
    DP_CUDA_THROW(SoftmaxLossBackward(ctx_->stream(), bottom[0]->shape[0], bottom[0]->shape[1], prob_.floats(),
                                      bottom[1]->data, bottom[0]->grad));
  }

 private:
  DeviceBuffer prob_;
};

class CudaAccuracy : public CudaLayer {
 public:
  using CudaLayer::CudaLayer;
  bool HasBackward() const override { return false; }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    Begin();
    DP_CUDA_THROW(Accuracy(ctx_->stream(), bottom[0]->shape[0], bottom[0]->shape[1], bottom[0]->data,
                           bottom[1]->data, spec_.top_k, top[0]->data));
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>&, const std::vector<Blob*>&) override {}
};

}  // namespace

Status CreateCudaLayer(std::shared_ptr<CudaContext> context, const LayerContext& c,
                       std::unique_ptr<Layer>* layer) {
  try {
    switch (c.spec->type) {
      case LayerType::kConvolution: *layer = std::make_unique<CudaConv>(std::move(context), c); break;
      case LayerType::kActivation: *layer = std::make_unique<CudaActivation>(std::move(context), c); break;
      case LayerType::kLRN: *layer = std::make_unique<CudaLrn>(std::move(context), c); break;
      case LayerType::kPooling: *layer = std::make_unique<CudaPool>(std::move(context), c); break;
      case LayerType::kInnerProduct: *layer = std::make_unique<CudaInnerProduct>(std::move(context), c); break;
      case LayerType::kDropout: *layer = std::make_unique<CudaDropout>(std::move(context), c); break;
      case LayerType::kSoftmaxWithLoss: *layer = std::make_unique<CudaSoftmaxLoss>(std::move(context), c); break;
      case LayerType::kAccuracy: *layer = std::make_unique<CudaAccuracy>(std::move(context), c); break;
      case LayerType::kPReLU:
        *layer = std::make_unique<CudaPrelu>(std::move(context), c);
        break;
    }
  } catch (const Error& e) {  // descriptor creation failed
    return Status(e.status().code(), fmt::format("layer '{}': {}", c.spec->name, e.status().message()));
  }
  if (*layer == nullptr)
    return InvalidArgument("layer '{}': type {} has no GPU implementation", c.spec->name,
                           static_cast<int>(c.spec->type));
  return Status::Ok();
}

}  // namespace downpour::engine::gpu
