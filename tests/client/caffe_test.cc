// caffe_test.cc — Caffe interop (client/caffe, downpour-caffe):
//  * prototxt import: Caffe's own bvlc_alexnet, LeNet and CIFAR-10 quick (tests/client/caffe/)
//    become models with Caffe's parameter counts, and AlexNet the very tensors and blob shapes of
//    configs/models/alexnet.toml; unsupported layers, field values, a missing --input and a
//    malformed file are one error naming the file and the layer;
//  * weights: .caffemodel export → import → export is byte-identical and bit-exact; an old V1
//    caffemodel with legacy num/channels/height/width blobs imports; a shape mismatch is refused
//    naming the layer and both shapes, writing nothing; LoadWeightsFile is all or nothing and
//    does Caffe's fine-tuning rule only when asked;
//  * .npy export read back by our decoder and by Python's standard library;
//  * the tool's --version and exit codes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "client/caffe/caffemodel.h"
#include "client/caffe/npy.h"
#include "client/caffe/prototxt_import.h"
#include "client/caffe/weights_io.h"
#include "client/engine/activations.h"
#include "client/engine/net.h"
#include "client/engine/reference_backend.h"
#include "common/tensor_file.h"
#include "data/caffe.pb.h"
#include "tests/testing/harness.h"

namespace downpour::caffe_io {
namespace {

namespace fs = std::filesystem;
using engine::NetShapes;
using engine::NetSpec;

std::string Data(const std::string& name) { return test::SourcePath("tests/client/caffe/" + name); }
std::string Tool() { return test::Binary("downpour-caffe"); }

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs the tool; returns its exit code and fills `out` with stdout + stderr.
int RunTool(const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv{Tool()};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::RunCommand(argv, out);
}

Import MustImport(const std::string& path, const std::string& input = "", const std::string& phase = "train") {
  ImportOptions options;
  EXPECT_TRUE(ParsePhase(phase, &options).ok());
  if (!input.empty()) {
    EXPECT_TRUE(ParseInputSize(input, &options).ok());
  }
  Import import;
  const Status s = ImportPrototxtFile(path, options, &import);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return import;
}

Status ImportText(const std::string& text, Import* import, const std::string& input = "",
                  const std::string& phase = "train") {
  ImportOptions options;
  DP_RETURN_IF_ERROR(ParsePhase(phase, &options));
  if (!input.empty()) DP_RETURN_IF_ERROR(ParseInputSize(input, &options));
  return ImportPrototxtText(text, "net.prototxt", options, import);
}

const engine::LayerSpec* FindLayer(const NetSpec& spec, const std::string& name) {
  for (const auto& l : spec.layers) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

std::unique_ptr<engine::Net> BuildNet(const NetSpec& spec, uint64_t seed, int batch = 2) {
  engine::NetOptions options;
  options.batch = batch;
  options.reference = true;
  options.worker.threads = 1;
  std::unique_ptr<engine::Net> net;
  const Status s = engine::Net::CreateWithBackend(spec, options, engine::MakeReferenceBackend(), &net);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (net) net->InitParams(seed);
  return net;
}

std::vector<float> Copy(std::span<float> s) { return {s.begin(), s.end()}; }

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One forward-backward of a freshly imported net on a small deterministic batch: the net builds
// and runs, and its loss is finite.
// `text` with its first `hole` replaced by `value`.
// A deploy net on 1×3×8×8: conv1 (4 outputs), then `layer` (in place on conv1, the layer type
// under test), an inner product of 5 and a softmax.
std::string ConvNetAround(const std::string& name, const std::string& layer) {
  return "name: \"" + name + R"("
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 3 } }
)" + layer +
         R"(
layer { name: "ip" type: "InnerProduct" bottom: "conv1" top: "ip" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
)";
}

std::string Fill(std::string text, const std::string& hole, const std::string& value) {
  const size_t at = text.find(hole);
  EXPECT_NE(at, std::string::npos) << hole;
  if (at != std::string::npos) text.replace(at, hole.size(), value);
  return text;
}

void ExpectTrains(const NetSpec& spec) {
  auto net = BuildNet(spec, 3);
  ASSERT_NE(net, nullptr);
  std::vector<float> images(static_cast<size_t>(net->input_count()));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  std::vector<int> labels(static_cast<size_t>(net->batch_size()));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int>(i) % net->num_classes();
  const float loss = net->ForwardBackward(images.data(), labels.data());
  EXPECT_TRUE(std::isfinite(loss)) << spec.name << " loss " << loss;
}

// ---------------------------------------------------------------------------------------------
// import-prototxt

// The importer reads an activation's parameter where its row says (engine/activations.h): that
// field must exist in the bundled caffe.proto, as a float.
TEST(CaffePrototxt, EveryActivationRowNamesAFloatFieldOfCaffesLayerParameter) {
  const google::protobuf::Descriptor* layer = ::caffe::LayerParameter::descriptor();
  for (const engine::ActivationRow& row : engine::kActivations) {
    const google::protobuf::FieldDescriptor* holder = layer->FindFieldByName(row.caffe_message);
    ASSERT_NE(holder, nullptr) << row.name << ": LayerParameter has no " << row.caffe_message;
    ASSERT_EQ(holder->cpp_type(), google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) << row.name;
    const google::protobuf::FieldDescriptor* field = holder->message_type()->FindFieldByName(row.caffe_field);
    ASSERT_NE(field, nullptr) << row.name << ": " << row.caffe_message << " has no " << row.caffe_field;
    EXPECT_EQ(field->cpp_type(), google::protobuf::FieldDescriptor::CPPTYPE_FLOAT) << row.name;
    EXPECT_EQ(field->default_value_float(), row.alpha_default) << row.name << ": Caffe's default";
  }
}

TEST(CaffePrototxt, BvlcAlexnetHasTheTensorsAndBlobShapesOfConfigsAlexnet) {
  const Import import = MustImport(Data("bvlc_alexnet_train_val.prototxt"));
  NetSpec ours;
  ASSERT_TRUE(engine::ParseNetSpecFile(test::SourcePath("configs/models/alexnet.toml"), &ours).ok());
  NetShapes a, b;
  ASSERT_TRUE(engine::InferShapes(import.spec, 4, &a).ok());
  ASSERT_TRUE(engine::InferShapes(ours, 4, &b).ok());
  EXPECT_EQ(TotalElements(a.params), 60965224);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name) << i;
    EXPECT_EQ(a.params[i].shape, b.params[i].shape) << a.params[i].name;
    EXPECT_EQ(a.params[i].lr_mult, b.params[i].lr_mult) << a.params[i].name;
    EXPECT_EQ(a.params[i].decay_mult, b.params[i].decay_mult) << a.params[i].name;
  }
  EXPECT_EQ(a.blobs, b.blobs);  // every blob, named as alexnet.toml names them (relu1, drop6, ...)
  EXPECT_EQ(a.num_classes, 1000);
  // The Data layer's crop_size fixes 227×227; colour is assumed for the LMDB's channels.
  EXPECT_EQ(import.spec.input_channels, 3);
  EXPECT_EQ(import.spec.input_height, 227);
  EXPECT_EQ(import.spec.input_width, 227);
  // Same net in the test phase (the val Data layer, the same crop).
  const Import test_phase = MustImport(Data("bvlc_alexnet_train_val.prototxt"), "", "test");
  NetShapes c;
  ASSERT_TRUE(engine::InferShapes(test_phase.spec, 4, &c).ok());
  EXPECT_EQ(c.blobs, b.blobs);
  EXPECT_EQ(TotalElements(c.params), 60965224);
}

TEST(CaffePrototxt, AlexnetTomlNamesItsSourceAndTheDataLayersRunConfigKeys) {
  const Import import = MustImport(Data("bvlc_alexnet_train_val.prototxt"));
  const std::string& t = import.toml;
  EXPECT_TRUE(Contains(t, "# Imported from the Caffe prototxt " + Data("bvlc_alexnet_train_val.prototxt"))) << t;
  EXPECT_TRUE(Contains(t, "phase train")) << t;
  // The train layer's transform_param (mirror true; the TEST layer has mirror false).
  EXPECT_TRUE(Contains(t, "#   crop = 227")) << t;
  EXPECT_TRUE(Contains(t, "#   mirror = true")) << t;
  EXPECT_TRUE(Contains(t, "#   mean_file = \"data/ilsvrc12/imagenet_mean.binaryproto\"")) << t;
  EXPECT_TRUE(Contains(t, "#   scale = 1.0")) << t;
  EXPECT_TRUE(Contains(t, "#   train = \"examples/imagenet/ilsvrc12_train_lmdb\"")) << t;
  EXPECT_TRUE(Contains(t, "#   batch_size = 144")) << t;
  // In-place ReLU / Dropout tops renamed after their layer, later bottoms rewired.
  const engine::LayerSpec* norm1 = FindLayer(import.spec, "norm1");
  ASSERT_NE(norm1, nullptr);
  EXPECT_EQ(norm1->bottoms, std::vector<std::string>{"relu1"});
  const engine::LayerSpec* fc7 = FindLayer(import.spec, "fc7");
  ASSERT_NE(fc7, nullptr);
  EXPECT_EQ(fc7->bottoms, std::vector<std::string>{"drop6"});
  // The TEST-only accuracy layer is kept (one net trains and evaluates), with a note.
  ASSERT_NE(FindLayer(import.spec, "accuracy"), nullptr);
  EXPECT_TRUE(Contains(t, "kept Accuracy layer 'accuracy'")) << t;
}

// LeNet (V1-format file, Caffe's examples/mnist) with --input 1x28x28. Caffe's count, by hand:
//   conv1 20×1×5×5 + 20 = 520          28 → 24 (conv 5) → 12 (pool 2/2)
//   conv2 50×20×5×5 + 50 = 25,050      12 → 8 → 4
//   ip1   500×(50·4·4) + 500 = 400,500
//   ip2   10×500 + 10 = 5,010          total 431,080
TEST(CaffePrototxt, LenetNeedsInputAndHasCaffesParameterCount) {
  ImportOptions options;
  Import import;
  Status s = ImportPrototxtFile(Data("lenet_train_test.prototxt"), options, &import);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), Data("lenet_train_test.prototxt"))) << s.message();
  EXPECT_TRUE(Contains(s.message(), "Data layer 'mnist' does not fix the input size")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "--input CxHxW")) << s.message();

  import = MustImport(Data("lenet_train_test.prototxt"), "1x28x28");
  EXPECT_EQ(TotalElements(import.shapes.params), 431080);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"conv1.weight", {20, 1, 5, 5}}, {"conv1.bias", {20}}, {"conv2.weight", {50, 20, 5, 5}}, {"conv2.bias", {50}},
      {"ip1.weight", {500, 800}},      {"ip1.bias", {500}},  {"ip2.weight", {10, 500}},        {"ip2.bias", {10}}};
  ASSERT_EQ(import.shapes.params.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(import.shapes.params[i].name, want[i].first);
    EXPECT_EQ(import.shapes.params[i].shape, want[i].second) << want[i].first;
  }
  // V1 blobs_lr: 1, 2 and no weight_decay: Caffe's multipliers are lr 1/2, decay 1/1.
  EXPECT_EQ(import.shapes.params[1].lr_mult, 2.0f);
  EXPECT_EQ(import.shapes.params[1].decay_mult, 1.0f);
  EXPECT_EQ(import.spec.input_channels, 1);
  EXPECT_TRUE(Contains(import.toml, "#   scale = 0.00390625")) << import.toml;
  EXPECT_EQ(FindLayer(import.spec, "ip2")->bottoms, std::vector<std::string>{"relu1"});
  ExpectTrains(import.spec);
}

// CIFAR-10 quick (V1 file) with --input 3x32x32, MAX then AVE pooling. By hand:
//   conv1 32×3×5×5 + 32 = 2,432        32 → 32 (pad 2) → 16 (pool 3/2, ceil)
//   conv2 32×32×5×5 + 32 = 25,632      16 → 16 → 8
//   conv3 64×32×5×5 + 64 = 51,264      8 → 8 → 4
//   ip1   64×(64·4·4) + 64 = 65,600
//   ip2   10×64 + 10 = 650             total 145,578
TEST(CaffePrototxt, Cifar10QuickImportsWithAvePoolingAndCaffesParameterCount) {
  const Import import = MustImport(Data("cifar10_quick_train_test.prototxt"), "3x32x32");
  EXPECT_EQ(TotalElements(import.shapes.params), 145578);
  EXPECT_EQ(import.shapes.blobs.at("pool1"), (std::vector<int>{1, 32, 16, 16}));
  EXPECT_EQ(import.shapes.blobs.at("pool2"), (std::vector<int>{1, 32, 8, 8}));
  EXPECT_EQ(import.shapes.blobs.at("pool3"), (std::vector<int>{1, 64, 4, 4}));
  EXPECT_TRUE(Contains(import.toml,
                       "name = \"pool2\"\ntype = \"Pooling\"\nbottom = [\"relu2\"]\ntop = [\"pool2\"]\n"
                       "pool = \"ave\"\n"))
      << import.toml;
  EXPECT_TRUE(Contains(import.toml,
                       "name = \"pool1\"\ntype = \"Pooling\"\nbottom = [\"conv1\"]\ntop = [\"pool1\"]\n"
                       "pool = \"max\"\n"))
      << import.toml;
  EXPECT_TRUE(Contains(import.toml, "#   mean_file = \"examples/cifar10/mean.binaryproto\"")) << import.toml;
  ExpectTrains(import.spec);
}

TEST(CaffePrototxt, InputThatDisagreesWithTheCropIsAnError) {
  ImportOptions options;
  ASSERT_TRUE(ParseInputSize("3x224x224", &options).ok());
  Import import;
  const Status s = ImportPrototxtFile(Data("bvlc_alexnet_train_val.prototxt"), options, &import);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "--input 3x224x224 disagrees with")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "crop_size of Data layer 'data'")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "(227x227)")) << s.message();
  // --input may set the channels the Data layer leaves open.
  import = MustImport(Data("bvlc_alexnet_train_val.prototxt"), "1x227x227");
  EXPECT_EQ(import.spec.input_channels, 1);
}

TEST(CaffePrototxt, UnsupportedLayerTypeIsOneErrorNamingFileLayerTypeAndTheSupportedOnes) {
  const std::string text = R"(name: "bn_net"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "cat" type: "Concat" bottom: "conv1" bottom: "data" top: "cat" }
)";
  Import import;
  const Status s = ImportText(text, &import);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(),
                       "net.prototxt:4: layer 'bn1' (#2, BatchNorm): layer type 'BatchNorm' is not "
                       "supported by the downpour engine (supported: Accuracy, Convolution, "))
      << s.message();
  // Every convertible type, each once as a list item: the fixed ones and the activations' rows.
  const auto listed = [&](const std::string& type) {
    return Contains(s.message(), " " + type + ",") || Contains(s.message(), " " + type + ";");
  };
  for (const char* type : {"Dropout", "InnerProduct", "LRN", "Pooling", "Softmax", "SoftmaxWithLoss"}) {
    EXPECT_TRUE(listed(type)) << type << ": " << s.message();
  }
  for (const engine::ActivationRow& row : engine::kActivations) EXPECT_TRUE(listed(row.name)) << row.name;
  EXPECT_TRUE(Contains(s.message(), "; inputs: Data, ImageData, Input)")) << s.message();
  EXPECT_FALSE(Contains(s.message(), "Concat")) << "one error, the first: " << s.message();
}

// ELU (elu_param.alpha) imports as type "ELU" with its alpha, and trains; an alpha outside its
// row's rule is one error naming the field.
TEST(CaffePrototxt, EluImportsWithItsAlphaAndTrains) {
  const std::string net =
      ConvNetAround("elu", R"(layer { name: "elu1" type: "ELU" bottom: "conv1" top: "conv1" ALPHA })");
  const auto with = [&](const std::string& alpha) { return Fill(net, "ALPHA", alpha); };
  Import import;
  Status s = ImportText(with("elu_param { alpha: 0.3 }"), &import);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Contains(import.toml, "type = \"ELU\"")) << import.toml;
  const engine::LayerSpec* elu = FindLayer(import.spec, "elu1");
  ASSERT_NE(elu, nullptr);
  EXPECT_EQ(elu->type, engine::LayerType::kActivation);
  EXPECT_EQ(elu->activation, engine::ActivationKind::kELU);
  EXPECT_FLOAT_EQ(elu->activation_alpha, 0.3f);
  ExpectTrains(import.spec);
  ASSERT_TRUE(ImportText(with(""), &import).ok());
  EXPECT_FLOAT_EQ(FindLayer(import.spec, "elu1")->activation_alpha, 1.0f) << "Caffe's default";
  s = ImportText(with("elu_param { alpha: -1 }"), &import);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "layer 'elu1' (#2, ELU): elu_param.alpha = -1: must be finite and >= 0"))
      << s.message();
}

// A layer row converted by the table (net_spec.h LayerTypeRow::caffe_message) names a message
// field of the bundled caffe.proto's LayerParameter, each of its keys' caffe_field a bool or
// number field of that message with the row's default, and its caffe_filler a FillerParameter.
TEST(CaffePrototxt, EveryTableLayerRowNamesFieldsOfCaffesLayerParameter) {
  const google::protobuf::Descriptor* layer = ::caffe::LayerParameter::descriptor();
  int rows = 0;
  for (const engine::LayerTypeRow& row : engine::kLayerTypes) {
    if (*row.caffe_message == '\0') continue;
    ++rows;
    const google::protobuf::FieldDescriptor* holder = layer->FindFieldByName(row.caffe_message);
    ASSERT_NE(holder, nullptr) << row.name << ": LayerParameter has no " << row.caffe_message;
    ASSERT_EQ(holder->cpp_type(), google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) << row.name;
    engine::LayerSpec defaults;
    if (row.defaults != nullptr) row.defaults(&defaults);
    for (const engine::LayerKey& key : row.keys) {
      const google::protobuf::FieldDescriptor* f = holder->message_type()->FindFieldByName(key.caffe_field);
      ASSERT_NE(f, nullptr) << row.name << ": " << row.caffe_message << " has no " << key.caffe_field;
      const double ours = std::visit([&](auto m) { return static_cast<double>(defaults.*m); }, key.member);
      switch (f->cpp_type()) {
        case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
          EXPECT_EQ(f->default_value_bool(), ours != 0) << row.name << "." << key.name;
          break;
        case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT:
          EXPECT_EQ(f->default_value_float(), static_cast<float>(ours)) << row.name << "." << key.name;
          break;
        default:
          ADD_FAILURE() << row.name << "." << key.name << ": not a bool or float field";
      }
    }
    if (*row.caffe_filler != '\0') {
      const google::protobuf::FieldDescriptor* f = holder->message_type()->FindFieldByName(row.caffe_filler);
      ASSERT_NE(f, nullptr) << row.name;
      EXPECT_EQ(f->message_type(), ::caffe::FillerParameter::descriptor()) << row.name;
    }
  }
  EXPECT_GE(rows, 2) << "Dropout and PReLU are converted by the table";
}

// PReLU (He et al. 2015), a layer with learnable slopes, imported from its row: prelu_param's
// filler and channel_shared, its one param { } entry; Caffe's defaults (constant 0.25, a slope
// per channel) when prelu_param is absent; then it trains.
TEST(CaffePrototxt, PreluImportsItsSlopesFillerAndSharingAndTrains) {
  const std::string net =
      ConvNetAround("prelu", R"(layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" PRELU })");
  const auto with = [&](const std::string& prelu) { return Fill(net, "PRELU", prelu); };
  Import import;
  Status s = ImportText(
      with("param { lr_mult: 1 decay_mult: 0 } prelu_param { filler { type: \"constant\" value: 0.1 } }"), &import);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Contains(import.toml, "type = \"PReLU\"")) << import.toml;
  const engine::LayerSpec* prelu = FindLayer(import.spec, "prelu1");
  ASSERT_NE(prelu, nullptr);
  EXPECT_EQ(prelu->type, engine::LayerType::kPReLU);
  EXPECT_EQ(prelu->weight_filler.type, engine::FillerType::kConstant);
  EXPECT_FLOAT_EQ(prelu->weight_filler.value, 0.1f);
  EXPECT_FALSE(prelu->channel_shared);
  EXPECT_FLOAT_EQ(prelu->weight_decay_mult, 0.0f);
  bool found = false;
  for (const TensorSpec& t : import.shapes.params) {
    if (t.name != "prelu1.weight") continue;
    found = true;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{4})) << "a slope per channel of conv1";
  }
  EXPECT_TRUE(found);
  ExpectTrains(import.spec);

  ASSERT_TRUE(ImportText(with("prelu_param { channel_shared: true }"), &import).ok());
  prelu = FindLayer(import.spec, "prelu1");
  EXPECT_TRUE(prelu->channel_shared);
  EXPECT_FLOAT_EQ(prelu->weight_filler.value, 0.25f) << "Caffe's default filler";
  for (const TensorSpec& t : import.shapes.params) {
    if (t.name == "prelu1.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{1}));
    }
  }
  ExpectTrains(import.spec);

  s = ImportText(with("param { lr_mult: 1 } param { lr_mult: 2 }"), &import);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "layer 'prelu1' (#2, PReLU): 2 param { } entries for 1 parameter blob"))
      << s.message();
  s = ImportText(with("prelu_param { filler { type: \"bilinear\" } }"), &import);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "prelu_param.filler.type 'bilinear' is not supported")) << s.message();
}

TEST(CaffePrototxt, MalformedPrototxtNamesFileLineAndLayer) {
  const std::string text = R"(name: "broken"
layer {
  name: "conv1"
  type: "Convolution"
  convolution_param {
    num_output: eight
  }
}
)";
  Import import;
  const Status s = ImportText(text, &import, "3x8x8");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "net.prototxt:6:17: not a valid Caffe NetParameter prototxt (in layer 'conv1'): Expected integer, got: "
            "eight");
}

TEST(CaffePrototxt, FieldValuesTheEngineCannotDoAreErrorsNamingLayerAndField) {
  struct Case {
    std::string layer_text;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"(layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 dilation: 2 } })",
       "layer 'c' (#1, Convolution): convolution_param.dilation = 2"},
      {R"(layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "bilinear" } } })",
       "layer 'c' (#1, Convolution): weight_filler.type 'bilinear' is not supported"},
      {R"(layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" mean: 1 } } })",
       "layer 'c' (#1, Convolution): weight_filler.mean = 1"},
      {R"(layer { name: "r" type: "ReLU" bottom: "data" top: "data" relu_param { negative_slope: 0.1 } })",
       "layer 'r' (#1, ReLU): relu_param.negative_slope = 0.1"},
      {R"(layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: STOCHASTIC kernel_size: 2 } })",
       "layer 'p' (#1, Pooling): pool: STOCHASTIC is not supported"},
      {R"(layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { global_pooling: true } })",
       "layer 'p' (#1, Pooling): global_pooling is not supported"},
      {R"(layer { name: "n" type: "LRN" bottom: "data" top: "n" lrn_param { norm_region: WITHIN_CHANNEL } })",
       "layer 'n' (#1, LRN): lrn_param.norm_region WITHIN_CHANNEL"},
      {R"(layer { name: "f" type: "InnerProduct" bottom: "data" top: "f" inner_product_param { num_output: 3 transpose: true } })",
       "layer 'f' (#1, InnerProduct): inner_product_param.transpose = true"},
  };
  for (const Case& c : cases) {
    const std::string text =
        "layer { name: \"in\" type: \"Input\" top: \"data\" input_param { shape { dim: 1 dim: "
        "3 dim: 8 dim: 8 } } }\n" +
        c.layer_text + "\n";
    Import import;
    const Status s = ImportText(text, &import);
    ASSERT_FALSE(s.ok()) << c.layer_text;
    EXPECT_TRUE(Contains(s.message(), "net.prototxt:2: " + c.expect)) << s.message();
  }
}

TEST(CaffePrototxt, FieldsOutsideTheSubsetAreIgnoredAndListed) {
  const std::string text = R"(name: "extra_fields"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 1 dim: 1 dim: 6 dim: 6 } shape { dim: 1 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 2 kernel_size: 3 engine: CUDNN } }
layer { name: "ip" type: "InnerProduct" bottom: "conv1" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
)";
  Import import;
  const Status s = ImportText(text, &import);
  ASSERT_TRUE(s.ok()) << s.ToString();
  bool listed = false;
  for (const std::string& n : import.notes) listed = listed || (Contains(n, "engine") && Contains(n, "line 5"));
  EXPECT_TRUE(listed) << fmt::format("{}", fmt::join(import.notes, "\n"));
  EXPECT_TRUE(Contains(import.toml, "engine")) << "the note is in the TOML header too";
}

TEST(CaffePrototxt, DeployNetWithInputAndSoftmaxBecomesATrainableModel) {
  // 3×8×8 → conv 3×3 (4) 6×6 → AVE pool 2/2 3×3 → fc 5 (no bias) → Softmax.
  // Parameters: conv1 4×3×3×3 + 4 = 112, fc 5×36 = 180: 292.
  const std::string text = R"(name: "tiny_deploy"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 10 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "msra" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc"
        inner_product_param { num_output: 5 bias_term: false weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
)";
  Import import;
  const Status s = ImportText(text, &import);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(import.spec.input_channels, 3);
  EXPECT_EQ(import.spec.input_height, 8);
  EXPECT_EQ(TotalElements(import.shapes.params), 292);
  const engine::LayerSpec& last = import.spec.layers.back();
  EXPECT_EQ(last.name, "prob");
  EXPECT_EQ(last.type, engine::LayerType::kSoftmaxWithLoss);
  EXPECT_EQ(last.bottoms, (std::vector<std::string>{"fc", "label"}));
  EXPECT_EQ(import.shapes.num_classes, 5);
  const engine::LayerSpec* fc = FindLayer(import.spec, "fc");
  EXPECT_FALSE(fc->bias_term);
  EXPECT_EQ(fc->weight_filler.type, engine::FillerType::kUniform);
  EXPECT_FLOAT_EQ(fc->weight_filler.scale, 0.1f);
  // No param { } in the prototxt: Caffe's ParamSpec defaults, lr 1 and decay 1 for the bias too.
  const engine::LayerSpec* conv1 = FindLayer(import.spec, "conv1");
  EXPECT_EQ(conv1->bias_lr_mult, 1.0f);
  EXPECT_EQ(conv1->bias_decay_mult, 1.0f);
  EXPECT_EQ(FindLayer(import.spec, "pool1")->bottoms, std::vector<std::string>{"relu1"});
  ExpectTrains(import.spec);
}

TEST(CaffePrototxt, IncludeAndExcludeRulesFollowThePhase) {
  const std::string text = R"(name: "phases"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } shape { dim: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1" inner_product_param { num_output: 6 } }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.25 } exclude { phase: TEST } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" include { phase: TRAIN } }
layer { name: "loss_test" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" include { phase: TEST } }
)";
  Import train, test_phase;
  ASSERT_TRUE(ImportText(text, &train, "", "train").ok());
  ASSERT_TRUE(ImportText(text, &test_phase, "", "test").ok());
  ASSERT_NE(FindLayer(train.spec, "drop1"), nullptr);
  EXPECT_FLOAT_EQ(FindLayer(train.spec, "drop1")->dropout_ratio, 0.25f);
  EXPECT_EQ(FindLayer(train.spec, "ip2")->bottoms, std::vector<std::string>{"drop1"});
  EXPECT_NE(FindLayer(train.spec, "loss"), nullptr);
  EXPECT_EQ(FindLayer(train.spec, "loss_test"), nullptr);
  EXPECT_EQ(FindLayer(test_phase.spec, "drop1"), nullptr);
  EXPECT_EQ(FindLayer(test_phase.spec, "ip2")->bottoms, std::vector<std::string>{"ip1"});
  EXPECT_NE(FindLayer(test_phase.spec, "loss_test"), nullptr);
  EXPECT_EQ(FindLayer(test_phase.spec, "loss"), nullptr);
}

TEST(CaffePrototxt, InputSizeAndPhaseTextsAreChecked) {
  ImportOptions o;
  EXPECT_TRUE(ParseInputSize("3x227x227", &o).ok());
  EXPECT_EQ(o.input_channels, 3);
  EXPECT_EQ(o.input_width, 227);
  for (const char* bad : {"3x227", "0x28x28", "3x-1x2", "axbxc", "3x28x28x1", ""}) {
    const Status s = ParseInputSize(bad, &o);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(Contains(s.message(), fmt::format("--input '{}'", bad))) << s.message();
  }
  EXPECT_FALSE(ParsePhase("val", &o).ok());
}

// ---------------------------------------------------------------------------------------------
// Weights: fixtures share an imported LeNet and its weights.

class CaffeWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("caffe_weights");
    model_ = (dir_ / "lenet.toml").string();
    std::string out;
    ASSERT_EQ(RunTool({"import-prototxt", Data("lenet_train_test.prototxt"), "-o", model_, "--input", "1x28x28"}, &out),
              0)
        << out;
    ASSERT_TRUE(engine::ParseNetSpecFile(model_, &spec_).ok());
    ASSERT_TRUE(engine::InferShapes(spec_, 1, &shapes_).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A weights file of a LeNet initialised with `seed`.
  std::string SaveWeights(uint64_t seed, const std::string& name) {
    auto net = BuildNet(spec_, seed);
    const std::string path = Path(name);
    EXPECT_TRUE(net->SaveWeights(path).ok());
    return path;
  }

  fs::path dir_;
  std::string model_;
  NetSpec spec_;
  NetShapes shapes_;
};

TEST_F(CaffeWeights, ExportImportExportIsByteIdenticalAndBitExact) {
  const std::string w0 = SaveWeights(7, "w0.dpt");
  std::string out;
  ASSERT_EQ(RunTool({"export-weights", w0, "--model", model_, "-o", Path("a.caffemodel")}, &out), 0) << out;
  ASSERT_EQ(RunTool({"import-weights", Path("a.caffemodel"), "--model", model_, "-o", Path("w1.dpt")}, &out), 0) << out;
  ASSERT_EQ(RunTool({"export-weights", Path("w1.dpt"), "--model", model_, "-o", Path("b.caffemodel")}, &out), 0) << out;
  const std::string a = test::ReadFile(Path("a.caffemodel")), b = test::ReadFile(Path("b.caffemodel"));
  ASSERT_GT(a.size(), 431080u * 4);
  EXPECT_TRUE(a == b) << "sizes " << a.size() << " and " << b.size();

  TensorFile f0, f1;
  ASSERT_TRUE(ReadTensorFile(w0, &f0).ok());
  ASSERT_TRUE(ReadTensorFile(Path("w1.dpt"), &f1).ok());
  ASSERT_EQ(f0.tensors.size(), f1.tensors.size());
  for (size_t i = 0; i < f0.tensors.size(); ++i) {
    EXPECT_EQ(f0.tensors[i].name, f1.tensors[i].name);
    EXPECT_EQ(f0.tensors[i].shape, f1.tensors[i].shape);
    EXPECT_TRUE(BitEqual(f0.tensors[i].data, f1.tensors[i].data)) << f0.tensors[i].name;
  }
  // The file is Caffe's new form: `layer` entries with BlobShape blobs, weight then bias.
  ::caffe::NetParameter proto;
  ASSERT_TRUE(proto.ParseFromString(a));
  EXPECT_EQ(proto.name(), "LeNet");
  EXPECT_EQ(proto.layers_size(), 0);
  ASSERT_EQ(proto.layer_size(), static_cast<int>(spec_.layers.size()));
  const ::caffe::LayerParameter* ip1 = nullptr;
  for (const auto& l : proto.layer()) {
    if (l.name() == "ip1") ip1 = &l;
  }
  ASSERT_NE(ip1, nullptr);
  EXPECT_EQ(ip1->type(), "InnerProduct");
  ASSERT_EQ(ip1->blobs_size(), 2);
  EXPECT_EQ(std::vector<int64_t>(ip1->blobs(0).shape().dim().begin(), ip1->blobs(0).shape().dim().end()),
            (std::vector<int64_t>{500, 800}));
  EXPECT_FALSE(ip1->blobs(0).has_num());
  EXPECT_EQ(ip1->blobs(1).data_size(), 500);
  EXPECT_EQ(ip1->blobs(1).data(3), FindTensor(f0, "ip1.bias")->data[3]);
}

// A V1 caffemodel as Caffe wrote them before 2015 (the model zoo's bvlc_alexnet.caffemodel):
// `layers` with enum types, blobs with num/channels/height/width only (fc weights 1×1×out×in,
// biases 1×1×1×out), layers without blobs in between, one blob saved as double_data.
TEST_F(CaffeWeights, OldV1CaffemodelWithLegacyBlobDimsImports) {
  using V1 = ::caffe::V1LayerParameter;
  ::caffe::NetParameter proto;
  proto.set_name("LeNet");
  std::map<std::string, std::vector<float>> values;  // tensor name → what the file holds
  auto add = [&](const std::string& name, V1::LayerType type) {
    V1* l = proto.add_layers();
    l->set_name(name);
    l->set_type(type);
    return l;
  };
  auto blob = [&](V1* l, const std::string& tensor, int n, int c, int h, int w, bool as_double = false) {
    ::caffe::BlobProto* b = l->add_blobs();
    b->set_num(n);
    b->set_channels(c);
    b->set_height(h);
    b->set_width(w);
    std::vector<float>& v = values[tensor];
    for (int i = 0; i < n * c * h * w; ++i) {
      // Values a double represents exactly as a float, so double_data converts back exactly.
      v.push_back(static_cast<float>(std::ldexp(std::round(std::sin(i * 0.01 + tensor.size()) * 4096), -12)));
      if (as_double)
        b->add_double_data(v.back());
      else
        b->add_data(v.back());
    }
  };
  add("mnist", V1::DATA);
  V1* conv1 = add("conv1", V1::CONVOLUTION);
  blob(conv1, "conv1.weight", 20, 1, 5, 5);
  blob(conv1, "conv1.bias", 1, 1, 1, 20);
  add("pool1", V1::POOLING);
  V1* conv2 = add("conv2", V1::CONVOLUTION);
  blob(conv2, "conv2.weight", 50, 20, 5, 5);
  blob(conv2, "conv2.bias", 1, 1, 1, 50);
  add("pool2", V1::POOLING);
  V1* ip1 = add("ip1", V1::INNER_PRODUCT);
  blob(ip1, "ip1.weight", 1, 1, 500, 800);
  blob(ip1, "ip1.bias", 1, 1, 1, 500);
  add("relu1", V1::RELU);
  V1* ip2 = add("ip2", V1::INNER_PRODUCT);
  blob(ip2, "ip2.weight", 1, 1, 10, 500);
  blob(ip2, "ip2.bias", 1, 1, 1, 10, /*as_double=*/true);
  add("loss", V1::SOFTMAX_LOSS);
  test::WriteFile(Path("old.caffemodel"), proto.SerializeAsString());

  CaffeNet caffe;
  ASSERT_TRUE(ReadCaffemodel(Path("old.caffemodel"), &caffe).ok());
  EXPECT_TRUE(caffe.from_v1);
  ASSERT_EQ(caffe.layers.size(), 9u);
  EXPECT_EQ(caffe.layers[5].type, "InnerProduct");
  EXPECT_TRUE(caffe.layers[5].blobs[0].legacy_shape);
  EXPECT_EQ(caffe.layers[5].blobs[0].shape, (std::vector<int64_t>{1, 1, 500, 800}));

  std::vector<NamedTensor> tensors;
  WeightsReport report;
  const Status s = CaffeToTensors(caffe, Path("old.caffemodel"), spec_, shapes_, {}, &tensors, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(tensors.size(), 8u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].name, shapes_.params[i].name);
    EXPECT_EQ(tensors[i].shape, shapes_.params[i].shape) << tensors[i].name;  // canonical, not legacy
    EXPECT_TRUE(BitEqual(tensors[i].data, values.at(tensors[i].name))) << tensors[i].name;
  }
  EXPECT_TRUE(report.skipped.empty());
  EXPECT_TRUE(report.kept.empty());

  // The tool and the worker's loader read it the same way.
  std::string out;
  ASSERT_EQ(RunTool({"import-weights", Path("old.caffemodel"), "--model", model_, "-o", Path("old.dpt")}, &out), 0)
      << out;
  EXPECT_TRUE(Contains(out, "(V1 layers)")) << out;
  auto net = BuildNet(spec_, 1);
  ASSERT_TRUE(LoadWeightsFile(Path("old.caffemodel"), net.get()).ok());
  for (size_t i = 0; i < shapes_.params.size(); ++i) {
    EXPECT_TRUE(BitEqual(Copy(net->param(static_cast<int>(i))), values.at(shapes_.params[i].name)));
  }
}

TEST_F(CaffeWeights, ShapeMismatchIsRefusedNamingLayerAndShapesAndWritesNothing) {
  const std::string w0 = SaveWeights(7, "w0.dpt");
  std::string out;
  ASSERT_EQ(RunTool({"export-weights", w0, "--model", model_, "-o", Path("a.caffemodel")}, &out), 0) << out;
  CaffeNet caffe;
  ASSERT_TRUE(ReadCaffemodel(Path("a.caffemodel"), &caffe).ok());
  for (CaffeLayer& l : caffe.layers) {
    if (l.name != "ip2") continue;
    l.blobs[0].shape = {10, 499};
    l.blobs[0].data.resize(4990);
  }
  ASSERT_TRUE(WriteCaffemodel(Path("bad.caffemodel"), caffe).ok());
  EXPECT_EQ(RunTool({"import-weights", Path("bad.caffemodel"), "--model", model_, "-o", Path("bad.dpt")}, &out), 2);
  EXPECT_TRUE(Contains(out, Path("bad.caffemodel") + ": layer 'ip2' blob 0 (weight) has shape (10,499) in the file "
                                                     "but model 'LeNet' needs (10,500) (ip2.weight)"))
      << out;
  EXPECT_FALSE(fs::exists(Path("bad.dpt")));
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(Contains(entry.path().filename().string(), "bad.dpt")) << entry.path();  // no temporary left
  }

  // A legacy 4-D blob must match on its trailing dims, not only on its element count.
  ::caffe::NetParameter proto;
  ::caffe::V1LayerParameter* l = proto.add_layers();
  l->set_name("ip1");
  l->set_type(::caffe::V1LayerParameter::INNER_PRODUCT);
  ::caffe::BlobProto* b = l->add_blobs();
  b->set_num(1);
  b->set_channels(1);
  b->set_height(800);
  b->set_width(500);
  for (int i = 0; i < 400000; ++i) b->add_data(0.0f);
  CaffeNet transposed;
  ASSERT_TRUE(ParseCaffemodel(proto.SerializeAsString(), "t.caffemodel", &transposed).ok());
  std::vector<NamedTensor> tensors;
  const Status s = CaffeToTensors(transposed, "t.caffemodel", spec_, shapes_, {true, true}, &tensors, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "layer 'ip1' has 1 blob(s) in the file but 2 tensor(s)")) << s.message();
  b = l->add_blobs();
  b->set_num(1);
  b->set_channels(1);
  b->set_height(1);
  b->set_width(500);
  for (int i = 0; i < 500; ++i) b->add_data(0.0f);
  ASSERT_TRUE(ParseCaffemodel(proto.SerializeAsString(), "t.caffemodel", &transposed).ok());
  const Status s2 = CaffeToTensors(transposed, "t.caffemodel", spec_, shapes_, {true, true}, &tensors, nullptr);
  ASSERT_FALSE(s2.ok());
  EXPECT_TRUE(Contains(s2.message(),
                       "layer 'ip1' blob 0 (weight) has shape (1,1,800,500) (legacy "
                       "num/channels/height/width) in the file but model 'LeNet' needs (500,800)"))
      << s2.message();
}

TEST_F(CaffeWeights, LoadWeightsFileIsAllOrNothing) {
  const std::string w2 = SaveWeights(2, "w2.dpt");
  std::string out;
  ASSERT_EQ(RunTool({"export-weights", w2, "--model", model_, "-o", Path("w2.caffemodel")}, &out), 0) << out;
  auto net = BuildNet(spec_, 1);
  const std::vector<float> before = Copy(net->params());

  // .caffemodel whose LAST layer is wrong: every earlier layer would fit.
  CaffeNet caffe;
  ASSERT_TRUE(ReadCaffemodel(Path("w2.caffemodel"), &caffe).ok());
  for (CaffeLayer& l : caffe.layers) {
    if (l.name == "ip2") l.blobs[1] = CaffeBlob{{11}, false, std::vector<float>(11, 1.0f)};
  }
  ASSERT_TRUE(WriteCaffemodel(Path("bad.caffemodel"), caffe).ok());
  Status s = LoadWeightsFile(Path("bad.caffemodel"), net.get());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), Path("bad.caffemodel") + ": layer 'ip2' blob 1 (bias) has shape (11)"))
      << s.message();
  EXPECT_TRUE(BitEqual(Copy(net->params()), before));

  // Tensor file whose last tensor has the wrong shape.
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(w2, &file).ok());
  file.tensors.back().shape = {2, 5};
  ASSERT_TRUE(WriteTensorFile(Path("bad.dpt"), file).ok());
  s = LoadWeightsFile(Path("bad.dpt"), net.get());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), Path("bad.dpt") + ": tensor 'ip2.bias' has shape (2,5) in the file but (10)"))
      << s.message();
  EXPECT_TRUE(BitEqual(Copy(net->params()), before));

  // A tensor file missing a tensor, and no file at all.
  file.tensors.pop_back();
  ASSERT_TRUE(WriteTensorFile(Path("short.dpt"), file).ok());
  s = LoadWeightsFile(Path("short.dpt"), net.get());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "tensors ip2.bias of model 'LeNet' are missing")) << s.message();
  s = LoadWeightsFile(Path("nope.caffemodel"), net.get());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), Path("nope.caffemodel"))) << s.message();
  // Not a weights file at all: tried as a .caffemodel, refused.
  test::WriteFile(Path("junk.caffemodel"), "this is not protobuf \xff\xff\xff");
  s = LoadWeightsFile(Path("junk.caffemodel"), net.get());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), Path("junk.caffemodel") + ": ")) << s.message();
  // An empty NetParameter parses, but holds no weights.
  test::WriteFile(Path("empty.caffemodel"), "");
  s = LoadWeightsFile(Path("empty.caffemodel"), net.get());
  EXPECT_TRUE(Contains(s.message(), "holds no layer with weights")) << s.message();
  EXPECT_TRUE(BitEqual(Copy(net->params()), before));

  // Both good files load every weight.
  ASSERT_TRUE(LoadWeightsFile(w2, net.get()).ok());
  const std::vector<float> from_dpt = Copy(net->params());
  EXPECT_FALSE(BitEqual(from_dpt, before));
  net->InitParams(1);
  ASSERT_TRUE(LoadWeightsFile(Path("w2.caffemodel"), net.get()).ok());
  EXPECT_TRUE(BitEqual(Copy(net->params()), from_dpt));
}

// Caffe's fine-tuning: fc8 renamed for a new class count starts at its fillers, the rest from
// the file — only when the policy asks for it, with what was skipped and kept reported.
TEST_F(CaffeWeights, FineTuningSkipsExtraLayersAndKeepsMissingOnesOnlyWhenAsked) {
  const std::string w2 = SaveWeights(2, "w2.dpt");
  std::string out;
  ASSERT_EQ(RunTool({"export-weights", w2, "--model", model_, "-o", Path("w2.caffemodel")}, &out), 0) << out;
  NetSpec tuned = spec_;
  for (auto& l : tuned.layers) {
    if (l.name == "ip2") {
      l.name = "ip2_flowers";
      l.num_output = 5;
    }
  }
  auto net = BuildNet(tuned, 1);
  const std::vector<float> before = Copy(net->params());

  Status s = LoadWeightsFile(Path("w2.caffemodel"), net.get());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "layers with weights that model 'LeNet' does not have: ip2 (2 blobs)"))
      << s.message();
  EXPECT_TRUE(BitEqual(Copy(net->params()), before));
  s = LoadWeightsFile(Path("w2.caffemodel"), net.get(), WeightsPolicy{true, false});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "tensors ip2_flowers.weight, ip2_flowers.bias have no weights in the file"))
      << s.message();
  EXPECT_TRUE(BitEqual(Copy(net->params()), before));

  WeightsReport report;
  s = LoadWeightsFile(Path("w2.caffemodel"), net.get(), WeightsPolicy{true, true}, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.skipped, std::vector<std::string>{"ip2"});
  EXPECT_EQ(report.kept, (std::vector<std::string>{"ip2_flowers.weight", "ip2_flowers.bias"}));
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(w2, &file).ok());
  const auto& specs = net->param_specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<float> now = Copy(net->param(static_cast<int>(i)));
    if (specs[i].name.rfind("ip2_flowers", 0) == 0) {
      const auto at = before.begin() + net->param_offset(static_cast<int>(i));
      EXPECT_TRUE(BitEqual(now, std::vector<float>(at, at + specs[i].numel()))) << specs[i].name << " kept";
    } else {
      EXPECT_TRUE(BitEqual(now, FindTensor(file, specs[i].name)->data)) << specs[i].name << " loaded";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// export-npy

TEST(CaffeNpy, HeaderIsNumpyFormat10PaddedTo64) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {5}, {3, 4}, {2, 1, 3, 3}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(static_cast<size_t>(n));
    for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i) - 1.0f;
    std::string bytes;
    ASSERT_TRUE(EncodeNpy(shape, data, &bytes).ok());
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const size_t header_len =
        static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    const std::string header = bytes.substr(10, header_len);
    EXPECT_EQ(header.back(), '\n');
    std::string tuple = shape.empty() ? "()" : shape.size() == 1 ? fmt::format("({},)", shape[0]) : "(";
    if (shape.size() > 1) tuple = fmt::format("({})", fmt::join(shape, ", "));
    EXPECT_EQ(header.substr(0, header.find('}') + 1),
              "{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }");
    EXPECT_EQ(bytes.size(), 10 + header_len + data.size() * 4);
    std::vector<int64_t> back_shape;
    std::vector<float> back;
    ASSERT_TRUE(DecodeNpy(bytes, "x.npy", &back_shape, &back).ok());
    EXPECT_EQ(back_shape, shape);
    EXPECT_TRUE(BitEqual(back, data));
  }
  std::string bytes;
  EXPECT_FALSE(EncodeNpy({2, 2}, {1.0f}, &bytes).ok());
  EXPECT_EQ(NpyFileName("inception_3a/1x1.weight"), "inception_3a%2F1x1.weight.npy");
  EXPECT_EQ(NpyFileName("a%b.bias"), "a%25b.bias.npy");
}

TEST_F(CaffeWeights, ExportNpyWritesOneFilePerTensorReadBackExactly) {
  const std::string w0 = SaveWeights(5, "w0.dpt");
  std::string out;
  ASSERT_EQ(RunTool({"export-npy", w0, "-o", Path("npy")}, &out), 0) << out;
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(w0, &file).ok());
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "npy")) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, file.tensors.size());
  for (const NamedTensor& t : file.tensors) {
    const std::string path = Path("npy/" + t.name + ".npy");
    std::vector<int64_t> shape;
    std::vector<float> data;
    const Status s = DecodeNpy(test::ReadFile(path), path, &shape, &data);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(shape, t.shape) << t.name;
    EXPECT_TRUE(BitEqual(data, t.data)) << t.name;
  }
}

// Python's standard library (no numpy) reads the header as a dict literal and the data as
// little-endian float32s: the format is what numpy.load expects.
TEST_F(CaffeWeights, ExportNpyIsReadByPythonsStandardLibrary) {
  std::string out;
  if (test::RunShell("command -v python3", &out) != 0) GTEST_SKIP() << "python3 is not installed";
  const std::string w0 = SaveWeights(5, "w0.dpt");
  ASSERT_EQ(RunTool({"export-npy", w0, "-o", Path("npy")}, &out), 0) << out;
  const std::string script =
      "import ast, struct, sys\n"
      "b = open(sys.argv[1], 'rb').read()\n"
      "assert b[:8] == b'\\x93NUMPY\\x01\\x00'\n"
      "n = struct.unpack('<H', b[8:10])[0]\n"
      "h = ast.literal_eval(b[10:10 + n].decode('latin1'))\n"
      "count = 1\n"
      "for d in h['shape']: count *= d\n"
      "v = struct.unpack('<%df' % count, b[10 + n:])\n"
      "print(h['descr'], h['fortran_order'], h['shape'], '%.9g %.9g' % (v[0], v[-1]))\n";
  test::WriteFile(dir_ / "read_npy.py", script);
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(w0, &file).ok());
  for (const NamedTensor& t : file.tensors) {
    ASSERT_EQ(test::RunShell("python3 " + Path("read_npy.py") + " " + Path("npy/" + t.name + ".npy"), &out), 0) << out;
    const std::string shape =
        t.shape.size() == 1 ? fmt::format("({},)", t.shape[0]) : fmt::format("({})", fmt::join(t.shape, ", "));
    EXPECT_EQ(out, fmt::format("<f4 False {} {:.9g} {:.9g}\n", shape, t.data.front(), t.data.back())) << t.name;
  }
}

// ---------------------------------------------------------------------------------------------
// The tool

TEST(CaffeTool, VersionHelpAndExitCodes) {
  const fs::path dir = test::ScratchDir("caffe_tool");
  std::string out;
  EXPECT_EQ(RunTool({"--version"}, &out), 0);
  EXPECT_TRUE(Contains(out, "downpour-caffe ")) << out;
  EXPECT_EQ(RunTool({"--help"}, &out), 0);
  EXPECT_TRUE(Contains(out, "import-prototxt")) << out;
  // Usage errors: 2.
  EXPECT_EQ(RunTool({}, &out), 2) << out;
  EXPECT_EQ(RunTool({"--bogus"}, &out), 2) << out;
  EXPECT_EQ(RunTool({"import-prototxt", Data("lenet_train_test.prototxt")}, &out), 2) << out;  // no -o
  EXPECT_EQ(
      RunTool({"import-prototxt", Data("lenet_train_test.prototxt"), "-o", (dir / "x.toml").string(), "--phase", "val"},
              &out),
      2)
      << out;
  EXPECT_EQ(RunTool({"import-prototxt", Data("lenet_train_test.prototxt"), "-o", (dir / "x.toml").string(), "--input",
                     "1x0x28"},
                    &out),
            2)
      << out;
  EXPECT_TRUE(Contains(out, "--input '1x0x28'")) << out;
  // A missing input file: 2, naming it.
  const std::string missing = (dir / "missing.prototxt").string();
  EXPECT_EQ(RunTool({"import-prototxt", missing, "-o", (dir / "x.toml").string()}, &out), 2);
  EXPECT_TRUE(Contains(out, missing + ": no such prototxt file")) << out;
  EXPECT_EQ(RunTool({"import-weights", (dir / "missing.caffemodel").string(), "--model",
                     test::SourcePath("configs/models/alexnet.toml"), "-o", (dir / "w.dpt").string()},
                    &out),
            2);
  EXPECT_TRUE(Contains(out, "missing.caffemodel")) << out;
  EXPECT_EQ(RunTool({"export-npy", (dir / "missing.dpt").string(), "-o", (dir / "npy").string()}, &out), 2);
  EXPECT_TRUE(Contains(out, "missing.dpt")) << out;
  // A prototxt the engine cannot take: 2, no output file.
  test::WriteFile(
      dir / "bn.prototxt",
      "layer { name: \"data\" type: \"Input\" top: \"data\" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 "
      "} } }\nlayer { name: \"bn1\" type: \"BatchNorm\" bottom: \"data\" top: \"bn1\" }\n");
  EXPECT_EQ(RunTool({"import-prototxt", (dir / "bn.prototxt").string(), "-o", (dir / "bn.toml").string()}, &out), 2);
  EXPECT_TRUE(Contains(out, (dir / "bn.prototxt").string() + ":2: layer 'bn1' (#1, BatchNorm)")) << out;
  EXPECT_FALSE(fs::exists(dir / "bn.toml"));
  // A runtime failure (the output folder does not exist): 1.
  EXPECT_EQ(RunTool({"import-prototxt", Data("bvlc_alexnet_train_val.prototxt"), "-o",
                     (dir / "no_such_dir" / "a.toml").string()},
                    &out),
            1)
      << out;
  // Success writes a model the engine's parser takes.
  EXPECT_EQ(
      RunTool({"import-prototxt", Data("bvlc_alexnet_train_val.prototxt"), "-o", (dir / "a.toml").string()}, &out), 0)
      << out;
  EXPECT_TRUE(Contains(out, "60965224 learnable parameters in 16 tensors")) << out;
  NetSpec spec;
  EXPECT_TRUE(engine::ParseNetSpecFile((dir / "a.toml").string(), &spec).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour::caffe_io
