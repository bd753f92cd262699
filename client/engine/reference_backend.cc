// reference_backend.cc — see reference_backend.h.
#include "client/engine/reference_backend.h"

#include <cstring>
#include <vector>

#include "client/engine/fillers.h"
#include "client/engine/ref_kernels.h"

namespace downpour::engine {
namespace {

std::vector<double> Widen(const float* p, int64_t n) { return std::vector<double>(p, p + n); }
void Narrow(const std::vector<double>& v, float* out) {
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
}

// Base: owns dense host storage for its single top (data + grad).
class RefLayer : public Layer {
 public:
  explicit RefLayer(const LayerContext& c) : spec_(*c.spec), params_(c.params), seed_(c.seed) {}

  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int64_t n = top[0]->count();
    data_.assign(n, 0.0f);
    grad_.assign(n, 0.0f);
    top[0]->data = data_.data();
    top[0]->grad = grad_.data();
    top[0]->format = nullptr;
    return ReshapeImpl(bottom, top);
  }
  virtual Status ReshapeImpl(const std::vector<Blob*>&, const std::vector<Blob*>&) {
    return Status::Ok();
  }

 protected:
  const double* weight() { w_ = Widen(params_[0].data, params_[0].spec.numel()); return w_.data(); }
  const double* bias() {
    if (params_.size() < 2) return nullptr;
    b_ = Widen(params_[1].data, params_[1].spec.numel());
    return b_.data();
  }

  LayerSpec spec_;
  std::vector<ParamSlot> params_;
  uint64_t seed_;
  std::vector<float> data_, grad_;
  std::vector<double> w_, b_;
};

class RefConv : public RefLayer {
 public:
  using RefLayer::RefLayer;
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    g_ = {x[0], x[1], x[2], x[3], spec_.num_output, spec_.kernel_h, spec_.kernel_w, spec_.stride_h,
          spec_.stride_w, spec_.pad_h, spec_.pad_w, spec_.group, y[2], y[3]};
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    std::vector<double> y(top[0]->count());
    ref::ConvForward(g_, x.data(), weight(), bias(), y.data());
    Narrow(y, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    auto dy = Widen(top[0]->grad, top[0]->count());
    std::vector<double> dx(down[0] ? x.size() : 0), dw(params_[0].spec.numel()),
        db(params_.size() > 1 ? params_[1].spec.numel() : 0);
    ref::ConvBackward(g_, x.data(), weight(), dy.data(), down[0] ? dx.data() : nullptr, dw.data(),
                      db.empty() ? nullptr : db.data());
    if (down[0]) Narrow(dx, bottom[0]->grad);
    Narrow(dw, params_[0].grad);
    if (!db.empty()) Narrow(db, params_[1].grad);
  }

 private:
  ref::ConvGeom g_{};
};

// Every activation, from its row (activations.h): y = f(x), dx = f'(x, y) · dy.
class RefActivation : public RefLayer {
 public:
  explicit RefActivation(const LayerContext& c)
      : RefLayer(c), row_(ActivationOf(c.spec->activation)), alpha_(c.spec->activation_alpha) {}
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const float* x = bottom[0]->data;
    float* y = top[0]->data;
    for (int64_t i = 0, n = bottom[0]->count(); i < n; ++i) y[i] = row_.forward(x[i], alpha_);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    const float *x = bottom[0]->data, *y = top[0]->data, *dy = top[0]->grad;
    float* dx = bottom[0]->grad;
    for (int64_t i = 0, n = bottom[0]->count(); i < n; ++i) dx[i] = row_.derivative(x[i], y[i], alpha_) * dy[i];
  }

 private:
  const ActivationRow& row_;
  const float alpha_;
};

// PReLU: y = max(0, x) + a_c min(0, x); dx = dy (x > 0 ? 1 : a_c); da_c = sum over n, h, w of
// dy min(0, x). One slope for all channels when channel_shared.
class RefPrelu : public RefLayer {
 public:
  using RefLayer::RefLayer;
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& s = bottom[0]->shape;
    const double* a = weight();
    const float* x = bottom[0]->data;
    float* y = top[0]->data;
    const int64_t plane = int64_t{s[2]} * s[3];
    for (int64_t i = 0, n = bottom[0]->count(); i < n; ++i) {
      const double slope = a[spec_.channel_shared ? 0 : (i / plane) % s[1]];
      y[i] = static_cast<float>(std::max(0.0, double{x[i]}) + slope * std::min(0.0, double{x[i]}));
    }
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    const auto& s = bottom[0]->shape;
    const double* a = weight();
    const float *x = bottom[0]->data, *dy = top[0]->grad;
    const int64_t plane = int64_t{s[2]} * s[3];
    std::vector<double> da(params_[0].spec.numel(), 0.0);
    for (int64_t i = 0, n = bottom[0]->count(); i < n; ++i) {
      const int64_t c = spec_.channel_shared ? 0 : (i / plane) % s[1];
      da[c] += double{dy[i]} * std::min(0.0, double{x[i]});
      if (down[0]) bottom[0]->grad[i] = static_cast<float>(x[i] > 0.0f ? double{dy[i]} : a[c] * dy[i]);
    }
    Narrow(da, params_[0].grad);
  }
};

class RefLrn : public RefLayer {
 public:
  using RefLayer::RefLayer;
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>&) override {
    const auto& x = bottom[0]->shape;
    g_ = {x[0], x[1], x[2], x[3], spec_.local_size, spec_.alpha, spec_.beta, spec_.k};
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    y_.assign(x.size(), 0.0);
    scale_.assign(x.size(), 0.0);
    ref::LrnForward(g_, x.data(), y_.data(), scale_.data());
    Narrow(y_, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    auto dy = Widen(top[0]->grad, top[0]->count());
    std::vector<double> dx(x.size());
    ref::LrnBackward(g_, x.data(), y_.data(), scale_.data(), dy.data(), dx.data());
    Narrow(dx, bottom[0]->grad);
  }

 private:
  ref::LrnGeom g_{};
  std::vector<double> y_, scale_;
};

class RefPool : public RefLayer {
 public:
  using RefLayer::RefLayer;
  Status ReshapeImpl(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    g_ = {x[0], x[1], x[2], x[3], spec_.kernel_h, spec_.kernel_w, spec_.stride_h, spec_.stride_w,
          spec_.pad_h, spec_.pad_w, y[2], y[3]};
    argmax_.assign(top[0]->count(), -1);
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    if (spec_.pool == PoolMethod::kMax) {
      ref::MaxPoolForward(g_, bottom[0]->data, top[0]->data, argmax_.data());
      return;
    }
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    std::vector<double> y(top[0]->count());
    ref::AvePoolForward(g_, x.data(), y.data());
    Narrow(y, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    if (spec_.pool == PoolMethod::kMax) {
      ref::MaxPoolBackward(g_, argmax_.data(), top[0]->grad, bottom[0]->grad);
      return;
    }
    auto dy = Widen(top[0]->grad, top[0]->count());
    std::vector<double> dx(bottom[0]->count());
    ref::AvePoolBackward(g_, dy.data(), dx.data());
    Narrow(dx, bottom[0]->grad);
  }

 private:
  ref::PoolGeom g_{};
  std::vector<int64_t> argmax_;
};

class RefInnerProduct : public RefLayer {
 public:
  using RefLayer::RefLayer;
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int n = bottom[0]->shape[0];
    const int k = static_cast<int>(bottom[0]->count() / n);
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    std::vector<double> y(top[0]->count());
    ref::InnerProductForward(n, k, spec_.num_output, x.data(), weight(), bias(), y.data());
    Narrow(y, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    const int n = bottom[0]->shape[0];
    const int k = static_cast<int>(bottom[0]->count() / n);
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    auto dy = Widen(top[0]->grad, top[0]->count());
    std::vector<double> dx(down[0] ? x.size() : 0), dw(skip_weight_grad_ ? 0 : params_[0].spec.numel()),
        db(params_.size() > 1 ? params_[1].spec.numel() : 0);
    ref::InnerProductBackward(n, k, spec_.num_output, x.data(), weight(), dy.data(),
                              down[0] ? dx.data() : nullptr, dw.empty() ? nullptr : dw.data(),
                              db.empty() ? nullptr : db.data());
    if (down[0]) Narrow(dx, bottom[0]->grad);
    if (!dw.empty()) Narrow(dw, params_[0].grad);
    if (!db.empty()) Narrow(db, params_[1].grad);
  }
};

class RefDropout : public RefLayer {
 public:
  using RefLayer::RefLayer;
  void SetStep(int64_t step) override { step_ = step; }
  void Forward(Phase phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int64_t n = bottom[0]->count();
    mask_.resize(n);
    if (phase == Phase::kTrain) DropoutMask(seed_, step_, spec_.dropout_ratio, mask_);
    else std::fill(mask_.begin(), mask_.end(), 1.0f);
    ref::DropoutForward(n, mask_.data(), bottom[0]->data, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (down[0]) ref::DropoutBackward(bottom[0]->count(), mask_.data(), top[0]->grad, bottom[0]->grad);
  }

 private:
  int64_t step_ = 0;
  std::vector<float> mask_;
};

class RefSoftmaxLoss : public RefLayer {
 public:
  using RefLayer::RefLayer;
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const int n = bottom[0]->shape[0], k = bottom[0]->shape[1];
    auto x = Widen(bottom[0]->data, bottom[0]->count());
    prob_.assign(x.size(), 0.0);
    top[0]->data[0] = static_cast<float>(ref::SoftmaxLossForward(n, k, x.data(), bottom[1]->data, prob_.data()));
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>& down,
                const std::vector<Blob*>& bottom) override {
    if (!down[0]) return;
    const int n = bottom[0]->shape[0], k = bottom[0]->shape[1];
    std::vector<double> dx(prob_.size());
    ref::SoftmaxLossBackward(n, k, prob_.data(), bottom[1]->data, 1.0, dx.data());
    Narrow(dx, bottom[0]->grad);
  }

 private:
  std::vector<double> prob_;
};

class RefAccuracy : public RefLayer {
 public:
  using RefLayer::RefLayer;
  bool HasBackward() const override { return false; }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    top[0]->data[0] = ref::Accuracy(bottom[0]->shape[0], bottom[0]->shape[1], bottom[0]->data,
                                    bottom[1]->data, spec_.top_k);
  }
  void Backward(const std::vector<Blob*>&, const std::vector<bool>&, const std::vector<Blob*>&) override {}
};

class ReferenceBackend : public Backend {
 public:
  DeviceKind device() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "reference"; }
  float* Allocate(int64_t count) override { return new float[count](); }
  void Free(float* ptr) override { delete[] ptr; }
  bool memory_is_host() const override { return true; }
  void CopyToDevice(const float* host, float* device, int64_t count) override {
    std::memcpy(device, host, count * sizeof(float));
  }
  void CopyToHost(const float* device, float* host, int64_t count) override {
    std::memcpy(host, device, count * sizeof(float));
  }
  void SetInput(const float* host, Blob* blob) override {
    auto* storage = static_cast<std::vector<float>*>(blob->format.get());
    if (storage == nullptr || static_cast<int64_t>(storage->size()) != blob->count()) {
      auto owned = std::make_shared<std::vector<float>>(blob->count());
      blob->format = owned;  // the reference backend keeps input storage in the format slot
      storage = owned.get();
    }
    std::memcpy(storage->data(), host, blob->count() * sizeof(float));
    blob->data = storage->data();
  }
  void ReadBlob(const Blob& blob, float* host) override {
    std::memcpy(host, blob.data, blob.count() * sizeof(float));
  }
  void ReleaseInput(Blob* blob) override {
    blob->format.reset();
    blob->data = nullptr;
  }
  void WriteBlobGrad(const float* host, Blob* blob) override {
    std::memcpy(blob->grad, host, blob->count() * sizeof(float));
  }
  void ReadBlobGrad(const Blob& blob, float* host) override {
    std::memcpy(host, blob.grad, blob.count() * sizeof(float));
  }
  void SetThreads(int) override {}

  Status CreateLayer(const LayerContext& c, std::unique_ptr<Layer>* layer) override {
    switch (c.spec->type) {
      case LayerType::kConvolution: *layer = std::make_unique<RefConv>(c); break;
      case LayerType::kActivation: *layer = std::make_unique<RefActivation>(c); break;
      case LayerType::kLRN: *layer = std::make_unique<RefLrn>(c); break;
      case LayerType::kPooling: *layer = std::make_unique<RefPool>(c); break;
      case LayerType::kInnerProduct: *layer = std::make_unique<RefInnerProduct>(c); break;
      case LayerType::kDropout: *layer = std::make_unique<RefDropout>(c); break;
      case LayerType::kSoftmaxWithLoss: *layer = std::make_unique<RefSoftmaxLoss>(c); break;
      case LayerType::kAccuracy: *layer = std::make_unique<RefAccuracy>(c); break;
      case LayerType::kPReLU:
        *layer = std::make_unique<RefPrelu>(c);
        break;
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Backend> MakeReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace downpour::engine
