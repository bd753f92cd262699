// gradient_checker.cc — see gradient_checker.h.
#include "client/engine/gradient_checker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

namespace downpour::engine {
namespace {

// Scores and labels (SoftmaxWithLoss, Accuracy).
bool TakesLabels(LayerType type) { return LayerTypeOf(type).bottoms == 2; }

// One layer on a backend with its blobs and buffers; frees what it allocated on destruction.
// Host mirrors are members declared before nothing that outlives them: the destructor frees the
// device buffers first, then the mirrors go.
class LayerUnderTest {
 public:
  LayerUnderTest(Backend& backend, const LayerCase& c) : be_(backend), c_(c) {}
  ~LayerUnderTest() {
    layer_.reset();  // layers own their tops' storage
    for (Blob& b : bottoms_) be_.ReleaseInput(&b);
    for (float* p : allocations_) be_.Free(p);
  }
  LayerUnderTest(const LayerUnderTest&) = delete;
  LayerUnderTest& operator=(const LayerUnderTest&) = delete;

  Status Build(uint64_t layer_seed) {
    LayerContext context;
    context.spec = &c_.spec;
    context.seed = layer_seed;
    param_data_ = c_.params;
    for (size_t k = 0; k < c_.param_specs.size(); ++k) {
      const int64_t n = c_.param_specs[k].numel();
      param_grad_.emplace_back(n, 0.0f);
      ParamSlot slot{c_.param_specs[k], Allocate(n), Allocate(n)};
      be_.CopyToDevice(param_data_[k].data(), slot.data, n);
      context.params.push_back(slot);
    }
    params_ = context.params;
    DP_RETURN_IF_ERROR(be_.CreateLayer(context, &layer_));
    if (!layer_->HasBackward()) return InvalidArgument("{}: the layer has no backward to check", c_.spec.name);
    bottom_values_ = c_.bottoms;
    bottoms_.resize(c_.spec.bottoms.size());
    for (size_t b = 0; b < bottoms_.size(); ++b) {
      bottoms_[b].name = c_.spec.bottoms[b];
      bottoms_[b].shape = c_.bottom_shapes[b];
      be_.SetInput(bottom_values_[b].data(), &bottoms_[b]);
      bottom_ptrs_.push_back(&bottoms_[b]);
    }
    bottoms_[0].grad = Allocate(bottoms_[0].count());
    top_.name = c_.spec.tops.empty() ? "top" : c_.spec.tops[0];
    top_.shape = c_.top_shape;
    top_ptrs_ = {&top_};
    return layer_->Reshape(bottom_ptrs_, top_ptrs_);
  }

  // E = Σ r_i · top_i in double, after a forward at the current values.
  double Objective(const std::vector<float>& r, Phase phase, int64_t train_step) {
    layer_->SetStep(train_step);
    layer_->Forward(phase, bottom_ptrs_, top_ptrs_);
    top_values_.resize(top_.count());
    be_.ReadBlob(top_, top_values_.data());
    double e = 0.0;
    for (size_t i = 0; i < r.size(); ++i) e += static_cast<double>(r[i]) * top_values_[i];
    return e;
  }

  // Backward with top gradient r; analytic gradients of bottom 0 and of every parameter to the host.
  void Backward(const std::vector<float>& r, std::vector<float>* bottom_grad) {
    be_.WriteBlobGrad(r.data(), &top_);
    std::vector<bool> down(bottoms_.size(), false);
    down[0] = true;
    layer_->Backward(top_ptrs_, down, bottom_ptrs_);
    bottom_grad->resize(bottoms_[0].count());
    be_.ReadBlobGrad(bottoms_[0], bottom_grad->data());
    for (size_t k = 0; k < params_.size(); ++k)
      be_.CopyToHost(params_[k].grad, param_grad_[k].data(), params_[k].spec.numel());
  }

  // Value access for perturbation: tensor 0 is bottom 0, tensor 1 + k is parameter k.
  size_t num_tensors() const { return 1 + params_.size(); }
  std::vector<float>& values(size_t t) { return t == 0 ? bottom_values_[0] : param_data_[t - 1]; }
  const std::vector<float>& analytic_params(size_t k) const { return param_grad_[k]; }
  std::string tensor_name(size_t t) const {
    return t == 0 ? fmt::format("bottom '{}'", bottoms_[0].name) : params_[t - 1].spec.name;
  }
  // Makes the layer see the current host values of tensor t.
  void Upload(size_t t) {
    if (t == 0)
      be_.SetInput(bottom_values_[0].data(), &bottoms_[0]);
    else
      be_.CopyToDevice(param_data_[t - 1].data(), params_[t - 1].data, params_[t - 1].spec.numel());
  }

 private:
  float* Allocate(int64_t n) {
    allocations_.push_back(be_.Allocate(std::max<int64_t>(n, 1)));
    return allocations_.back();
  }

  Backend& be_;
  const LayerCase& c_;
  // Host mirrors: alive until the destructor has freed the device buffers.
  std::vector<std::vector<float>> param_data_, param_grad_, bottom_values_;
  std::vector<float> top_values_;
  std::vector<float*> allocations_;
  std::vector<ParamSlot> params_;
  std::vector<Blob> bottoms_;
  Blob top_;
  std::vector<Blob*> bottom_ptrs_, top_ptrs_;
  std::unique_ptr<Layer> layer_;
};

Status Validate(const LayerCase& c) {
  const std::string& name = c.spec.name;
  if (c.spec.bottoms.empty() || c.bottom_shapes.size() != c.spec.bottoms.size() ||
      c.bottoms.size() != c.spec.bottoms.size())
    return InvalidArgument("{}: {} bottoms named, {} shapes, {} value tensors", name, c.spec.bottoms.size(),
                           c.bottom_shapes.size(), c.bottoms.size());
  for (size_t b = 0; b < c.bottoms.size(); ++b)
    if (static_cast<int64_t>(c.bottoms[b].size()) != ShapeCount(c.bottom_shapes[b]))
      return InvalidArgument("{}: bottom {} has {} values for shape {}", name, b, c.bottoms[b].size(),
                             ShapeString(c.bottom_shapes[b]));
  if (c.params.size() != c.param_specs.size())
    return InvalidArgument("{}: {} parameter specs but {} value tensors", name, c.param_specs.size(), c.params.size());
  for (size_t k = 0; k < c.params.size(); ++k)
    if (static_cast<int64_t>(c.params[k].size()) != c.param_specs[k].numel())
      return InvalidArgument("{}: parameter '{}' has {} values, wants {}", name, c.param_specs[k].name,
                             c.params[k].size(), c.param_specs[k].numel());
  if (ShapeCount(c.top_shape) <= 0) return InvalidArgument("{}: empty top shape", name);
  return Status::Ok();
}

bool AtKink(const GradientCheckOptions& o, double v) {
  return o.kink_range >= 0 && o.kink - o.kink_range <= std::abs(v) && std::abs(v) <= o.kink + o.kink_range;
}

}  // namespace

Status MakeLayerCase(const NetSpec& net, int layer, int batch, uint32_t seed, LayerCase* out) {
  if (layer < 0 || layer >= static_cast<int>(net.layers.size()))
    return InvalidArgument("{}: no layer #{} ({} layers)", net.source, layer, net.layers.size());
  NetShapes shapes;
  DP_RETURN_IF_ERROR(InferShapes(net, batch, &shapes));
  const LayerSpec& l = net.layers[layer];
  LayerCase c;
  c.spec = l;
  for (const auto& b : l.bottoms) c.bottom_shapes.push_back(shapes.blobs.at(b));
  c.top_shape = shapes.blobs.at(l.tops[0]);
  for (int pi : shapes.layer_params[layer]) c.param_specs.push_back(shapes.params[pi]);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::normal_distribution<float> gaussian(0.0f, 0.5f);
  for (size_t b = 0; b < l.bottoms.size(); ++b) {
    std::vector<float> v(ShapeCount(c.bottom_shapes[b]));
    if (b == 1 && TakesLabels(l.type)) {
      std::uniform_int_distribution<int> label(0, c.bottom_shapes[0][1] - 1);
      for (float& x : v) x = static_cast<float>(label(rng));
    } else {
      for (float& x : v) x = uniform(rng);
    }
    c.bottoms.push_back(std::move(v));
  }
  for (const TensorSpec& p : c.param_specs) {
    std::vector<float> v(p.numel());
    for (float& x : v) x = gaussian(rng);
    c.params.push_back(std::move(v));
  }
  *out = std::move(c);
  return Status::Ok();
}

std::string GradientCheckResult::Summary() const {
  std::string s =
      fmt::format("{}: {} elements checked, {} skipped at a kink, {} failed", layer, checked, skipped_at_kink, failed);
  if (checked == 0) s += " (nothing was checked)";
  for (const GradientMismatch& m : mismatches)
    s += fmt::format("; {}[{}] = {:.6g}: analytic {:.6g}, numeric {:.6g}, |diff| {:.3g} > tolerance {:.3g}", m.tensor,
                     m.index, m.value, m.analytic, m.numeric, std::abs(m.analytic - m.numeric), m.tolerance);
  return s;
}

Status CheckLayerGradients(Backend& backend, const LayerCase& c, const GradientCheckOptions& o,
                           GradientCheckResult* result) {
  *result = GradientCheckResult();
  result->layer = fmt::format("layer '{}' ({}) on {}", c.spec.name, TypeNameOf(c.spec), backend.name());
  DP_RETURN_IF_ERROR(Validate(c));
  if (!(o.stepsize > 0)) return InvalidArgument("{}: stepsize {} must be positive", c.spec.name, o.stepsize);
  LayerUnderTest t(backend, c);
  DP_RETURN_IF_ERROR(t.Build(o.layer_seed));

  // r: the top gradient, and the weights of the objective.
  std::vector<float> r(ShapeCount(c.top_shape), 1.0f);
  if (c.spec.type != LayerType::kSoftmaxWithLoss) {
    std::mt19937 rng(o.objective_seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : r) x = uniform(rng);
  }
  t.Objective(r, o.phase, o.train_step);
  std::vector<float> bottom_grad;
  t.Backward(r, &bottom_grad);

  for (size_t tensor = 0; tensor < t.num_tensors(); ++tensor) {
    std::vector<float>& values = t.values(tensor);
    const std::vector<float>& analytic = tensor == 0 ? bottom_grad : t.analytic_params(tensor - 1);
    for (size_t i = 0; i < values.size(); ++i) {
      const float v = values[i];
      if (AtKink(o, v)) {
        ++result->skipped_at_kink;
        continue;
      }
      const float up = static_cast<float>(v + o.stepsize), down = static_cast<float>(v - o.stepsize);
      values[i] = up;
      t.Upload(tensor);
      const double e_up = t.Objective(r, o.phase, o.train_step);
      values[i] = down;
      t.Upload(tensor);
      const double e_down = t.Objective(r, o.phase, o.train_step);
      values[i] = v;
      const double numeric = (e_up - e_down) / (static_cast<double>(up) - down);
      const double a = analytic[i];
      const double tolerance = o.threshold * std::max({std::abs(a), std::abs(numeric), 1.0});
      ++result->checked;
      if (std::abs(a - numeric) <= tolerance) continue;  // NaN in either fails
      ++result->failed;
      if (static_cast<int>(result->mismatches.size()) < o.max_reported)
        result->mismatches.push_back({t.tensor_name(tensor), static_cast<int64_t>(i), v, a, numeric, tolerance});
    }
    t.Upload(tensor);  // back to the unperturbed values before the next tensor
  }
  return Status::Ok();
}

}  // namespace downpour::engine
