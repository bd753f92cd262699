// Gradient checks over the Layer interface (client/engine/gradient_checker.h, Caffe's
// GradientChecker): the layer suite (client/engine/gradient_cases.h: every layer type at the
// geometries that matter) on the oneDNN backend and on the reference backend, each layer built
// with Backend::CreateLayer as the Net builds it, its Backward against central differences of
// a random linear functional of its top (computed in double on the host). EVERY element of the
// bottom and of every parameter tensor is checked and must pass; none may fail.
//
// Tolerances, float32 (every backend keeps blobs and parameters in float; the reference computes
// each layer in double but rounds its outputs to float): Caffe's GradientChecker(1e-2, 1e-3),
// step 1e-2, |analytic − numeric| ≤ 1e-3 · max(|analytic|, |numeric|, 1) (Float32GradientOptions;
// why they suffice is written there).
//
// Non-differentiable points: ReLU's kink at 0 is skipped the way Caffe does (kink 0, kink_range
// = step: an input within one step of 0 is not checked, and the test asserts exactly those were
// skipped); max pooling's ties are avoided by inputs that are distinct multiples of 0.05 (> 2 ×
// step apart), so no window's arg-max changes under a perturbation and nothing is skipped.
//
// Also here: the checker itself fails a layer whose backward is wrong (an AVE backward that
// divides by kh·kw at the ceil overhang, a backward that writes NaN), and refuses cases it cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "client/engine/gradient_cases.h"
#include "client/engine/gradient_checker.h"
#include "client/engine/net.h"
#include "client/engine/onednn_backend.h"
#include "client/engine/ref_kernels.h"
#include "client/engine/reference_backend.h"
#include "tests/client/gradient_case_check.h"

namespace downpour::engine {
namespace {

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
  return name == "onednn" ? MakeOneDnnBackend() : MakeReferenceBackend();
}

class EngineLayerGradient : public ::testing::TestWithParam<std::tuple<std::string, GradientCase>> {};

TEST_P(EngineLayerGradient, EveryElementMatchesCentralDifferences) {
  const auto& [backend_name, g] = GetParam();
  LayerCase c;
  Status s = MakeGradientCase(g, 1234, &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto backend = MakeBackend(backend_name);
  backend->SetThreads(1);
  ExpectEveryElementChecked(*backend, g, c);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineLayerGradient,
                         ::testing::Combine(::testing::Values("reference", "onednn"),
                                            ::testing::ValuesIn(LayerGradientCases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

// The ReLU case must actually exercise the kink rule (else the EXPECT above proves nothing).
TEST(EngineLayerGradientCases, ReluCaseHasInputsAtTheKinkAndTheRestChecked) {
  for (const GradientCase& g : LayerGradientCases()) {
    if (g.name != "Relu") continue;
    LayerCase c;
    ASSERT_TRUE(MakeGradientCase(g, 1234, &c).ok());
    auto backend = MakeReferenceBackend();
    GradientCheckResult r;
    ASSERT_TRUE(CheckLayerGradients(*backend, c, g.options, &r).ok());
    EXPECT_GE(r.skipped_at_kink, 3) << r.Summary();
    EXPECT_GT(r.checked, 100) << r.Summary();
    return;
  }
  FAIL() << "no Relu case";
}

// ------------------------------------------------------------------------------------------
// The checker catches wrong backwards. A backend that is the reference backend except for one
// layer type, which it builds from a factory of the test's.

class SwapOneLayer : public Backend {
 public:
  using Factory = std::function<std::unique_ptr<Layer>(const LayerContext&)>;
  SwapOneLayer(LayerType type, Factory factory) : type_(type), factory_(std::move(factory)) {}
  DeviceKind device() const override { return ref_->device(); }
  std::string name() const override { return "reference with a broken " + std::string(LayerTypeName(type_)); }
  float* Allocate(int64_t count) override { return ref_->Allocate(count); }
  void Free(float* ptr) override { ref_->Free(ptr); }
  bool memory_is_host() const override { return true; }
  void CopyToDevice(const float* host, float* device, int64_t count) override {
    ref_->CopyToDevice(host, device, count);
  }
  void CopyToHost(const float* device, float* host, int64_t count) override { ref_->CopyToHost(device, host, count); }
  void SetInput(const float* host, Blob* blob) override { ref_->SetInput(host, blob); }
  void ReadBlob(const Blob& blob, float* host) override { ref_->ReadBlob(blob, host); }
  void ReleaseInput(Blob* blob) override { ref_->ReleaseInput(blob); }
  void WriteBlobGrad(const float* host, Blob* blob) override { ref_->WriteBlobGrad(host, blob); }
  void ReadBlobGrad(const Blob& blob, float* host) override { ref_->ReadBlobGrad(blob, host); }
  void SetThreads(int threads) override { ref_->SetThreads(threads); }
  Status CreateLayer(const LayerContext& c, std::unique_ptr<Layer>* layer) override {
    if (c.spec->type != type_) return ref_->CreateLayer(c, layer);
    *layer = factory_(c);
    return Status::Ok();
  }

 private:
  std::unique_ptr<Backend> ref_ = MakeReferenceBackend();
  LayerType type_;
  Factory factory_;
};

// Caffe's AVE forward, but a backward that divides every window by kh·kw — right wherever the
// window lies inside the padded input, wrong at the ceil overhang (oneDNN's include-padding
// semantics). Host memory (the reference backend's).
class AveWithIncludePaddingBackward : public Layer {
 public:
  explicit AveWithIncludePaddingBackward(const LayerContext& c) : spec_(*c.spec) {}
  Status Reshape(const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    const auto& x = bottom[0]->shape;
    const auto& y = top[0]->shape;
    g_ = {x[0],           x[1],           x[2],        x[3],        spec_.kernel_h, spec_.kernel_w,
          spec_.stride_h, spec_.stride_w, spec_.pad_h, spec_.pad_w, y[2],           y[3]};
    data_.assign(top[0]->count(), 0.0f);
    grad_.assign(top[0]->count(), 0.0f);
    top[0]->data = data_.data();
    top[0]->grad = grad_.data();
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    ref::AvePoolForward(g_, bottom[0]->data, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>&, const std::vector<Blob*>& bottom) override {
    float* dx = bottom[0]->grad;
    std::fill(dx, dx + bottom[0]->count(), 0.0f);
    for (int nc = 0; nc < g_.n * g_.c; ++nc)
      for (int oh = 0; oh < g_.ho; ++oh)
        for (int ow = 0; ow < g_.wo; ++ow) {
          const ref::AveWindow w = ref::AveWindowAt(g_, oh, ow);
          const float d = top[0]->grad[(nc * g_.ho + oh) * g_.wo + ow] / (g_.kh * g_.kw);  // the bug
          for (int ih = w.hs; ih < w.he; ++ih)
            for (int iw = w.ws; iw < w.we; ++iw) dx[(nc * g_.h + ih) * g_.w + iw] += d;
        }
  }

 private:
  LayerSpec spec_;
  ref::PoolGeom g_{};
  std::vector<float> data_, grad_;
};

GradientCase FindCase(const std::string& name) {
  for (const GradientCase& g : LayerGradientCases())
    if (g.name == name) return g;
  ADD_FAILURE() << "no case " << name;
  return {};
}

TEST(EngineGradientCheckerCatches, AveBackwardWithTheWrongDivisorAtTheOverhang) {
  const GradientCase g = FindCase("AvePoolCeilOverhang");  // 8×7 → 4×3: last row and column overhang
  LayerCase c;
  ASSERT_TRUE(MakeGradientCase(g, 1234, &c).ok());
  SwapOneLayer broken(LayerType::kPooling,
                      [](const LayerContext& lc) { return std::make_unique<AveWithIncludePaddingBackward>(lc); });
  GradientCheckResult r;
  ASSERT_TRUE(CheckLayerGradients(broken, c, g.options, &r).ok());
  EXPECT_FALSE(r.ok()) << r.Summary();
  ASSERT_FALSE(r.mismatches.empty()) << r.Summary();
  // Only rows overhang (8 rows: windows start at 0, 2, 4, 6; 7 columns: the last window ends at
  // column 7 exactly), so every wrong element is in rows 6..7, which the last window covers.
  for (const GradientMismatch& m : r.mismatches) {
    EXPECT_EQ(m.tensor, "bottom 'data'");
    const int ih = static_cast<int>(m.index / 7 % 8);
    EXPECT_GE(ih, 6) << "element " << m.index << ": " << r.Summary();
  }
  // Inputs no overhanging window covers still pass: not every element fails.
  EXPECT_LT(r.failed, r.checked) << r.Summary();
  EXPECT_NE(r.Summary().find("analytic"), std::string::npos);
}

// A backward that writes NaN into one element fails there (a NaN must not pass as "close").
class ReluWithNanGradient : public Layer {
 public:
  explicit ReluWithNanGradient(const LayerContext&) {}
  Status Reshape(const std::vector<Blob*>&, const std::vector<Blob*>& top) override {
    data_.assign(top[0]->count(), 0.0f);
    grad_.assign(top[0]->count(), 0.0f);
    top[0]->data = data_.data();
    top[0]->grad = grad_.data();
    return Status::Ok();
  }
  void Forward(Phase, const std::vector<Blob*>& bottom, const std::vector<Blob*>& top) override {
    ref::ReluForward(bottom[0]->count(), bottom[0]->data, top[0]->data);
  }
  void Backward(const std::vector<Blob*>& top, const std::vector<bool>&, const std::vector<Blob*>& bottom) override {
    ref::ReluBackward(bottom[0]->count(), bottom[0]->data, top[0]->grad, bottom[0]->grad);
    bottom[0]->grad[5] = std::nanf("");
  }

 private:
  std::vector<float> data_, grad_;
};

TEST(EngineGradientCheckerCatches, NanInTheAnalyticGradient) {
  const GradientCase g = FindCase("Relu");
  LayerCase c;
  ASSERT_TRUE(MakeGradientCase(g, 1234, &c).ok());
  c.bottoms[0][5] = 0.5f;  // away from the kink, so element 5 is checked
  SwapOneLayer broken(LayerType::kActivation,
                      [](const LayerContext& lc) { return std::make_unique<ReluWithNanGradient>(lc); });
  GradientCheckResult r;
  ASSERT_TRUE(CheckLayerGradients(broken, c, g.options, &r).ok());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.failed, 1) << r.Summary();
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_EQ(r.mismatches[0].index, 5);
  EXPECT_TRUE(std::isnan(r.mismatches[0].analytic));
}

TEST(EngineGradientCheckerErrors, LayerWithoutBackwardOrBadValuesIsAnError) {
  NetSpec spec;
  ASSERT_TRUE(
      ParseNetSpecString("name = \"n\"\n[input]\nchannels = 3\nheight = 1\nwidth = 1\n"
                         "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"fc\"\n"
                         "num_output = 4\n"
                         "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\n"
                         "top = \"loss\"\n"
                         "[[layer]]\nname = \"acc\"\ntype = \"Accuracy\"\nbottom = [\"fc\", \"label\"]\n"
                         "top = \"acc\"\n",
                         "n", &spec)
          .ok());
  auto backend = MakeReferenceBackend();
  LayerCase c;
  ASSERT_TRUE(MakeLayerCase(spec, 2, 2, 1, &c).ok());
  GradientCheckResult r;
  Status s = CheckLayerGradients(*backend, c, Float32GradientOptions(), &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("no backward"), std::string::npos) << s.ToString();

  ASSERT_TRUE(MakeLayerCase(spec, 0, 2, 1, &c).ok());
  c.params[0].pop_back();
  s = CheckLayerGradients(*backend, c, Float32GradientOptions(), &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("fc.weight"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace downpour::engine
