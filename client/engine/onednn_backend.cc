// onednn_backend.cc — see onednn_backend.h.
#include "client/engine/onednn_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "client/engine/fillers.h"
#include "client/engine/ref_kernels.h"

namespace downpour::engine {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

memory::dims Dims(const std::vector<int>& shape) { return memory::dims(shape.begin(), shape.end()); }

memory::desc PlainDesc(const std::vector<int>& shape) {
  switch (shape.size()) {
    case 1: return memory::desc(Dims(shape), dt::f32, tag::a);
    case 2: return memory::desc(Dims(shape), dt::f32, tag::ab);
    case 4: return memory::desc(Dims(shape), dt::f32, tag::abcd);
    default: DP_CHECK(false && "blob rank must be 1, 2 or 4");
  }
  return {};
}

memory::desc DescOf(const Blob& b) {
  if (b.format) return *std::static_pointer_cast<memory::desc>(b.format);
  return PlainDesc(b.shape);
}

// True when oneDNN chose its reference (naive, unvectorised) kernel for `pd`: "ref:any" and
// the like, against "jit:avx2", "gemm:jit", "brgconv:avx512_core", ...
bool IsReferenceKernel(const dnnl::primitive_desc_base& pd) {
  return std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
}

// Float storage for a memory descriptor (blocked layouts may pad channels), zeroed so the
// padding stays zero through elementwise ops.
struct Buffer {
  std::vector<float> v;
  void Resize(const memory::desc& md) { v.assign(md.get_size() / sizeof(float) + 1, 0.0f); }
  float* data() { return v.data(); }
};

// Shared per-backend state handed to every layer.
struct Ctx {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
};

// A reorder between two descriptors over caller buffers, built once per Reshape.
struct Reorder {
  bool needed = false;
  memory::desc from, to;
  dnnl::reorder prim;
  void Init(Ctx& c, const memory::desc& f, const memory::desc& t) {
    from = f;
    to = t;
    needed = f != t;
    if (needed) prim = dnnl::reorder(dnnl::reorder::primitive_desc(c.eng, f, c.eng, t));
  }
  void Run(Ctx& c, float* src, float* dst) {
    memory s(from, c.eng, src), d(to, c.eng, dst);
    prim.execute(c.stream, s, d);
  }
};

class DnnLayer : public Layer {
 public:
  DnnLayer(Ctx* ctx, const LayerContext& lc) : c_(*ctx), spec_(*lc.spec), params_(lc.params), seed_(lc.seed) {}

 protected:
  // Gives top[0] storage in `md` and records md as its format.
  void AllocTop(Blob* top, const memory::desc& md) {
    top_data_.Resize(md);
    top_grad_.Resize(md);
    top->data = top_data_.data();
    top->grad = top_grad_.data();
    const memory::desc plain = PlainDesc(top->shape);
    top->format = md == plain ? nullptr : std::make_shared<memory::desc>(md);
  }
  memory Mem(const memory::desc& md, float* p) { return memory(md, c_.eng, p); }
  void Wait() { c_.stream.wait(); }

  Ctx& c_;
  LayerSpec spec_;
  std::vector<ParamSlot> params_;
  uint64_t seed_;
  Buffer top_data_, top_grad_;
};

class DnnConv : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    const int g = spec_.group;
    bottom_md_ = DescOf(*bottom[0]);
    memory::dims wdims = g == 1 ? memory::dims{y[1], x[1], spec_.kernel_h, spec_.kernel_w}
                                : memory::dims{g, y[1] / g, x[1] / g, spec_.kernel_h, spec_.kernel_w};
    user_w_md_ = memory::desc(wdims, dt::f32, g == 1 ? tag::oihw : tag::goihw);
    const memory::desc any_src(Dims(x), dt::f32, tag::any), any_dst(Dims(y), dt::f32, tag::any),
        any_w(wdims, dt::f32, tag::any), bias_md({y[1]}, dt::f32, tag::a);
    has_bias_ = params_.size() > 1;
    const memory::dims strides{spec_.stride_h, spec_.stride_w}, pad{spec_.pad_h, spec_.pad_w};
    // Caffe floors the output size; oneDNN's size check floors too, so symmetric padding fits.
    const memory::dims pad_r = pad;
    // One input channel (a grayscale net's first layer), no groups, a plain input: oneDNN v2's
    // AVX2 backward-weights kernel runs this far below the machine's speed (bench/RESULTS.md
    // §12.5), so the weight gradient is an im2col of the whole batch and one sgemm instead.
    // Inputs of more channels keep oneDNN's kernel, which is fast for them, and so does a batch
    // whose patches would take more than kMaxColFloats.
    constexpr int64_t kMaxColFloats = int64_t{32} << 20;  // 128 MB
    const int64_t k = int64_t(spec_.kernel_h) * spec_.kernel_w + 1, np = int64_t(y[0]) * y[2] * y[3];
    col_path_ = g == 1 && x[1] == 1 && bottom_md_ == PlainDesc(x) && np * k <= kMaxColFloats;
    try {
      auto fd = has_bias_ ? dnnl::convolution_forward::desc(
                                dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                any_src, any_w, bias_md, any_dst, strides, pad, pad_r)
                          : dnnl::convolution_forward::desc(
                                dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                any_src, any_w, any_dst, strides, pad, pad_r);
      fwd_pd_ = dnnl::convolution_forward::primitive_desc(fd, c_.eng);
      src_md_ = fwd_pd_.src_desc();
      w_md_ = fwd_pd_.weights_desc();
      dst_md_ = fwd_pd_.dst_desc();
      fwd_ = dnnl::convolution_forward(fwd_pd_);
      // Backward-data gets its own weight layout: with the forward's (e.g. ABcd16b16a)
      // oneDNN v2 falls back to its reference kernel, far slower than the JIT one.
      dnnl::convolution_backward_data::desc bdd(dnnl::algorithm::convolution_direct, src_md_, any_w,
                                                dst_md_, strides, pad, pad_r);
      bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(bdd, c_.eng, fwd_pd_);
      bwd_data_w_md_ = bwd_data_pd_.weights_desc();
      bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
      const memory::desc any_dw(wdims, dt::f32, tag::any);
      auto bwd_w_pd = [&](const memory::desc& src, const memory::desc& diff_dst) {
        auto bwd = has_bias_ ? dnnl::convolution_backward_weights::desc(
                                   dnnl::algorithm::convolution_direct, src, any_dw, bias_md, diff_dst,
                                   strides, pad, pad_r)
                             : dnnl::convolution_backward_weights::desc(
                                   dnnl::algorithm::convolution_direct, src, any_dw, diff_dst, strides,
                                   pad, pad_r);
        return dnnl::convolution_backward_weights::primitive_desc(bwd, c_.eng, fwd_pd_);
      };
      // The forward's layouts first (no reorders). On AVX2 (no AVX-512) oneDNN v2 has no JIT
      // backward-weights kernel for a first layer with one input channel in those layouts
      // (src abcd, diff_dst aBcd8b) and takes its reference kernel, most of fmnist_small's step
      // (bench/RESULTS.md §2, "On an AVX2-only VM"). Then let oneDNN choose both layouts, then
      // plain ones (its GEMM-based kernel); the src and diff_dst are reordered into what the
      // chosen kernel reads.
      // Not built on the one-channel path (OneChannelWeightGrad).
      if (!col_path_) {
        bwd_w_pd_ = bwd_w_pd(src_md_, dst_md_);
        const memory::desc plain_src = PlainDesc(x), plain_dst = PlainDesc(y);
        for (const auto& [s, d] : {std::pair{any_src, any_dst}, std::pair{plain_src, plain_dst}}) {
          if (!IsReferenceKernel(bwd_w_pd_)) break;
          try {
            auto pd = bwd_w_pd(s, d);
            if (!IsReferenceKernel(pd)) bwd_w_pd_ = pd;
          } catch (const dnnl::error&) {
            // This layout has no kernel at all; keep the one we have.
          }
        }
        bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd_);
      }
    } catch (const dnnl::error& e) {
      return InvalidArgument("oneDNN convolution setup failed for input {}: {}", ShapeString(x), e.what());
    }
    // Edges of this layer: input layout, weight layouts (canonical ↔ preferred).
    src_reorder_.Init(c_, bottom_md_, src_md_);
    if (src_reorder_.needed) src_buf_.Resize(src_md_);
    diff_src_reorder_.Init(c_, src_md_, bottom_md_);
    if (diff_src_reorder_.needed) diff_src_buf_.Resize(src_md_);
    w_reorder_.Init(c_, user_w_md_, w_md_);
    if (w_reorder_.needed) w_buf_.Resize(w_md_);
    bwd_data_w_reorder_.Init(c_, user_w_md_, bwd_data_w_md_);
    if (bwd_data_w_reorder_.needed) bwd_data_w_buf_.Resize(bwd_data_w_md_);
    if (!col_path_) {
      bwd_w_src_reorder_.Init(c_, src_md_, bwd_w_pd_.src_desc());
      if (bwd_w_src_reorder_.needed) bwd_w_src_buf_.Resize(bwd_w_pd_.src_desc());
      bwd_w_diff_dst_reorder_.Init(c_, dst_md_, bwd_w_pd_.diff_dst_desc());
      if (bwd_w_diff_dst_reorder_.needed) bwd_w_diff_dst_buf_.Resize(bwd_w_pd_.diff_dst_desc());
      dw_reorder_.Init(c_, bwd_w_pd_.diff_weights_desc(), user_w_md_);
      if (dw_reorder_.needed) dw_buf_.Resize(bwd_w_pd_.diff_weights_desc());
    }
    if (col_path_) {
      col_.assign(np * k, 1.0f);  // column k - 1 stays 1: the bias gradient's
      col_dw_.assign(int64_t(y[1]) * k, 0.0f);
      const memory::desc channels_first(Dims(y), dt::f32, tag::bacd);  // O × N × H × W
      col_dy_reorder_.Init(c_, dst_md_, channels_first);
      col_dy_buf_.Resize(channels_first);
    }
    AllocTop(top[0], dst_md_);
    return Status::Ok();
  }

  std::string KernelNames() const override {
    return std::string("fwd ") + fwd_pd_.impl_info_str() + ", bwd_data " + bwd_data_pd_.impl_info_str() +
           ", bwd_weights " + (col_path_ ? "im2col+sgemm" : bwd_w_pd_.impl_info_str());
  }

  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    float* src = bottom[0]->data;
    if (src_reorder_.needed) {
      src_reorder_.Run(c_, src, src_buf_.data());
      src = src_buf_.data();
    }
    float* w = params_[0].data;
    if (w_reorder_.needed) {
      w_reorder_.Run(c_, w, w_buf_.data());
      w = w_buf_.data();
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, Mem(src_md_, src)},
                                         {DNNL_ARG_WEIGHTS, Mem(w_md_, w)},
                                         {DNNL_ARG_DST, Mem(dst_md_, top[0]->data)}};
    if (has_bias_) args.emplace(DNNL_ARG_BIAS, Mem(fwd_pd_.bias_desc(), params_[1].data));
    fwd_.execute(c_.stream, args);
    Wait();
  }

  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (col_path_) {
      OneChannelWeightGrad(*bottom[0], *top[0]);
    } else {
      OnednnWeightGrad(top, bottom);
    }
    if (down[0]) {
      float* dsrc = diff_src_reorder_.needed ? diff_src_buf_.data() : bottom[0]->grad;
      float* w = params_[0].data;
      if (bwd_data_w_reorder_.needed) {
        bwd_data_w_reorder_.Run(c_, w, bwd_data_w_buf_.data());
        w = bwd_data_w_buf_.data();
      }
      bwd_data_.execute(c_.stream, {{DNNL_ARG_DIFF_DST, Mem(dst_md_, top[0]->grad)},
                                    {DNNL_ARG_WEIGHTS, Mem(bwd_data_w_md_, w)},
                                    {DNNL_ARG_DIFF_SRC, Mem(src_md_, dsrc)}});
      if (diff_src_reorder_.needed) diff_src_reorder_.Run(c_, dsrc, bottom[0]->grad);
    }
    Wait();
  }

 private:
  // [dW | db] (O × kh·kw+1) = dY (O × N·P) · col (N·P × kh·kw+1): dY reordered channels first,
  // col every output pixel's patch and a 1 (so db, dY's row sums, comes out of the same sgemm),
  // P the pixels of one image. Plain OIHW weights (g = 1).
  void OneChannelWeightGrad(const Blob& bottom, const Blob& top) {
    const float* dy = top.grad;
    if (col_dy_reorder_.needed) {
      col_dy_reorder_.Run(c_, top.grad, col_dy_buf_.data());
      Wait();
      dy = col_dy_buf_.data();
    }
    const int n = top.shape[0], o = top.shape[1], oh = top.shape[2], ow = top.shape[3];
    const int h = bottom.shape[2], w = bottom.shape[3];
    const int kh = spec_.kernel_h, kw = spec_.kernel_w, k = kh * kw + 1;
    const int64_t np = int64_t(n) * oh * ow;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* x = bottom.data + int64_t(i) * h * w;
      float* patch = col_.data() + int64_t(i) * oh * ow * k;
      for (int r = 0; r < oh; ++r)
        for (int c = 0; c < ow; ++c, patch += k)
          for (int a = 0; a < kh; ++a) {
            const int yy = r * spec_.stride_h - spec_.pad_h + a;
            for (int b = 0; b < kw; ++b) {
              const int xx = c * spec_.stride_w - spec_.pad_w + b;
              patch[a * kw + b] = yy >= 0 && yy < h && xx >= 0 && xx < w ? x[yy * w + xx] : 0.0f;
            }
          }
    }
    const dnnl_status_t st = dnnl_sgemm('N', 'N', o, k, np, 1.0f, dy, np, col_.data(), k, 0.0f, col_dw_.data(), k);
    DP_CHECK_EQ(static_cast<int>(st), static_cast<int>(dnnl_success));
    for (int j = 0; j < o; ++j) {
      std::copy_n(col_dw_.data() + int64_t(j) * k, k - 1, params_[0].grad + int64_t(j) * (k - 1));
      if (has_bias_) params_[1].grad[j] = col_dw_[int64_t(j) * k + k - 1];
    }
  }

  void OnednnWeightGrad(const std::vector<Blob*>& top, const std::vector<Blob*>& bottom) {
    float* src = src_reorder_.needed ? src_buf_.data() : bottom[0]->data;  // forward's copy
    float* dw = dw_reorder_.needed ? dw_buf_.data() : params_[0].grad;
    // The backward-weights kernel's own layouts, when it reads others than the forward's.
    float* w_src = src;
    if (bwd_w_src_reorder_.needed) {
      bwd_w_src_reorder_.Run(c_, src, bwd_w_src_buf_.data());
      w_src = bwd_w_src_buf_.data();
    }
    float* w_diff_dst = top[0]->grad;
    if (bwd_w_diff_dst_reorder_.needed) {
      bwd_w_diff_dst_reorder_.Run(c_, top[0]->grad, bwd_w_diff_dst_buf_.data());
      w_diff_dst = bwd_w_diff_dst_buf_.data();
    }
    std::unordered_map<int, memory> wargs{{DNNL_ARG_SRC, Mem(bwd_w_pd_.src_desc(), w_src)},
                                          {DNNL_ARG_DIFF_DST, Mem(bwd_w_pd_.diff_dst_desc(), w_diff_dst)},
                                          {DNNL_ARG_DIFF_WEIGHTS, Mem(bwd_w_pd_.diff_weights_desc(), dw)}};
    if (has_bias_) wargs.emplace(DNNL_ARG_DIFF_BIAS, Mem(bwd_w_pd_.diff_bias_desc(), params_[1].grad));
    bwd_w_.execute(c_.stream, wargs);
    if (dw_reorder_.needed) dw_reorder_.Run(c_, dw_buf_.data(), params_[0].grad);
  }

  bool has_bias_ = false;
  bool col_path_ = false;          // OneChannelWeightGrad instead of bwd_w_
  std::vector<float> col_;         // every output pixel's patch and a 1, N·P × (kh·kw + 1)
  std::vector<float> col_dw_;      // [dW | db], O × (kh·kw + 1)
  Reorder col_dy_reorder_;         // dY into channels-first O × N × H × W for it
  Buffer col_dy_buf_;
  memory::desc bottom_md_, user_w_md_, src_md_, w_md_, dst_md_, bwd_data_w_md_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::convolution_backward_weights bwd_w_;
  Reorder src_reorder_, diff_src_reorder_, w_reorder_, dw_reorder_, bwd_data_w_reorder_;
  Reorder bwd_w_src_reorder_, bwd_w_diff_dst_reorder_;
  Buffer src_buf_, diff_src_buf_, w_buf_, dw_buf_, bwd_data_w_buf_, bwd_w_src_buf_, bwd_w_diff_dst_buf_;
};

// oneDNN's eltwise algorithm of each activation (activations.h), whose alpha is the row's.
dnnl::algorithm ActivationAlgorithm(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kReLU: return dnnl::algorithm::eltwise_relu;  // alpha: the negative slope, 0
    case ActivationKind::kELU: return dnnl::algorithm::eltwise_elu;
  }
  return dnnl::algorithm::undef;
}

class DnnActivation : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    md_ = DescOf(*bottom[0]);
    const dnnl::algorithm algorithm = ActivationAlgorithm(spec_.activation);
    const float alpha = spec_.activation_alpha;
    dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training, algorithm, md_, alpha);
    auto fpd = dnnl::eltwise_forward::primitive_desc(fd, c_.eng);
    fwd_ = dnnl::eltwise_forward(fpd);
    dnnl::eltwise_backward::desc bd(algorithm, md_, md_, alpha);
    bwd_ = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(bd, c_.eng, fpd));
    AllocTop(top[0], md_);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    fwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)}, {DNNL_ARG_DST, Mem(md_, top[0]->data)}});
    Wait();
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    bwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)},
                             {DNNL_ARG_DIFF_DST, Mem(md_, top[0]->grad)},
                             {DNNL_ARG_DIFF_SRC, Mem(md_, bottom[0]->grad)}});
    Wait();
  }

 private:
  memory::desc md_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

// PReLU on oneDNN's prelu primitive: the slopes (canonical (C), or (1) with channel_shared) are
// a 1×C×1×1 (1×1×1×1) plain weights tensor broadcast over the activation in its own layout; the
// backward writes the slopes' gradient whether or not the bottom wants one.
class DnnPrelu : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    md_ = DescOf(*bottom[0]);
    const memory::dim c = spec_.channel_shared ? 1 : bottom[0]->shape[1];
    w_md_ = memory::desc({1, c, 1, 1}, dt::f32, tag::abcd);
    try {
      dnnl::prelu_forward::desc fd(dnnl::prop_kind::forward_training, md_, w_md_);
      auto fpd = dnnl::prelu_forward::primitive_desc(fd, c_.eng);
      fwd_ = dnnl::prelu_forward(fpd);
      dnnl::prelu_backward::desc bd(md_, w_md_, md_, w_md_);
      bwd_ = dnnl::prelu_backward(dnnl::prelu_backward::primitive_desc(bd, c_.eng, fpd));
    } catch (const dnnl::error& e) {
      return InvalidArgument("oneDNN PReLU setup failed for input {}: {}", ShapeString(bottom[0]->shape), e.what());
    }
    scratch_.Resize(md_);
    AllocTop(top[0], md_);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    fwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)},
                             {DNNL_ARG_WEIGHTS, Mem(w_md_, params_[0].data)},
                             {DNNL_ARG_DST, Mem(md_, top[0]->data)}});
    Wait();
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    float* dx = down[0] ? bottom[0]->grad : scratch_.data();
    bwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)},
                             {DNNL_ARG_WEIGHTS, Mem(w_md_, params_[0].data)},
                             {DNNL_ARG_DIFF_DST, Mem(md_, top[0]->grad)},
                             {DNNL_ARG_DIFF_SRC, Mem(md_, dx)},
                             {DNNL_ARG_DIFF_WEIGHTS, Mem(w_md_, params_[0].grad)}});
    Wait();
  }

 private:
  memory::desc md_, w_md_;
  dnnl::prelu_forward fwd_;
  dnnl::prelu_backward bwd_;
  Buffer scratch_;  // the bottom's gradient when it takes none
};

class DnnLrn : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    md_ = DescOf(*bottom[0]);
    // oneDNN's across-channel LRN divides alpha by local_size, exactly as Caffe does.
    dnnl::lrn_forward::desc fd(dnnl::prop_kind::forward_training, dnnl::algorithm::lrn_across_channels,
                               md_, spec_.local_size, spec_.alpha, spec_.beta, spec_.k);
    fwd_pd_ = dnnl::lrn_forward::primitive_desc(fd, c_.eng);
    fwd_ = dnnl::lrn_forward(fwd_pd_);
    dnnl::lrn_backward::desc bd(dnnl::algorithm::lrn_across_channels, md_, md_, spec_.local_size,
                                spec_.alpha, spec_.beta, spec_.k);
    bwd_ = dnnl::lrn_backward(dnnl::lrn_backward::primitive_desc(bd, c_.eng, fwd_pd_));
    ws_.Resize(fwd_pd_.workspace_desc());
    AllocTop(top[0], md_);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    fwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)},
                             {DNNL_ARG_DST, Mem(md_, top[0]->data)},
                             {DNNL_ARG_WORKSPACE, Mem(fwd_pd_.workspace_desc(), ws_.data())}});
    Wait();
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    bwd_.execute(c_.stream, {{DNNL_ARG_SRC, Mem(md_, bottom[0]->data)},
                             {DNNL_ARG_DIFF_DST, Mem(md_, top[0]->grad)},
                             {DNNL_ARG_WORKSPACE, Mem(fwd_pd_.workspace_desc(), ws_.data())},
                             {DNNL_ARG_DIFF_SRC, Mem(md_, bottom[0]->grad)}});
    Wait();
  }

 private:
  memory::desc md_;
  dnnl::lrn_forward::primitive_desc fwd_pd_;
  dnnl::lrn_forward fwd_;
  dnnl::lrn_backward bwd_;
  Buffer ws_;
};

// The format tag of a 4-D activation layout among those oneDNN picks for our layers, so a
// buffer of other dims can be given the same layout; plain NCHW when it is none of them.
tag Tag4dOf(const memory::desc& md) {
  for (tag t : {tag::nChw16c, tag::nChw8c, tag::nhwc, tag::nchw})
    if (memory::desc(md.dims(), dt::f32, t) == md) return t;
  return tag::nchw;
}

// Pooling with Caffe's ceil-rounded output size, which oneDNN sees as extra right/bottom
// padding `ext` = (out-1)·stride + kernel − in − pad per dimension (clamped at 0: when Caffe
// drops a last window that would start in the padding, ext comes out negative, and 0 gives
// the same output size — oneDNN's max pooling refuses negative padding).
//  * MAX: pooling_max; padded cells never win.
//  * AVE: Caffe divides each window's sum by its size counted over the zero-padded input
//    [-pad, in+pad), NOT over the ceil overhang past in+pad. oneDNN's two average modes match
//    that exactly when
//      - pad = 0: avg_exclude_padding (the divisor is the window clipped to the input), or
//      - no window reaches past in+pad (ext <= pad): avg_include_padding (divisor kh·kw);
//    otherwise the input is copied into a buffer with explicit zero borders (pad before,
//    min(ext, pad) after; same layout) and avg_exclude_padding runs on it with only the
//    overhang past in+pad as implicit padding. Backward runs on a padded gradient buffer and
//    copies its interior back. The borders are zeroed once and never written.
class DnnPool : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    const int ph = spec_.pad_h, pw = spec_.pad_w;
    const int ext_h = std::max(0, (y[2] - 1) * spec_.stride_h + spec_.kernel_h - x[2] - ph);
    const int ext_w = std::max(0, (y[3] - 1) * spec_.stride_w + spec_.kernel_w - x[3] - pw);
    bottom_md_ = DescOf(*bottom[0]);
    src_md_ = bottom_md_;
    explicit_pad_ = false;
    memory::dims pad_l{ph, pw}, pad_r{ext_h, ext_w};
    dnnl::algorithm alg = dnnl::algorithm::pooling_max;
    if (spec_.pool == PoolMethod::kAve) {
      if (ph == 0 && pw == 0) {
        alg = dnnl::algorithm::pooling_avg_exclude_padding;
      } else if (ext_h <= ph && ext_w <= pw) {
        alg = dnnl::algorithm::pooling_avg_include_padding;
      } else {
        alg = dnnl::algorithm::pooling_avg_exclude_padding;
        explicit_pad_ = true;
        const int after_h = std::min(ext_h, ph), after_w = std::min(ext_w, pw);
        src_md_ = memory::desc({x[0], x[1], x[2] + ph + after_h, x[3] + pw + after_w}, dt::f32, Tag4dOf(bottom_md_));
        const memory::desc interior = src_md_.submemory_desc(Dims(x), {0, 0, ph, pw});
        to_padded_.Init(c_, bottom_md_, interior);
        from_padded_.Init(c_, interior, bottom_md_);
        padded_src_.Resize(src_md_);
        padded_diff_.Resize(src_md_);
        pad_l = {0, 0};
        pad_r = {ext_h - after_h, ext_w - after_w};
      }
    }
    const memory::desc any_dst(Dims(y), dt::f32, tag::any);
    const memory::dims strides{spec_.stride_h, spec_.stride_w}, kernel{spec_.kernel_h, spec_.kernel_w};
    try {
      dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_md_, any_dst, strides, kernel, pad_l,
                                     pad_r);
      fwd_pd_ = dnnl::pooling_forward::primitive_desc(fd, c_.eng);
      dst_md_ = fwd_pd_.dst_desc();
      fwd_ = dnnl::pooling_forward(fwd_pd_);
      dnnl::pooling_backward::desc bd(alg, src_md_, dst_md_, strides, kernel, pad_l, pad_r);
      bwd_ = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(bd, c_.eng, fwd_pd_));
    } catch (const dnnl::error& e) {
      return InvalidArgument("oneDNN {} pooling setup failed for input {}: {}", PoolMethodName(spec_.pool),
                             ShapeString(x), e.what());
    }
    has_ws_ = fwd_pd_.workspace_desc().get_size() > 0;  // max keeps its argmax there; average has none
    ws_.Resize(fwd_pd_.workspace_desc());
    AllocTop(top[0], dst_md_);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    float* src = bottom[0]->data;
    if (explicit_pad_) {
      to_padded_.Run(c_, src, padded_src_.data());
      src = padded_src_.data();
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, Mem(src_md_, src)}, {DNNL_ARG_DST, Mem(dst_md_, top[0]->data)}};
    if (has_ws_) args.emplace(DNNL_ARG_WORKSPACE, Mem(fwd_pd_.workspace_desc(), ws_.data()));
    fwd_.execute(c_.stream, args);
    Wait();
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    float* dsrc = explicit_pad_ ? padded_diff_.data() : bottom[0]->grad;
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, Mem(dst_md_, top[0]->grad)},
                                         {DNNL_ARG_DIFF_SRC, Mem(src_md_, dsrc)}};
    if (has_ws_) args.emplace(DNNL_ARG_WORKSPACE, Mem(fwd_pd_.workspace_desc(), ws_.data()));
    bwd_.execute(c_.stream, args);
    if (explicit_pad_) from_padded_.Run(c_, padded_diff_.data(), bottom[0]->grad);
    Wait();
  }

 private:
  bool explicit_pad_ = false;  // AVE with a ceil overhang past the padding (see above)
  bool has_ws_ = false;
  memory::desc bottom_md_, src_md_, dst_md_;  // src_md_: the padded copy's when explicit_pad_
  dnnl::pooling_forward::primitive_desc fwd_pd_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
  Reorder to_padded_, from_padded_;
  Buffer ws_, padded_src_, padded_diff_;
};

class DnnInnerProduct : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int n = bottom[0]->shape[0];
    const int k = static_cast<int>(bottom[0]->count() / n);
    const int o = spec_.num_output;
    bottom_md_ = DescOf(*bottom[0]);
    // The edge: whatever layout the bottom has, the inner product sees plain N×K (NCHW order,
    // matching the canonical out×in weight's column order).
    src_md_ = memory::desc({n, k}, dt::f32, tag::ab);
    const memory::desc bottom_plain = PlainDesc(bottom[0]->shape);
    src_reorder_.Init(c_, bottom_md_, bottom_plain);
    diff_src_reorder_.Init(c_, bottom_plain, bottom_md_);
    if (src_reorder_.needed) src_buf_.Resize(src_md_);
    if (diff_src_reorder_.needed) diff_src_buf_.Resize(src_md_);
    w_md_ = memory::desc({o, k}, dt::f32, tag::ab);
    dst_md_ = memory::desc({n, o}, dt::f32, tag::ab);
    const memory::desc bias_md({o}, dt::f32, tag::a);
    has_bias_ = params_.size() > 1;
    auto fd = has_bias_ ? dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, src_md_,
                                                            w_md_, bias_md, dst_md_)
                        : dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, src_md_,
                                                            w_md_, dst_md_);
    auto fpd = dnnl::inner_product_forward::primitive_desc(fd, c_.eng);  // the backward's hint
    dnnl::inner_product_backward_data::desc bdd(src_md_, w_md_, dst_md_);
    bwd_data_ = dnnl::inner_product_backward_data(
        dnnl::inner_product_backward_data::primitive_desc(bdd, c_.eng, fpd));
    auto bwd = has_bias_ ? dnnl::inner_product_backward_weights::desc(src_md_, w_md_, bias_md, dst_md_)
                         : dnnl::inner_product_backward_weights::desc(src_md_, w_md_, dst_md_);
    bwd_w_ = dnnl::inner_product_backward_weights(
        dnnl::inner_product_backward_weights::primitive_desc(bwd, c_.eng, fpd));
    yt_.assign(int64_t(n) * o, 0.0f);
    AllocTop(top[0], dst_md_);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    float* src = bottom[0]->data;
    if (src_reorder_.needed) {
      src_reorder_.Run(c_, src, src_buf_.data());
      src = src_buf_.data();
    }
    // y (N×O) = x (N×K) · Wᵀ (W: O×K) + b. oneDNN's inner product (and its sgemm 'N','T')
    // runs this small-N product well below the machine's speed; the same flops as
    // yᵀ (O×N) = W · xᵀ run much faster, and the O×N → N×O transpose is tiny.
    const int n = bottom[0]->shape[0], o = spec_.num_output;
    const int k = static_cast<int>(bottom[0]->count() / n);
    const dnnl_status_t st = dnnl_sgemm('N', 'T', o, n, k, 1.0f, params_[0].data, k, src, k, 0.0f,
                                        yt_.data(), n);
    DP_CHECK_EQ(static_cast<int>(st), static_cast<int>(dnnl_success));
    const float* bias = has_bias_ ? params_[1].data : nullptr;
    const float* yt = yt_.data();
    float* y = top[0]->data;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < o; ++j) y[int64_t(i) * o + j] = yt[int64_t(j) * n + i] + (bias ? bias[j] : 0.0f);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    float* src = src_reorder_.needed ? src_buf_.data() : bottom[0]->data;
    memory diff_dst = Mem(dst_md_, top[0]->grad);
    if (skip_weight_grad_) {
      if (has_bias_) BiasGradient(top[0]->grad, bottom[0]->shape[0], params_[1].grad);
    } else {
      std::unordered_map<int, memory> wargs{{DNNL_ARG_SRC, Mem(src_md_, src)},
                                            {DNNL_ARG_DIFF_DST, diff_dst},
                                            {DNNL_ARG_DIFF_WEIGHTS, Mem(w_md_, params_[0].grad)}};
      if (has_bias_)
        wargs.emplace(DNNL_ARG_DIFF_BIAS, Mem(memory::desc({spec_.num_output}, dt::f32, tag::a), params_[1].grad));
      bwd_w_.execute(c_.stream, wargs);
    }
    if (down[0]) {
      float* dsrc = diff_src_reorder_.needed ? diff_src_buf_.data() : bottom[0]->grad;
      bwd_data_.execute(c_.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                    {DNNL_ARG_WEIGHTS, Mem(w_md_, params_[0].data)},
                                    {DNNL_ARG_DIFF_SRC, Mem(src_md_, dsrc)}});
      if (diff_src_reorder_.needed) diff_src_reorder_.Run(c_, dsrc, bottom[0]->grad);
    }
    Wait();
  }

 private:
  // db (O) = column sums of dy (N×O, plain): the bias gradient without the weight gradient.
  void BiasGradient(const float* dy, int n, float* db) const {
    const int o = spec_.num_output;
    for (int j = 0; j < o; ++j) db[j] = 0.0f;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < o; ++j) db[j] += dy[int64_t(i) * o + j];
  }

  bool has_bias_ = false;
  memory::desc bottom_md_, src_md_, w_md_, dst_md_;
  Reorder src_reorder_, diff_src_reorder_;
  Buffer src_buf_, diff_src_buf_;
  std::vector<float> yt_;  // O×N: the forward's product before the transpose
  dnnl::inner_product_backward_data bwd_data_;
  dnnl::inner_product_backward_weights bwd_w_;
};

class DnnDropout : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  void SetStep(int64_t step) override { step_ = step; }
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    md_ = DescOf(*bottom[0]);
    // Masks are drawn in canonical element order (identical to every other backend) and
    // reordered into the activation layout when it differs.
    mask_plain_.assign(bottom[0]->count(), 0.0f);
    mask_reorder_.Init(c_, PlainDesc(bottom[0]->shape), md_);
    mask_.Resize(md_);
    physical_ = static_cast<int64_t>(md_.get_size() / sizeof(float));
    AllocTop(top[0], md_);
    return Status::Ok();
  }
  void Forward(Phase phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const float* x = bottom[0]->data;
    float* y = top[0]->data;
    if (phase == Phase::kTest) {
      std::memcpy(y, x, physical_ * sizeof(float));
      return;
    }
    float* mask = mask_reorder_.needed ? mask_plain_.data() : mask_.data();
    DropoutMask(seed_, step_, spec_.dropout_ratio, {mask, mask_plain_.size()});
    if (mask_reorder_.needed) {
      mask_reorder_.Run(c_, mask_plain_.data(), mask_.data());
      Wait();
    }
    const float* m = mask_.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < physical_; ++i) y[i] = x[i] * m[i];
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    const float* dy = top[0]->grad;
    float* dx = bottom[0]->grad;
    const float* m = mask_.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < physical_; ++i) dx[i] = dy[i] * m[i];
  }

 private:
  int64_t step_ = 0;
  int64_t physical_ = 0;
  memory::desc md_;
  std::vector<float> mask_plain_;
  Reorder mask_reorder_;
  Buffer mask_;
};

// Scores arrive plain N×K (an inner product's output); softmax + cross-entropy on the host.
class DnnSoftmaxLoss : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    if (bottom[0]->format)
      return InvalidArgument("scores '{}' must be in plain N×K layout (an inner product's output)",
                             bottom[0]->name);
    prob_.assign(bottom[0]->count(), 0.0f);
    AllocTop(top[0], PlainDesc(top[0]->shape));
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int n = bottom[0]->shape[0], k = bottom[0]->shape[1];
    const float* x = bottom[0]->data;
    const float* labels = bottom[1]->data;
    double loss = 0.0;
#pragma omp parallel for reduction(+ : loss) schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* row = x + int64_t(i) * k;
      float* p = prob_.data() + int64_t(i) * k;
      const float mx = *std::max_element(row, row + k);
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += (p[j] = std::exp(row[j] - mx));
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = 0; j < k; ++j) p[j] *= inv;
      loss -= std::log(std::max(static_cast<double>(p[static_cast<int>(labels[i])]), 1e-37));
    }
    top[0]->data[0] = static_cast<float>(loss / n);
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    const int n = bottom[0]->shape[0], k = bottom[0]->shape[1];
    const float* labels = bottom[1]->data;
    float* dx = bottom[0]->grad;
    const float scale = 1.0f / n;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < k; ++j) {
        const int64_t idx = int64_t(i) * k + j;
        dx[idx] = (prob_[idx] - (j == static_cast<int>(labels[i]) ? 1.0f : 0.0f)) * scale;
      }
  }

 private:
  std::vector<float> prob_;
};

class DnnAccuracy : public DnnLayer {
 public:
  using DnnLayer::DnnLayer;
  bool HasBackward() const override { return false; }
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    if (bottom[0]->format)
      return InvalidArgument("scores '{}' must be in plain N×K layout", bottom[0]->name);
    AllocTop(top[0], PlainDesc(top[0]->shape));
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int n = bottom[0]->shape[0], k = bottom[0]->shape[1];
    top[0]->data[0] = ref::Accuracy(n, k, bottom[0]->data, bottom[1]->data, spec_.top_k);
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>&, const std::vector<Blob*>&) override {}
};

class OneDnnBackend : public Backend {
 public:
  DeviceKind device() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "onednn"; }
  float* Allocate(int64_t count) override {
    // 64-byte aligned for vector loads in reorders and SGD.
    void* p = std::aligned_alloc(64, ((count * sizeof(float) + 63) / 64) * 64);
    std::memset(p, 0, count * sizeof(float));
    return static_cast<float*>(p);
  }
  void Free(float* ptr) override { std::free(ptr); }
  bool memory_is_host() const override { return true; }
  void CopyToDevice(const float* host, float* device, int64_t count) override {
    std::memcpy(device, host, count * sizeof(float));
  }
  void CopyToHost(const float* device, float* host, int64_t count) override {
    std::memcpy(host, device, count * sizeof(float));
  }
  void SetInput(const float* host, Blob* blob) override {
    auto& storage = inputs_[blob];
    storage.resize(blob->count());
    std::memcpy(storage.data(), host, blob->count() * sizeof(float));
    blob->data = storage.data();
    blob->format = nullptr;
  }
  void ReadBlob(const Blob& blob, float* host) override { ToPlain(blob, blob.data, host); }
  void WriteBlobGrad(const float* host, Blob* blob) override {
    if (!blob->format) {
      std::memcpy(blob->grad, host, blob->count() * sizeof(float));
      return;
    }
    Reorder r;
    r.Init(ctx_, PlainDesc(blob->shape), DescOf(*blob));
    r.Run(ctx_, const_cast<float*>(host), blob->grad);
    ctx_.stream.wait();
  }
  void ReadBlobGrad(const Blob& blob, float* host) override { ToPlain(blob, blob.grad, host); }
  void ReleaseInput(Blob* blob) override {
    inputs_.erase(blob);
    blob->data = nullptr;
  }
  void SetThreads(int threads) override {
    if (threads > 0) omp_set_num_threads(threads);
  }
  Status CreateLayer(const LayerContext& c, std::unique_ptr<Layer>* layer) override {
    switch (c.spec->type) {
      case LayerType::kConvolution: *layer = std::make_unique<DnnConv>(&ctx_, c); break;
      case LayerType::kActivation: *layer = std::make_unique<DnnActivation>(&ctx_, c); break;
      case LayerType::kLRN: *layer = std::make_unique<DnnLrn>(&ctx_, c); break;
      case LayerType::kPooling: *layer = std::make_unique<DnnPool>(&ctx_, c); break;
      case LayerType::kInnerProduct: *layer = std::make_unique<DnnInnerProduct>(&ctx_, c); break;
      case LayerType::kDropout: *layer = std::make_unique<DnnDropout>(&ctx_, c); break;
      case LayerType::kSoftmaxWithLoss: *layer = std::make_unique<DnnSoftmaxLoss>(&ctx_, c); break;
      case LayerType::kAccuracy: *layer = std::make_unique<DnnAccuracy>(&ctx_, c); break;
      case LayerType::kPReLU:
        *layer = std::make_unique<DnnPrelu>(&ctx_, c);
        break;
    }
    return Status::Ok();
  }

 private:
  // `src` (the blob's data or grad, in the blob's format) → host, canonical layout.
  void ToPlain(const Blob& blob, float* src, float* host) {
    if (!blob.format) {
      std::memcpy(host, src, blob.count() * sizeof(float));
      return;
    }
    Reorder r;
    r.Init(ctx_, DescOf(blob), PlainDesc(blob.shape));
    r.Run(ctx_, src, host);
    ctx_.stream.wait();
  }

  Ctx ctx_;
  std::map<const Blob*, std::vector<float>> inputs_;
};

}  // namespace

std::unique_ptr<Backend> MakeOneDnnBackend() { return std::make_unique<OneDnnBackend>(); }

}  // namespace downpour::engine
