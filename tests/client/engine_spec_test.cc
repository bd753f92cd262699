// NetSpec parsing and shape inference: the shipped model configs, and bad configs giving one
// clear error naming the layer (unknown type, missing bottom, shape mismatch, bad field).
#include <fmt/format.h>
#include <set>
#include <string>
#include <gtest/gtest.h>

#include "client/engine/net.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

std::string ModelPath(const char* name) { return fmt::format("{}/configs/models/{}", DOWNPOUR_SOURCE_DIR, name); }

TEST(EngineSpec, AlexNetHasCaffesParameterCountAndShapes) {
  NetSpec spec;
  Status s = ParseNetSpecFile(ModelPath("alexnet.toml"), &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetShapes shapes;
  s = InferShapes(spec, 64, &shapes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(TotalElements(shapes.params), 60965224);
  EXPECT_EQ(shapes.num_classes, 1000);
  EXPECT_EQ(shapes.blobs.at("conv1"), (std::vector<int>{64, 96, 55, 55}));
  EXPECT_EQ(shapes.blobs.at("pool1"), (std::vector<int>{64, 96, 27, 27}));
  EXPECT_EQ(shapes.blobs.at("pool2"), (std::vector<int>{64, 256, 13, 13}));
  EXPECT_EQ(shapes.blobs.at("pool5"), (std::vector<int>{64, 256, 6, 6}));
  ASSERT_EQ(shapes.params.size(), 16u);
  EXPECT_EQ(shapes.params[0].name, "conv1.weight");
  EXPECT_EQ(shapes.params[2].shape, (std::vector<int64_t>{256, 48, 5, 5}));  // groups 2: OIHW, I = C/2
  EXPECT_EQ(shapes.params[10].name, "fc6.weight");
  EXPECT_EQ(shapes.params[10].shape, (std::vector<int64_t>{4096, 9216}));
  EXPECT_EQ(shapes.params[11].lr_mult, 2.0f);     // bias: Caffe multipliers
  EXPECT_EQ(shapes.params[11].decay_mult, 0.0f);
  EXPECT_EQ(shapes.params[10].lr_mult, 1.0f);
  EXPECT_EQ(shapes.params[10].decay_mult, 1.0f);
}

TEST(EngineSpec, SmallNetsParse) {
  for (const char* name : {"fmnist_small.toml", "cifar10_small.toml"}) {
    NetSpec spec;
    Status s = ParseNetSpecFile(ModelPath(name), &spec);
    ASSERT_TRUE(s.ok()) << s.ToString();
    NetShapes shapes;
    s = InferShapes(spec, 8, &shapes);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(shapes.num_classes, 10) << name;
  }
}

TEST(EngineSpec, CaffePoolingRoundsUpAndClips) {
  EXPECT_EQ(PoolOutputSize(55, 3, 2, 0), 27);
  EXPECT_EQ(PoolOutputSize(24, 3, 2, 0), 12);  // ceil((24-3)/2)+1, floor would give 11
  EXPECT_EQ(PoolOutputSize(5, 3, 2, 1), 3);    // last window would start in the padding: clipped
  EXPECT_EQ(ConvOutputSize(227, 11, 4, 0), 55);
}

constexpr char kHeader[] = "name = \"t\"\n[input]\nchannels = 2\nheight = 8\nwidth = 8\n";

Status Build(const std::string& layers) {
  NetSpec spec;
  DP_RETURN_IF_ERROR(ParseNetSpecString(std::string(kHeader) + layers, "t.toml", &spec));
  NetShapes shapes;
  return InferShapes(spec, 2, &shapes);
}

constexpr char kLoss[] =
    "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"fc\"\nnum_output = 3\n"
    "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n";

TEST(EngineSpec, ValidMinimalNet) {
  Status s = Build(kLoss);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(EngineSpec, UnknownLayerTypeNamesTheLayer) {
  Status s = Build("[[layer]]\nname = \"c1\"\ntype = \"Conv\"\nbottom = \"data\"\ntop = \"c1\"\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("t.toml"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'c1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("unknown type 'Conv'"), std::string::npos) << s.message();
}

// Every row of activations.h: one per kind and name, its default alpha passes its own rule, and
// its derivative is its forward's (central differences away from the kink at 0).
TEST(EngineSpec, EveryActivationRowIsConsistent) {
  std::set<std::string> names;
  std::set<int> kinds;
  for (const ActivationRow& row : kActivations) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(kinds.insert(static_cast<int>(row.kind)).second) << row.name;
    EXPECT_EQ(&ActivationOf(row.kind), &row) << row.name;
    EXPECT_EQ(FindActivation(row.name), &row) << row.name;
    EXPECT_TRUE(row.alpha_ok(row.alpha_default)) << row.name;
    for (float alpha : {row.alpha_default, 0.5f}) {
      for (double x : {-2.5, -0.7, -0.05, 0.05, 0.3, 1.7}) {
        const double h = 1e-3;
        const double numeric = (double(row.forward(float(x + h), alpha)) - row.forward(float(x - h), alpha)) / (2 * h);
        const float y = row.forward(float(x), alpha);
        EXPECT_NEAR(row.derivative(float(x), y, alpha), numeric, 2e-3) << row.name << " alpha " << alpha << " x " << x;
      }
    }
  }
  EXPECT_EQ(FindActivation("Sigmoid"), nullptr);
}

TEST(EngineSpec, AnActivationTypeParsesToItsRowWithItsParameter) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString(std::string(kHeader) + "[[layer]]\nname = \"r\"\ntype = \"ReLU\"\nbottom = \"data\"\n"
                                 "top = \"r\"\n" + kLoss, "t.toml", &spec).ok());
  EXPECT_EQ(spec.layers[0].type, LayerType::kActivation);
  EXPECT_EQ(spec.layers[0].activation, ActivationKind::kReLU);
  EXPECT_STREQ(TypeNameOf(spec.layers[0]), "ReLU");
  const Status s = Build("[[layer]]\nname = \"c1\"\ntype = \"Relu\"\nbottom = \"data\"\ntop = \"c1\"\n");
  EXPECT_NE(s.message().find("ReLU"), std::string::npos) << "the known types list the activations: " << s.message();
}

// A boolean key takes true or false only, as the run config's do (bias_term = 1 was read as true).
TEST(EngineSpec, ABooleanKeyTakesOnlyTrueOrFalse) {
  const Status s = Build(
      "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"data\"\ntop = \"fc\"\nnum_output = 3\n"
      "bias_term = 1\n");
  EXPECT_NE(s.message().find("layer 'fc' (#0): field 'bias_term' must be a boolean"), std::string::npos)
      << s.message();
}

// Every row of kLayerTypes: one per type and name, found by both; its keys known to the reader.
TEST(EngineSpec, EveryLayerTypeRowIsConsistent) {
  std::set<std::string> names;
  std::set<int> types;
  for (const LayerTypeRow& row : kLayerTypes) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(types.insert(static_cast<int>(row.type)).second) << row.name;
    EXPECT_EQ(&LayerTypeOf(row.type), &row) << row.name;
    if (row.type != LayerType::kActivation) {
      EXPECT_EQ(FindLayerType(row.name), &row) << row.name;
    }
    EXPECT_TRUE(row.bottoms == 1 || row.bottoms == 2) << row.name;
    EXPECT_NE(row.shape, nullptr) << row.name;
  }
  EXPECT_EQ(FindLayerType("activation"), nullptr) << "activations are found by their own names";
  EXPECT_EQ(FindLayerType("Deconvolution"), nullptr);
}

// PReLU: a slope per channel (C) or one (channel_shared), Caffe's default filler, one param table.
TEST(EngineSpec, PreluHasASlopePerChannelOrOneShared) {
  const std::string prelu = "[[layer]]\nname = \"p\"\ntype = \"PReLU\"\nbottom = \"data\"\ntop = \"p\"\n";
  const std::string loss =
      "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"p\"\ntop = \"fc\"\nnum_output = 3\n"
      "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n";
  for (const bool shared : {false, true}) {
    NetSpec spec;
    const std::string text = std::string(kHeader) + prelu + (shared ? "channel_shared = true\n" : "") +
                             "param = [{ lr_mult = 1, decay_mult = 0 }]\n" + loss;
    ASSERT_TRUE(ParseNetSpecString(text, "t.toml", &spec).ok());
    const LayerSpec& l = spec.layers[0];
    EXPECT_EQ(l.type, LayerType::kPReLU);
    EXPECT_EQ(l.channel_shared, shared);
    EXPECT_EQ(l.weight_filler.type, FillerType::kConstant);
    EXPECT_FLOAT_EQ(l.weight_filler.value, 0.25f);
    EXPECT_FLOAT_EQ(l.weight_decay_mult, 0.0f);
    NetShapes shapes;
    ASSERT_TRUE(InferShapes(spec, 2, &shapes).ok());
    ASSERT_EQ(shapes.layer_params[0].size(), 1u);
    const TensorSpec& slopes = shapes.params[static_cast<size_t>(shapes.layer_params[0][0])];
    EXPECT_EQ(slopes.name, "p.weight");
    EXPECT_EQ(slopes.shape, (std::vector<int64_t>{shared ? 1 : shapes.blobs.at("data")[1]}));
    EXPECT_EQ(shapes.blobs.at("p"), shapes.blobs.at("data"));
  }
  Status s = Build(prelu + "param = [{ lr_mult = 1 }, { lr_mult = 2 }]\n");
  EXPECT_NE(s.message().find("'param' must be a list of at most 1 table"), std::string::npos) << s.message();
  s = Build(prelu + "channel_shared = 1\n");
  EXPECT_NE(s.message().find("field 'channel_shared' must be a boolean"), std::string::npos) << s.message();
}

TEST(EngineSpec, MissingBottomNamesTheLayerAndBlob) {
  Status s = Build("[[layer]]\nname = \"r\"\ntype = \"ReLU\"\nbottom = \"nope\"\ntop = \"r\"\n");
  EXPECT_NE(s.message().find("'r'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s.message();
}

TEST(EngineSpec, ShapeMismatchNamesTheLayer) {
  // A 9x9 kernel on an 8x8 input.
  Status s = Build("[[layer]]\nname = \"big\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"big\"\n"
                   "num_output = 2\nkernel_size = 9\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'big'"), std::string::npos) << s.message();
  // Group that does not divide the input channels (2).
  s = Build("[[layer]]\nname = \"g\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"g\"\n"
            "num_output = 3\nkernel_size = 3\ngroup = 3\n");
  EXPECT_NE(s.message().find("'g'"), std::string::npos) << s.message();
  // Scores into a loss must be 2-D.
  s = Build("[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"data\", \"label\"]\ntop = \"loss\"\n");
  EXPECT_NE(s.message().find("'loss'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2-D"), std::string::npos) << s.message();
}

TEST(EngineSpec, UnknownFieldAndMissingLossAreErrors) {
  Status s = Build("[[layer]]\nname = \"r\"\ntype = \"ReLU\"\nbottom = \"data\"\ntop = \"r\"\nslope = 1\n");
  EXPECT_NE(s.message().find("unknown field 'slope'"), std::string::npos) << s.message();
  s = Build("[[layer]]\nname = \"r\"\ntype = \"ReLU\"\nbottom = \"data\"\ntop = \"r\"\n");
  EXPECT_NE(s.message().find("no SoftmaxWithLoss"), std::string::npos) << s.message();
}

constexpr char kPoolThenLoss[] =
    "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"p\"\ntop = \"fc\"\nnum_output = 3\n"
    "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n";

Status ParsePool(const std::string& fields, NetSpec* spec) {
  return ParseNetSpecString(fmt::format("{}[[layer]]\nname = \"p1\"\ntype = \"Pooling\"\nbottom = \"data\"\ntop = "
                                        "\"p\"\nkernel_size = 3\nstride = 2\n{}{}",
                                        kHeader, fields, kPoolThenLoss),
                            "t.toml", spec);
}

TEST(EngineSpec, PoolMethodIsMaxByDefaultAndAveWhenAsked) {
  NetSpec spec;
  Status s = ParsePool("", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(spec.layers[0].pool, PoolMethod::kMax);
  s = ParsePool("pool = \"max\"\n", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(spec.layers[0].pool, PoolMethod::kMax);
  s = ParsePool("pool = \"ave\"\n", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(spec.layers[0].pool, PoolMethod::kAve);
  EXPECT_STREQ(PoolMethodName(PoolMethod::kAve), "ave");
  EXPECT_STREQ(PoolMethodName(PoolMethod::kMax), "max");
  // Same output size as max: Caffe's ceil rounding (8 → 4).
  NetShapes shapes;
  ASSERT_TRUE(InferShapes(spec, 2, &shapes).ok());
  EXPECT_EQ(shapes.blobs.at("p"), (std::vector<int>{2, 2, 4, 4}));
}

TEST(EngineSpec, UnknownPoolMethodNamesTheLayerAndTheValue) {
  NetSpec spec;
  Status s = ParsePool("pool = \"avg\"\n", &spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'p1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'avg'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("max, ave"), std::string::npos) << s.message();
  s = ParsePool("pool = 1\n", &spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'p1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'pool'"), std::string::npos) << s.message();
}

// Without padding Caffe keeps a ceil-rounded last window that starts past the input (stride >
// kernel): it would be empty, so the shape inference refuses it, naming the layer.
TEST(EngineSpec, PoolingWithAnEmptyLastWindowIsAnError) {
  const std::string layer =
      "[[layer]]\nname = \"gap\"\ntype = \"Pooling\"\nbottom = \"data\"\ntop = \"p\"\npool = \"ave\"\n"
      "kernel_size = 2\nstride = 3\n";
  Status s = Build(layer + kPoolThenLoss);  // 8 wide: windows at 0, 3, 6 — fine
  EXPECT_TRUE(s.ok()) << s.ToString();
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString("name = \"t\"\n[input]\nchannels = 2\nheight = 6\nwidth = 6\n" + layer + kPoolThenLoss,
                                 "t.toml", &spec)
                  .ok());
  NetShapes shapes;
  s = InferShapes(spec, 2, &shapes);  // 6 wide: ceil gives windows at 0, 3, 6 — the last is empty
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'gap'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("past the input"), std::string::npos) << s.message();
}

TEST(EngineSpec, GpuWithoutCudaBuildIsAnErrorNotAFallback) {
  NetOptions opt;
  opt.worker.device = DeviceKind::kGpu;
  std::unique_ptr<Backend> backend;
  Status s = CreateBackend(opt, &backend);
#if DOWNPOUR_HAVE_CUDA
  if (s.ok()) {
    EXPECT_EQ(backend->device(), DeviceKind::kGpu);
  }
#else
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(backend, nullptr);
#endif
}

}  // namespace
}  // namespace downpour::engine
