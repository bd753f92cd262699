// net_spec.h — the backend-independent description of a network: a parsed TOML layer list
// (Caffe-prototxt style: each layer names its bottoms and tops) and shape inference over it.
//
// Every backend (reference, oneDNN, CUDA) builds its layers from the same NetSpec and the
// same inferred shapes, so parameter lists (names, canonical shapes, lr/decay multipliers)
// are identical across backends and checkpoints are portable.
//
// Config format (configs/models/*.toml):
//   name = "alexnet"
//   [input]            channels = 3, height = 227, width = 227   (the blob "data" + "label")
//   [[layer]]          name, type, bottom = [...], top = [...], plus per-type fields below.
//
// Every layer type is one row of kLayerTypes below (the elementwise activations are rows of
// activations.h): its name, bottoms, keys (TOML key, member, rule and where a Caffe prototxt
// keeps it), its own defaults and its shape rule. The TOML reader, shape inference, the net's
// gradient routing and the prototxt importer read the rows. A new layer type is its LayerType,
// its LayerSpec members and its row here; its layer in each backend (reference_backend.cc,
// onednn_backend.cc, gpu/cuda_layers.cc); one gradient case (gradient_cases.cc); and, when Caffe
// keeps its parameters in a message the bundled caffe.proto lacks, that message.
//
// Thread-safety: plain values; parsing and inference are pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "client/engine/activations.h"
#include "common/status.h"
#include "common/tensor_spec.h"

namespace downpour::engine {

enum class LayerType {
  kConvolution,      // bottom: 1 (N,C,H,W) → top: 1 (N,O,Ho,Wo); params weight (O,C/g,kh,kw), bias (O)
  kActivation,       // elementwise y = f(x), one of the rows of activations.h (ReLU, ELU): LayerSpec::activation
  kLRN,              // across channels, Caffe definition (see LayerSpec::lrn_*)
  kPooling,          // max or average pooling (LayerSpec::pool), Caffe's ceil rounding of the output size
  kInnerProduct,     // bottom (N, ...) flattened to (N,K) → (N,O); params weight (O,K), bias (O)
  kDropout,          // inverted dropout, train phase only, seeded mask
  kSoftmaxWithLoss,  // bottoms (scores (N,K), label (N)) → top loss (1); mean cross-entropy
  kAccuracy,         // bottoms (scores (N,K), label (N)) → top accuracy (1); top_k
  kPReLU,            // y = max(0, x) + a_c min(0, x), a learnable slope per channel (He et al. 2015)
};

// Name as written in the config ("Convolution", "Pooling", ...; "activation" for the family).
const char* LayerTypeName(LayerType type);

enum class FillerType {
  kConstant,  // value
  kGaussian,  // mean 0, std
  kUniform,   // [-scale, scale]
  kXavier,    // uniform, scale = sqrt(3 / fan_in)            (Caffe's default variance_norm)
  kMsra,      // gaussian, std = sqrt(2 / fan_in)
};

// Pooling method (TOML `pool = "max" | "ave"`, Caffe's MAX / AVE). AVE divides each window's
// sum by its size counted over the padded input (the zero padding counts, the ceil-rounding
// overhang beyond it does not) — Caffe's pooling_layer.cpp exactly.
enum class PoolMethod { kMax, kAve };

// Name as written in the config ("max", "ave").
const char* PoolMethodName(PoolMethod method);

struct FillerSpec {
  FillerType type = FillerType::kConstant;
  float value = 0.0f;  // constant
  float std = 0.01f;   // gaussian; default as in Caffe's bvlc_alexnet
  float scale = 0.05f; // uniform
};

struct LayerSpec {
  std::string name;
  LayerType type = LayerType::kActivation;
  std::vector<std::string> bottoms;
  std::vector<std::string> tops;

  // Convolution / InnerProduct.
  int num_output = 0;
  bool bias_term = true;                 // default true (Caffe)
  FillerSpec weight_filler{FillerType::kGaussian};
  FillerSpec bias_filler{FillerType::kConstant};
  float weight_lr_mult = 1.0f, weight_decay_mult = 1.0f;  // Caffe defaults
  float bias_lr_mult = 2.0f, bias_decay_mult = 0.0f;      // Caffe's usual bias multipliers

  // Convolution / Pooling geometry (kernel_size / stride / pad set both h and w).
  int kernel_h = 0, kernel_w = 0;
  int stride_h = 1, stride_w = 1;  // default 1
  int pad_h = 0, pad_w = 0;        // default 0
  int group = 1;                   // default 1; conv only
  PoolMethod pool = PoolMethod::kMax;  // default max; pooling only

  // LRN (across channels): y = x * (k + alpha/local_size * sum_{window} x^2)^-beta,
  // window of local_size channels centred on the channel, zero padded.
  int local_size = 5;      // odd; default 5
  float alpha = 1e-4f;     // default 1e-4
  float beta = 0.75f;      // default 0.75
  float k = 1.0f;          // default 1

  // Activation: which row of activations.h, and its parameter (ELU's alpha; the row's default).
  ActivationKind activation = ActivationKind::kReLU;
  float activation_alpha = 0.0f;

  float dropout_ratio = 0.5f;  // probability of dropping; default 0.5
  int top_k = 1;               // accuracy; default 1

  // PReLU: one slope for all channels (params "<layer>.weight" of shape (1)) instead of one per
  // channel ((C)); the slopes' filler is weight_filler (its row's default: constant 0.25).
  bool channel_shared = false;
};

// The layer's type as written in the config: its activation's name ("ReLU", "ELU") for an
// activation, else LayerTypeName.
const char* TypeNameOf(const LayerSpec& layer);

// Caffe's output size rules.
int ConvOutputSize(int in, int kernel, int stride, int pad);  // floor
int PoolOutputSize(int in, int kernel, int stride, int pad);  // ceil, clipped to the input

// One key a layer type reads by itself: the TOML key, the LayerSpec member it sets, what the
// value must be, and its field in the type's Caffe message (LayerTypeRow::caffe_message).
struct LayerKey {
  const char* name;
  std::variant<int LayerSpec::*, float LayerSpec::*, bool LayerSpec::*> member;
  bool (*ok)(double value);  // null = any value of the type
  const char* rule;          // completes "<key> must be ...", e.g. "odd and positive"
  const char* caffe_field;   // "" = not imported from a prototxt by the table
};

// Keys several types share, read by net_spec.cc (bits of LayerTypeRow::groups).
enum LayerKeyGroup : unsigned {
  kLearnableKeys = 1,  // num_output (> 0), bias_term, weight_filler, bias_filler, param (two tables)
  kGeometryKeys = 2,   // kernel_size | kernel_h, kernel_w; stride | stride_h, stride_w; pad | ...
  kGroupKey = 4,       // group (divides num_output)
  kPoolKey = 8,        // pool = "max" | "ave"
  kSlopeKeys = 16,     // weight_filler and param (one table): a layer with one learnable tensor
};

// What a shape rule is given: the layer, its bottoms' shapes and "file: layer 'x' (#i, Type)".
struct ShapeIn {
  const LayerSpec& layer;
  const std::vector<std::vector<int>>& bottoms;
  const std::string& where;
};
// What it gives: the top's shape and the layer's learnable tensors (net order: weight, bias).
struct ShapeOut {
  struct Param {
    std::string suffix;  // ".weight", ".bias"
    std::vector<int64_t> shape;
    float lr_mult = 1.0f, decay_mult = 1.0f;
  };
  std::vector<int> top;
  std::vector<Param> params;
};

struct LayerTypeRow {
  LayerType type;
  const char* name;     // the TOML `type` and the Caffe layer type
  int bottoms;          // 1; or 2: scores (N,K), then labels (N)
  bool sends_gradient;  // bottom 0 receives a gradient (every type but Accuracy)
  unsigned groups;      // LayerKeyGroup bits
  std::span<const LayerKey> keys;
  void (*defaults)(LayerSpec* layer);  // the type's own defaults before its keys are read; null = none
  Status (*shape)(const ShapeIn& in, ShapeOut* out);
  // LayerParameter field of its Caffe parameters: the prototxt importer converts the layer from
  // its keys' caffe_field (a filler from caffe_filler) and its param { } entries. "" = none
  // (a type without parameters, or one converted by hand in client/caffe/prototxt_import.cc).
  const char* caffe_message;
  const char* caffe_filler;  // the FillerParameter field of caffe_message for weight_filler; ""
};

// Shape rules of the types whose rules live in net_spec.cc.
namespace shape_rules {
Status Convolution(const ShapeIn& in, ShapeOut* out);
Status Pooling(const ShapeIn& in, ShapeOut* out);
Status InnerProduct(const ShapeIn& in, ShapeOut* out);
Status Scores(const ShapeIn& in, ShapeOut* out);  // SoftmaxWithLoss, Accuracy
Status Same(const ShapeIn& in, ShapeOut* out);    // the top is the bottom's shape
Status Same4d(const ShapeIn& in, ShapeOut* out);  // the same, for a 4-D (N,C,H,W) bottom
}  // namespace shape_rules

inline constexpr LayerKey kLrnKeys[] = {
    {"local_size", &LayerSpec::local_size, [](double v) { return v > 0 && static_cast<int64_t>(v) % 2 == 1; },
     "odd and positive", "local_size"},
    {"alpha", &LayerSpec::alpha, nullptr, "", "alpha"},
    {"beta", &LayerSpec::beta, nullptr, "", "beta"},
    {"k", &LayerSpec::k, nullptr, "", "k"},
};
inline constexpr LayerKey kDropoutKeys[] = {
    {"dropout_ratio", &LayerSpec::dropout_ratio, [](double v) { return v >= 0.0 && v < 1.0; }, "in [0, 1)",
     "dropout_ratio"},
};
inline constexpr LayerKey kAccuracyKeys[] = {
    {"top_k", &LayerSpec::top_k, [](double v) { return v > 0; }, "positive", "top_k"},
};

inline constexpr LayerKey kPReLUKeys[] = {
    {"channel_shared", &LayerSpec::channel_shared, nullptr, "", "channel_shared"},
};

inline constexpr LayerTypeRow kLayerTypes[] = {
    {LayerType::kConvolution,
     "Convolution",
     1,
     true,
     kLearnableKeys | kGeometryKeys | kGroupKey,
     {},
     nullptr,
     shape_rules::Convolution,
     "",
     ""},
    {LayerType::kActivation, "activation", 1, true, 0, {}, nullptr, shape_rules::Same, "", ""},
    {LayerType::kLRN, "LRN", 1, true, 0, kLrnKeys, nullptr, shape_rules::Same4d, "", ""},
    {LayerType::kPooling, "Pooling", 1, true, kPoolKey | kGeometryKeys, {}, nullptr, shape_rules::Pooling, "", ""},
    {LayerType::kInnerProduct, "InnerProduct", 1, true, kLearnableKeys, {}, nullptr, shape_rules::InnerProduct, "", ""},
    {LayerType::kDropout, "Dropout", 1, true, 0, kDropoutKeys, nullptr, shape_rules::Same, "dropout_param", ""},
    {LayerType::kSoftmaxWithLoss, "SoftmaxWithLoss", 2, true, 0, {}, nullptr, shape_rules::Scores, "", ""},
    {LayerType::kAccuracy, "Accuracy", 2, false, 0, kAccuracyKeys, nullptr, shape_rules::Scores, "", ""},
    // PReLU (He et al., Delving Deep into Rectifiers, 2015; Caffe's PReLU and its prelu_param).
    {LayerType::kPReLU, "PReLU", 1, true, kSlopeKeys, kPReLUKeys,
     [](LayerSpec* l) {
       l->weight_filler = FillerSpec{FillerType::kConstant, 0.25f};  // Caffe's PReLU default
     },
     [](const ShapeIn& in, ShapeOut* out) -> Status {
       DP_RETURN_IF_ERROR(shape_rules::Same4d(in, out));
       const LayerSpec& l = in.layer;
       out->params.push_back(
           {".weight", {l.channel_shared ? 1 : in.bottoms[0][1]}, l.weight_lr_mult, l.weight_decay_mult});
       return Status::Ok();
     },
     "prelu_param", "filler"},
};

// The row of `type` (every LayerType has one).
const LayerTypeRow& LayerTypeOf(LayerType type);
// The row named `name` (not an activation's; activations.h FindActivation), or null.
const LayerTypeRow* FindLayerType(std::string_view name);

struct NetSpec {
  std::string name;
  std::string source;  // file it came from (for error messages), "" when parsed from a string
  int input_channels = 0, input_height = 0, input_width = 0;
  std::vector<LayerSpec> layers;
};

// Parses a model config. Errors name the file, the layer and the field, e.g.
//   "configs/models/x.toml: layer 'conv1' (#0): unknown type 'Conv'".
Status ParseNetSpecFile(const std::string& path, NetSpec* spec);
Status ParseNetSpecString(const std::string& toml_text, const std::string& source_name,
                          NetSpec* spec);

// The result of shape inference for one batch size.
struct NetShapes {
  // Every blob by name → logical shape: (N,C,H,W) for images, (N,K) for vectors, (N) for
  // labels, (1) for loss / accuracy. "data" and "label" are the net's inputs.
  std::map<std::string, std::vector<int>> blobs;
  // All learnable tensors in net order: per layer, weight then bias. Names "<layer>.weight"
  // and "<layer>.bias"; canonical layouts (conv OIHW with I = C/group, inner product O×I).
  std::vector<TensorSpec> params;
  // For each layer (same index as NetSpec::layers), indices into `params` (0, 1 or 2).
  std::vector<std::vector<int>> layer_params;
  // The layer whose bottom[0] are the class scores (the SoftmaxWithLoss layer) and the
  // number of classes; every trainable net has exactly one loss layer.
  int loss_layer = -1;
  int num_classes = 0;
};

// Checks the graph (unknown bottoms, duplicate tops, a blob used by two layers that would
// both send a gradient back) and infers every shape. Errors name the layer.
Status InferShapes(const NetSpec& spec, int batch, NetShapes* shapes);

// Product of the dims.
int64_t ShapeCount(const std::vector<int>& shape);
std::string ShapeString(const std::vector<int>& shape);

}  // namespace downpour::engine
