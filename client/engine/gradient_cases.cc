// gradient_cases.cc — see gradient_cases.h.
#include "client/engine/gradient_cases.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace downpour::engine {
namespace {

// Max pooling: distinct inputs 0.05 apart (more than twice the step), shuffled.
void DistinctInputs(LayerCase* c) {
  std::vector<float>& x = c->bottoms[0];
  std::vector<int> perm(x.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * (perm[i] - static_cast<float>(x.size()) / 2);
}

// ReLU: seeded values, plus three inputs inside the kink region (skipped) and two just outside.
void ReluInputs(LayerCase* c) {
  std::vector<float>& x = c->bottoms[0];
  x[0] = 0.0f;
  x[1] = 0.004f;
  x[2] = -0.009f;
  x[3] = 0.02f;
  x[4] = -0.02f;
}

GradientCheckOptions ReluOptions() {
  GradientCheckOptions o = Float32GradientOptions();
  o.kink = 0.0;
  o.kink_range = o.stepsize;  // Caffe's ReLU test: kink 0, range 0.01 = its step
  return o;
}

std::string Pool(const std::string& geometry, const char* method) {
  return "[[layer]]\nname = \"pool\"\ntype = \"Pooling\"\nbottom = \"data\"\ntop = \"t\"\npool = \"" +
         std::string(method) + "\"\n" + geometry;
}

}  // namespace

GradientCheckOptions Float32GradientOptions() {
  GradientCheckOptions o;
  o.stepsize = 1e-2;
  o.threshold = 1e-3;
  return o;
}

std::vector<GradientCase> LayerGradientCases() {
  std::vector<GradientCase> cases = {
      {"ConvGroupsPadStrideRectangular", "channels = 4\nheight = 7\nwidth = 6",
       "[[layer]]\nname = \"conv\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"t\"\nnum_output = 6\n"
       "kernel_h = 3\nkernel_w = 2\nstride_h = 2\nstride_w = 1\npad_h = 1\npad_w = 0\ngroup = 2\n"},
      {"ConvPadOneNoBias", "channels = 3\nheight = 5\nwidth = 5",
       "[[layer]]\nname = \"conv\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"t\"\nnum_output = 4\n"
       "kernel_size = 3\npad = 1\nbias_term = false\n"},
      {"InnerProductFromImage", "channels = 3\nheight = 3\nwidth = 2",
       "[[layer]]\nname = \"ip\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"t\"\nnum_output = 5\n", 3},
      {"InnerProductNoBias", "channels = 9\nheight = 1\nwidth = 1",
       "[[layer]]\nname = \"ip\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"t\"\nnum_output = 4\n"
       "bias_term = false\n",
       3},
      {"Relu", "channels = 3\nheight = 4\nwidth = 5",
       "[[layer]]\nname = \"relu\"\ntype = \"ReLU\"\nbottom = \"data\"\ntop = \"t\"\n", 2, ReluOptions(), ReluInputs},
      // ELU with alpha 0.5: its slope jumps from 0.5 to 1 at 0, a kink like ReLU's.
      {"EluAlphaHalf", "channels = 3\nheight = 4\nwidth = 5",
       "[[layer]]\nname = \"elu\"\ntype = \"ELU\"\nbottom = \"data\"\ntop = \"t\"\nalpha = 0.5\n", 2, ReluOptions(),
       ReluInputs},
      // PReLU: a slope per channel, and one shared; the kink at 0 as ReLU's.
      {"PreluPerChannel", "channels = 3\nheight = 4\nwidth = 5",
       "[[layer]]\nname = \"prelu\"\ntype = \"PReLU\"\nbottom = \"data\"\ntop = \"t\"\n", 2, ReluOptions(), ReluInputs},
      {"PreluChannelShared", "channels = 3\nheight = 2\nwidth = 3",
       "[[layer]]\nname = \"prelu\"\ntype = \"PReLU\"\nbottom = \"data\"\ntop = \"t\"\nchannel_shared = true\n", 2,
       ReluOptions(), ReluInputs},
      {"LrnStrong", "channels = 7\nheight = 3\nwidth = 2",
       "[[layer]]\nname = \"lrn\"\ntype = \"LRN\"\nbottom = \"data\"\ntop = \"t\"\nlocal_size = 3\nalpha = 0.5\n"
       "beta = 0.75\nk = 2.0\n"},
      {"LrnAlexNet", "channels = 8\nheight = 2\nwidth = 3",
       "[[layer]]\nname = \"lrn\"\ntype = \"LRN\"\nbottom = \"data\"\ntop = \"t\"\nlocal_size = 5\n"
       "alpha = 0.0001\nbeta = 0.75\nk = 1.0\n"},
      // 7×6, 3/2, pad 1: ceil rounding and padding, overlapping windows.
      {"MaxPoolPadCeil", "channels = 2\nheight = 7\nwidth = 6", Pool("kernel_size = 3\nstride = 2\npad = 1\n", "max"),
       2, Float32GradientOptions(), DistinctInputs},
      // 8×8, 3/2, no pad: ceil gives 4 (floor 3), the last window overhangs the input.
      {"MaxPoolCeilOverhang", "channels = 3\nheight = 8\nwidth = 8", Pool("kernel_size = 3\nstride = 2\n", "max"), 2,
       Float32GradientOptions(), DistinctInputs},
      // 13 → 6 with 3/2: floor and ceil agree, no padding (cuDNN's MAX path on the GPU).
      {"MaxPoolFloorEqualsCeil", "channels = 2\nheight = 13\nwidth = 13", Pool("kernel_size = 3\nstride = 2\n", "max"),
       1, Float32GradientOptions(), DistinctInputs},
      // 5 rows, kernel 2, stride 3, pad 1: Caffe drops the third window (it would start in the
      // padding), so the right padding oneDNN needs comes out negative.
      {"MaxPoolClippedLastWindow", "channels = 2\nheight = 5\nwidth = 5",
       Pool("kernel_size = 2\nstride = 3\npad = 1\n", "max"), 2, Float32GradientOptions(), DistinctInputs},
      // AVE, the three ways oneDNN runs it (onednn_backend.cc DnnPool), cuDNN's AVE path and
      // Caffe's clipping. No padding, ceil overhang (oneDNN avg_exclude_padding; GPU kernel):
      {"AvePoolCeilOverhang", "channels = 3\nheight = 8\nwidth = 7", Pool("kernel_size = 3\nstride = 2\n", "ave")},
      // floor == ceil without padding: 13 → 6 (cuDNN on the GPU).
      {"AvePoolFloorEqualsCeil", "channels = 2\nheight = 13\nwidth = 13", Pool("kernel_size = 3\nstride = 2\n", "ave"),
       1},
      // padding, no window past in+pad: 7 → 4 with pad 1, ext 1 = pad (oneDNN
      // avg_include_padding; cuDNN COUNT_INCLUDE_PADDING on the GPU).
      {"AvePoolPadNoOverhang", "channels = 2\nheight = 7\nwidth = 7",
       Pool("kernel_size = 3\nstride = 2\npad = 1\n", "ave")},
      // padding AND overhang past in+pad: 6 → 4 with pad 1, ext 2 > pad (oneDNN: the explicitly
      // padded copy; GPU kernel).
      {"AvePoolPadAndOverhang", "channels = 2\nheight = 6\nwidth = 6",
       Pool("kernel_size = 3\nstride = 2\npad = 1\n", "ave")},
      // rectangular, pad only in h, overhang in both.
      {"AvePoolRectangularMixed", "channels = 2\nheight = 6\nwidth = 7",
       Pool("kernel_h = 3\nkernel_w = 2\nstride_h = 2\nstride_w = 3\npad_h = 1\npad_w = 0\n", "ave")},
      // Caffe's dropped last window (see MaxPoolClippedLastWindow).
      {"AvePoolClippedLastWindow", "channels = 2\nheight = 5\nwidth = 5",
       Pool("kernel_size = 2\nstride = 3\npad = 1\n", "ave")},
      {"DropoutTrainPhaseFixedMask", "channels = 10\nheight = 2\nwidth = 2",
       "[[layer]]\nname = \"drop\"\ntype = \"Dropout\"\nbottom = \"data\"\ntop = \"t\"\ndropout_ratio = 0.4\n"},
      {"SoftmaxWithLoss", "channels = 2\nheight = 2\nwidth = 2",
       "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"scores\", \"label\"]\ntop = \"t\"\n", 4},
  };
  return cases;
}

// The case's layer inside a net InferShapes accepts: an inner product and a loss after it, or
// (a loss) an inner product giving its scores.
Status MakeGradientCase(const GradientCase& g, uint32_t seed, LayerCase* out) {
  const bool is_loss = g.layer.find("SoftmaxWithLoss") != std::string::npos;
  std::string toml = "name = \"gradcheck\"\n[input]\n" + g.input + "\n";
  int index = 0;
  if (is_loss) {
    toml += "[[layer]]\nname = \"fc0\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"scores\"\nnum_output = 7\n";
    index = 1;
  }
  toml += g.layer;
  if (!is_loss)
    toml +=
        "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"t\"\ntop = \"fc\"\nnum_output = 3\n"
        "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n";
  NetSpec spec;
  DP_RETURN_IF_ERROR(ParseNetSpecString(toml, g.name, &spec));
  DP_RETURN_IF_ERROR(MakeLayerCase(spec, index, g.batch, seed, out));
  if (g.prepare) g.prepare(out);
  return Status::Ok();
}

}  // namespace downpour::engine
