// net_spec.cc — TOML → NetSpec, and shape inference. See net_spec.h.
#include "client/engine/net_spec.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <iterator>
#include <set>
#include <sstream>

namespace downpour::engine {
namespace {

// Keys every layer has, and those the key groups read (LayerKeyGroup).
constexpr const char* kCommonKeys[] = {"name", "type", "bottom", "top"};
constexpr const char* kGroupKeys[] = {
    "num_output", "bias_term", "weight_filler", "bias_filler", "param", "kernel_size", "kernel_h", "kernel_w",
    "stride",     "stride_h",  "stride_w",      "pad",         "pad_h", "pad_w",       "group",    "pool"};

// Every key some layer type reads: any other is an error (a key the layer's type does not read
// is ignored, as documented in docs/config.md).
const std::set<std::string>& KnownLayerKeys() {
  static const std::set<std::string> keys = [] {
    std::set<std::string> k(std::begin(kCommonKeys), std::end(kCommonKeys));
    k.insert(std::begin(kGroupKeys), std::end(kGroupKeys));
    for (const LayerTypeRow& row : kLayerTypes) {
      for (const LayerKey& key : row.keys) k.insert(key.name);
    }
    for (const ActivationRow& row : kActivations) {
      if (*row.alpha_key != '\0') k.insert(row.alpha_key);
    }
    return k;
  }();
  return keys;
}

// Context for error messages: "file: layer 'conv1' (#0)".
struct Where {
  const std::string& source;
  std::string layer;
  std::string str() const {
    return layer.empty() ? source : fmt::format("{}: {}", source, layer);
  }
};

template <typename T>
Status ReadNumber(const toml::table& t, const char* key, const Where& where, T* out) {
  const toml::node* node = t.get(key);
  if (node == nullptr) return Status::Ok();
  if constexpr (std::is_same_v<T, bool>) {
    auto v = node->value<bool>();
    if (!v || !node->is_boolean()) return InvalidArgument("{}: field '{}' must be a boolean", where.str(), key);
    *out = *v;
  } else if constexpr (std::is_integral_v<T>) {
    auto v = node->value<int64_t>();
    if (!v || !node->is_integer())
      return InvalidArgument("{}: field '{}' must be an integer", where.str(), key);
    *out = static_cast<T>(*v);
  } else {
    auto v = node->value<double>();
    if (!v) return InvalidArgument("{}: field '{}' must be a number", where.str(), key);
    *out = static_cast<T>(*v);
  }
  return Status::Ok();
}

Status ReadStringList(const toml::table& t, const char* key, const Where& where,
                      std::vector<std::string>* out) {
  const toml::node* node = t.get(key);
  if (node == nullptr) return Status::Ok();
  if (auto s = node->value<std::string>()) {
    out->push_back(*s);
    return Status::Ok();
  }
  const toml::array* arr = node->as_array();
  if (arr == nullptr)
    return InvalidArgument("{}: field '{}' must be a string or a list of strings", where.str(), key);
  for (const auto& e : *arr) {
    auto s = e.value<std::string>();
    if (!s) return InvalidArgument("{}: field '{}' must hold strings", where.str(), key);
    out->push_back(*s);
  }
  return Status::Ok();
}

Status ParseFiller(const toml::table& t, const char* key, const Where& where, FillerSpec* f) {
  const toml::node* node = t.get(key);
  if (node == nullptr) return Status::Ok();
  const toml::table* ft = node->as_table();
  if (ft == nullptr) return InvalidArgument("{}: field '{}' must be a table", where.str(), key);
  std::string type = ft->get("type") ? ft->get("type")->value_or(std::string()) : "";
  if (type == "constant") f->type = FillerType::kConstant;
  else if (type == "gaussian") f->type = FillerType::kGaussian;
  else if (type == "uniform") f->type = FillerType::kUniform;
  else if (type == "xavier") f->type = FillerType::kXavier;
  else if (type == "msra") f->type = FillerType::kMsra;
  else
    return InvalidArgument(
        "{}: {}.type '{}' is not one of constant, gaussian, uniform, xavier, msra",
        where.str(), key, type);
  DP_RETURN_IF_ERROR(ReadNumber(*ft, "value", where, &f->value));
  DP_RETURN_IF_ERROR(ReadNumber(*ft, "std", where, &f->std));
  DP_RETURN_IF_ERROR(ReadNumber(*ft, "scale", where, &f->scale));
  return Status::Ok();
}

Status ParseGeometry(const toml::table& t, const Where& where, LayerSpec* l) {
  int v = -1;
  DP_RETURN_IF_ERROR(ReadNumber(t, "kernel_size", where, &v));
  if (v >= 0) l->kernel_h = l->kernel_w = v;
  DP_RETURN_IF_ERROR(ReadNumber(t, "kernel_h", where, &l->kernel_h));
  DP_RETURN_IF_ERROR(ReadNumber(t, "kernel_w", where, &l->kernel_w));
  v = -1;
  DP_RETURN_IF_ERROR(ReadNumber(t, "stride", where, &v));
  if (v >= 0) l->stride_h = l->stride_w = v;
  DP_RETURN_IF_ERROR(ReadNumber(t, "stride_h", where, &l->stride_h));
  DP_RETURN_IF_ERROR(ReadNumber(t, "stride_w", where, &l->stride_w));
  v = -1;
  DP_RETURN_IF_ERROR(ReadNumber(t, "pad", where, &v));
  if (v >= 0) l->pad_h = l->pad_w = v;
  DP_RETURN_IF_ERROR(ReadNumber(t, "pad_h", where, &l->pad_h));
  DP_RETURN_IF_ERROR(ReadNumber(t, "pad_w", where, &l->pad_w));
  if (l->kernel_h <= 0 || l->kernel_w <= 0)
    return InvalidArgument("{}: kernel size must be positive (kernel_h={}, kernel_w={})",
                           where.str(), l->kernel_h, l->kernel_w);
  if (l->stride_h <= 0 || l->stride_w <= 0 || l->pad_h < 0 || l->pad_w < 0)
    return InvalidArgument("{}: stride must be positive and pad non-negative (stride {}x{}, pad {}x{})",
                           where.str(), l->stride_h, l->stride_w, l->pad_h, l->pad_w);
  return Status::Ok();
}

constexpr struct {
  PoolMethod method;
  const char* name;
} kPoolMethodNames[] = {{PoolMethod::kMax, "max"}, {PoolMethod::kAve, "ave"}};

// `pool = "max" | "ave"`; absent → max (Caffe's default).
Status ParsePoolMethod(const toml::table& t, const Where& where, PoolMethod* method) {
  const toml::node* node = t.get("pool");
  if (node == nullptr) return Status::Ok();
  const std::optional<std::string> text = node->value<std::string>();
  if (!text) return InvalidArgument("{}: field 'pool' must be a string (\"max\" or \"ave\")", where.str());
  for (const auto& e : kPoolMethodNames) {
    if (*text == e.name) {
      *method = e.method;
      return Status::Ok();
    }
  }
  return InvalidArgument("{}: pool '{}' is not one of max, ave", where.str(), *text);
}

// `param` = at most `tensors` tables (weight, then bias) with lr_mult / decay_mult.
Status ParseParamMults(const toml::table& t, const Where& where, size_t tensors, LayerSpec* l) {
  const toml::node* p = t.get("param");
  if (p == nullptr) return Status::Ok();
  const toml::array* arr = p->as_array();
  if (arr == nullptr || arr->size() > tensors) {
    return InvalidArgument("{}: 'param' must be a list of at most {} with lr_mult / decay_mult", where.str(),
                           tensors == 2 ? "2 tables (weight, bias)" : "1 table (weight)");
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* pt = (*arr)[i].as_table();
    if (pt == nullptr) return InvalidArgument("{}: param[{}] must be a table", where.str(), i);
    float* lr = i == 0 ? &l->weight_lr_mult : &l->bias_lr_mult;
    float* decay = i == 0 ? &l->weight_decay_mult : &l->bias_decay_mult;
    DP_RETURN_IF_ERROR(ReadNumber(*pt, "lr_mult", where, lr));
    DP_RETURN_IF_ERROR(ReadNumber(*pt, "decay_mult", where, decay));
  }
  return Status::Ok();
}

// The keys of `row.groups` (LayerKeyGroup), in a fixed order.
Status ParseKeyGroups(const toml::table& t, const Where& where, const LayerTypeRow& row, LayerSpec* l) {
  if (row.groups & kLearnableKeys) {
    DP_RETURN_IF_ERROR(ReadNumber(t, "num_output", where, &l->num_output));
    if (l->num_output <= 0)
      return InvalidArgument("{}: num_output must be positive, got {}", where.str(), l->num_output);
    DP_RETURN_IF_ERROR(ReadNumber(t, "bias_term", where, &l->bias_term));
    DP_RETURN_IF_ERROR(ParseFiller(t, "weight_filler", where, &l->weight_filler));
    DP_RETURN_IF_ERROR(ParseFiller(t, "bias_filler", where, &l->bias_filler));
    DP_RETURN_IF_ERROR(ParseParamMults(t, where, 2, l));
  }
  if (row.groups & kSlopeKeys) {
    DP_RETURN_IF_ERROR(ParseFiller(t, "weight_filler", where, &l->weight_filler));
    DP_RETURN_IF_ERROR(ParseParamMults(t, where, 1, l));
  }
  if (row.groups & kPoolKey) DP_RETURN_IF_ERROR(ParsePoolMethod(t, where, &l->pool));
  if (row.groups & kGeometryKeys) DP_RETURN_IF_ERROR(ParseGeometry(t, where, l));
  if (row.groups & kGroupKey) {
    DP_RETURN_IF_ERROR(ReadNumber(t, "group", where, &l->group));
    if (l->group <= 0 || l->num_output % l->group != 0)
      return InvalidArgument("{}: group {} must be positive and divide num_output {}", where.str(), l->group,
                             l->num_output);
  }
  return Status::Ok();
}

// The row's own keys: each read as its member's type and checked by its rule.
Status ParseRowKeys(const toml::table& t, const Where& where, const LayerTypeRow& row, LayerSpec* l) {
  for (const LayerKey& key : row.keys) {
    Status s = std::visit(
        [&](auto member) -> Status {
          auto& value = l->*member;
          DP_RETURN_IF_ERROR(ReadNumber(t, key.name, where, &value));
          if (key.ok != nullptr && !key.ok(static_cast<double>(value)))
            return InvalidArgument("{}: {} must be {}, got {}", where.str(), key.name, key.rule, value);
          return Status::Ok();
        },
        key.member);
    DP_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

Status ParseLayer(const toml::table& t, int index, const std::string& source, LayerSpec* l) {
  Where where{source, fmt::format("layer #{}", index)};
  auto name = t.get("name") ? t.get("name")->value<std::string>() : std::nullopt;
  if (!name || name->empty()) return InvalidArgument("{}: missing field 'name'", where.str());
  l->name = *name;
  where.layer = fmt::format("layer '{}' (#{})", l->name, index);
  for (const auto& [key, node] : t) {
    if (!KnownLayerKeys().count(std::string(key.str())))
      return InvalidArgument("{}: unknown field '{}'", where.str(), key.str());
  }
  auto type = t.get("type") ? t.get("type")->value<std::string>() : std::nullopt;
  if (!type) return InvalidArgument("{}: missing field 'type'", where.str());
  const ActivationRow* activation = FindActivation(*type);
  const LayerTypeRow* row = activation != nullptr ? &LayerTypeOf(LayerType::kActivation) : FindLayerType(*type);
  if (row == nullptr) {
    std::vector<std::string> names;
    for (const LayerTypeRow& r : kLayerTypes) {
      if (r.type != LayerType::kActivation) names.push_back(r.name);
    }
    for (const ActivationRow& r : kActivations) names.push_back(r.name);
    return InvalidArgument("{}: unknown type '{}' (known: {})", where.str(), *type, fmt::join(names, ", "));
  }
  l->type = row->type;
  if (row->defaults != nullptr) row->defaults(l);
  DP_RETURN_IF_ERROR(ReadStringList(t, "bottom", where, &l->bottoms));
  DP_RETURN_IF_ERROR(ReadStringList(t, "top", where, &l->tops));
  DP_RETURN_IF_ERROR(ParseKeyGroups(t, where, *row, l));
  DP_RETURN_IF_ERROR(ParseRowKeys(t, where, *row, l));
  if (activation != nullptr) {
    l->activation = activation->kind;
    l->activation_alpha = activation->alpha_default;
    if (*activation->alpha_key != '\0') {
      DP_RETURN_IF_ERROR(ReadNumber(t, activation->alpha_key, where, &l->activation_alpha));
      if (!activation->alpha_ok(l->activation_alpha)) {
        return InvalidArgument("{}: {} must be {}, got {}", where.str(), activation->alpha_key, activation->alpha_rule,
                               l->activation_alpha);
      }
    }
  }
  return Status::Ok();
}

Status ParseTable(const toml::table& root, const std::string& source, NetSpec* spec) {
  *spec = NetSpec();
  spec->source = source;
  spec->name = root["name"].value_or(std::string("net"));
  const toml::table* input = root["input"].as_table();
  if (input == nullptr) return InvalidArgument("{}: missing table [input]", source);
  Where where{source, "[input]"};
  DP_RETURN_IF_ERROR(ReadNumber(*input, "channels", where, &spec->input_channels));
  DP_RETURN_IF_ERROR(ReadNumber(*input, "height", where, &spec->input_height));
  DP_RETURN_IF_ERROR(ReadNumber(*input, "width", where, &spec->input_width));
  if (spec->input_channels <= 0 || spec->input_height <= 0 || spec->input_width <= 0)
    return InvalidArgument("{}: [input] channels/height/width must be positive, got {}x{}x{}",
                           source, spec->input_channels, spec->input_height, spec->input_width);
  const toml::array* layers = root["layer"].as_array();
  if (layers == nullptr || layers->empty())
    return InvalidArgument("{}: no [[layer]] entries", source);
  for (size_t i = 0; i < layers->size(); ++i) {
    const toml::table* lt = (*layers)[i].as_table();
    if (lt == nullptr) return InvalidArgument("{}: layer #{} is not a table", source, i);
    LayerSpec l;
    DP_RETURN_IF_ERROR(ParseLayer(*lt, static_cast<int>(i), source, &l));
    spec->layers.push_back(std::move(l));
  }
  return Status::Ok();
}

}  // namespace

const LayerTypeRow& LayerTypeOf(LayerType type) {
  for (const LayerTypeRow& row : kLayerTypes) {
    if (row.type == type) return row;
  }
  DP_CHECK(false && "a LayerType without a row in kLayerTypes");
  return kLayerTypes[0];
}

const LayerTypeRow* FindLayerType(std::string_view name) {
  for (const LayerTypeRow& row : kLayerTypes) {
    if (row.type != LayerType::kActivation && name == row.name) return &row;
  }
  return nullptr;
}

const char* LayerTypeName(LayerType type) { return LayerTypeOf(type).name; }

const char* TypeNameOf(const LayerSpec& layer) {
  return layer.type == LayerType::kActivation ? ActivationOf(layer.activation).name : LayerTypeName(layer.type);
}

const char* PoolMethodName(PoolMethod method) {
  for (const auto& e : kPoolMethodNames)
    if (e.method == method) return e.name;
  return "?";
}

Status ParseNetSpecString(const std::string& text, const std::string& source_name, NetSpec* spec) {
  try {
    toml::table root = toml::parse(text, source_name);
    return ParseTable(root, source_name, spec);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e.description() << " at " << e.source().begin;
    return InvalidArgument("{}: TOML parse error: {}", source_name, os.str());
  }
}

Status ParseNetSpecFile(const std::string& path, NetSpec* spec) {
  try {
    toml::table root = toml::parse_file(path);
    return ParseTable(root, path, spec);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e.description() << " at " << e.source().begin;
    return InvalidArgument("{}: cannot parse model config: {}", path, os.str());
  }
}

int64_t ShapeCount(const std::vector<int>& shape) {
  int64_t n = 1;
  for (int d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int>& shape) { return fmt::format("({})", fmt::join(shape, ",")); }

int ConvOutputSize(int in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

int PoolOutputSize(int in, int kernel, int stride, int pad) {
  // Caffe: ceil, then make sure the last window starts inside the (left-padded) input.
  int out = static_cast<int>((in + 2 * pad - kernel + stride - 1) / stride) + 1;
  if (pad > 0 && (out - 1) * stride >= in + pad) --out;
  return out;
}

namespace shape_rules {
namespace {

Status Need4d(const ShapeIn& in) {
  const std::vector<int>& x = in.bottoms[0];
  if (x.size() != 4)
    return InvalidArgument("{}: bottom '{}' must be 4-D (N,C,H,W), has shape {}", in.where, in.layer.bottoms[0],
                           ShapeString(x));
  return Status::Ok();
}

// Weight (and bias when bias_term) of a layer with num_output outputs.
void AddLearnable(const LayerSpec& l, std::vector<int64_t> weight, ShapeOut* out) {
  out->params.push_back({".weight", std::move(weight), l.weight_lr_mult, l.weight_decay_mult});
  if (l.bias_term) out->params.push_back({".bias", {l.num_output}, l.bias_lr_mult, l.bias_decay_mult});
}

}  // namespace

Status Convolution(const ShapeIn& in, ShapeOut* out) {
  DP_RETURN_IF_ERROR(Need4d(in));
  const LayerSpec& l = in.layer;
  const std::vector<int>& x = in.bottoms[0];
  if (x[1] % l.group != 0)
    return InvalidArgument("{}: group {} does not divide input channels {}", in.where, l.group, x[1]);
  const int ho = ConvOutputSize(x[2], l.kernel_h, l.stride_h, l.pad_h);
  const int wo = ConvOutputSize(x[3], l.kernel_w, l.stride_w, l.pad_w);
  if (ho <= 0 || wo <= 0)
    return InvalidArgument("{}: kernel {}x{} (pad {}) is larger than the input {}", in.where, l.kernel_h, l.kernel_w,
                           l.pad_h, ShapeString(x));
  out->top = {x[0], l.num_output, ho, wo};
  AddLearnable(l, {l.num_output, x[1] / l.group, l.kernel_h, l.kernel_w}, out);
  return Status::Ok();
}

Status Pooling(const ShapeIn& in, ShapeOut* out) {
  DP_RETURN_IF_ERROR(Need4d(in));
  const LayerSpec& l = in.layer;
  const std::vector<int>& x = in.bottoms[0];
  if (l.pad_h >= l.kernel_h || l.pad_w >= l.kernel_w)
    return InvalidArgument("{}: pad {}x{} must be smaller than the kernel {}x{}", in.where, l.pad_h, l.pad_w,
                           l.kernel_h, l.kernel_w);
  const int ho = PoolOutputSize(x[2], l.kernel_h, l.stride_h, l.pad_h);
  const int wo = PoolOutputSize(x[3], l.kernel_w, l.stride_w, l.pad_w);
  if (ho <= 0 || wo <= 0 || x[2] + 2 * l.pad_h < l.kernel_h || x[3] + 2 * l.pad_w < l.kernel_w)
    return InvalidArgument("{}: kernel {}x{} is larger than the input {}", in.where, l.kernel_h, l.kernel_w,
                           ShapeString(x));
  // Caffe drops a last window that would start past the input only when there is padding;
  // without, a stride larger than the kernel can leave it empty (Caffe: MAX -FLT_MAX, AVE 0/0).
  if ((ho - 1) * l.stride_h >= x[2] + l.pad_h || (wo - 1) * l.stride_w >= x[3] + l.pad_w)
    return InvalidArgument(
        "{}: kernel {}x{}, stride {}x{}, pad {}x{} on input {}: the last of the {}x{} "
        "windows would start past the input (empty)",
        in.where, l.kernel_h, l.kernel_w, l.stride_h, l.stride_w, l.pad_h, l.pad_w, ShapeString(x), ho, wo);
  out->top = {x[0], x[1], ho, wo};
  return Status::Ok();
}

Status InnerProduct(const ShapeIn& in, ShapeOut* out) {
  const LayerSpec& l = in.layer;
  const std::vector<int>& x = in.bottoms[0];
  if (x.size() < 2)
    return InvalidArgument("{}: bottom '{}' must have a batch and feature dims, has {}", in.where, l.bottoms[0],
                           ShapeString(x));
  out->top = {x[0], l.num_output};
  AddLearnable(l, {l.num_output, ShapeCount(x) / x[0]}, out);
  return Status::Ok();
}

Status Scores(const ShapeIn& in, ShapeOut* out) {
  const LayerSpec& l = in.layer;
  const std::vector<int>& x = in.bottoms[0];
  if (x.size() != 2)
    return InvalidArgument("{}: scores '{}' must be 2-D (N,K), have shape {}", in.where, l.bottoms[0], ShapeString(x));
  if (in.bottoms[1] != std::vector<int>{x[0]})
    return InvalidArgument("{}: label '{}' has shape {}, expected ({})", in.where, l.bottoms[1],
                           ShapeString(in.bottoms[1]), x[0]);
  if (l.type == LayerType::kAccuracy && l.top_k > x[1])
    return InvalidArgument("{}: top_k {} exceeds the {} classes", in.where, l.top_k, x[1]);
  out->top = {1};
  return Status::Ok();
}

Status Same(const ShapeIn& in, ShapeOut* out) {
  out->top = in.bottoms[0];
  return Status::Ok();
}

Status Same4d(const ShapeIn& in, ShapeOut* out) {
  DP_RETURN_IF_ERROR(Need4d(in));
  return Same(in, out);
}

}  // namespace shape_rules

Status InferShapes(const NetSpec& spec, int batch, NetShapes* shapes) {
  *shapes = NetShapes();
  if (batch <= 0) return InvalidArgument("{}: batch size must be positive, got {}", spec.source, batch);
  auto& blobs = shapes->blobs;
  blobs["data"] = {batch, spec.input_channels, spec.input_height, spec.input_width};
  blobs["label"] = {batch};
  std::map<std::string, std::string> grad_consumer;  // blob → layer sending a gradient into it
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const LayerSpec& l = spec.layers[li];
    const LayerTypeRow& row = LayerTypeOf(l.type);
    const std::string where = fmt::format("{}: layer '{}' (#{}, {})", spec.source, l.name, li, TypeNameOf(l));
    const size_t want_bottoms = static_cast<size_t>(row.bottoms);
    if (l.bottoms.size() != want_bottoms)
      return InvalidArgument("{}: needs {} bottom(s), has {}", where, want_bottoms, l.bottoms.size());
    if (l.tops.size() != 1) return InvalidArgument("{}: needs 1 top, has {}", where, l.tops.size());
    std::vector<std::vector<int>> in;
    for (const auto& b : l.bottoms) {
      auto it = blobs.find(b);
      if (it == blobs.end())
        return InvalidArgument("{}: bottom '{}' is not produced by any earlier layer nor an input",
                               where, b);
      in.push_back(it->second);
    }
    if (blobs.count(l.tops[0]))
      return InvalidArgument("{}: top '{}' already exists (in-place layers are not supported; "
                             "give the top a new name)", where, l.tops[0]);
    // Gradient routing: bottom 0 of every layer that sends a gradient back receives one.
    if (row.sends_gradient && l.bottoms[0] != "data") {
      auto [it, inserted] = grad_consumer.emplace(l.bottoms[0], l.name);
      if (!inserted)
        return InvalidArgument("{}: bottom '{}' already feeds gradient-carrying layer '{}'; a blob "
                               "may have only one such consumer", where, l.bottoms[0], it->second);
    }
    ShapeOut out;
    DP_RETURN_IF_ERROR(row.shape(ShapeIn{l, in, where}, &out));
    shapes->layer_params.resize(li + 1);
    for (ShapeOut::Param& p : out.params) {
      shapes->layer_params[li].push_back(static_cast<int>(shapes->params.size()));
      shapes->params.push_back(TensorSpec{l.name + p.suffix, std::move(p.shape), p.lr_mult, p.decay_mult});
    }
    if (l.type == LayerType::kSoftmaxWithLoss) {
      if (shapes->loss_layer >= 0)
        return InvalidArgument("{}: a second loss layer (first: '{}')", where, spec.layers[shapes->loss_layer].name);
      shapes->loss_layer = static_cast<int>(li);
      shapes->num_classes = in[0][1];
    }
    blobs[l.tops[0]] = std::move(out.top);
  }
  if (shapes->loss_layer < 0)
    return InvalidArgument("{}: the net has no SoftmaxWithLoss layer", spec.source);
  return Status::Ok();
}

}  // namespace downpour::engine
