// net_spec.cc — TOML → NetSpec, and shape inference. See net_spec.h.
#include "client/engine/net_spec.h"

#include <fmt/ranges.h>

#include <set>
#include <sstream>
#include <toml++/toml.h>

namespace downpour::engine {
namespace {

struct TypeName {
  LayerType type;
  const char* name;
};
constexpr TypeName kTypeNames[] = {
    {LayerType::kConvolution, "Convolution"},   {LayerType::kActivation, "activation"},
    {LayerType::kLRN, "LRN"},                   {LayerType::kPooling, "Pooling"},
    {LayerType::kInnerProduct, "InnerProduct"}, {LayerType::kDropout, "Dropout"},
    {LayerType::kSoftmaxWithLoss, "SoftmaxWithLoss"}, {LayerType::kAccuracy, "Accuracy"},
};

const std::set<std::string> kLayerKeys = {
    "name",      "type",      "bottom",    "top",         "num_output",   "bias_term",
    "weight_filler", "bias_filler", "param", "kernel_size", "kernel_h",   "kernel_w",
    "stride",    "stride_h",  "stride_w",  "pad",         "pad_h",        "pad_w",
    "group",     "local_size", "alpha",    "beta",        "k",            "dropout_ratio",
    "top_k",     "pool"};

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
    if (!v) return InvalidArgument("{}: field '{}' must be a boolean", where.str(), key);
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

Status ParseLayer(const toml::table& t, int index, const std::string& source, LayerSpec* l) {
  Where where{source, fmt::format("layer #{}", index)};
  auto name = t.get("name") ? t.get("name")->value<std::string>() : std::nullopt;
  if (!name || name->empty()) return InvalidArgument("{}: missing field 'name'", where.str());
  l->name = *name;
  where.layer = fmt::format("layer '{}' (#{})", l->name, index);
  for (const auto& [key, node] : t) {
    if (!kLayerKeys.count(std::string(key.str())))
      return InvalidArgument("{}: unknown field '{}'", where.str(), key.str());
  }
  auto type = t.get("type") ? t.get("type")->value<std::string>() : std::nullopt;
  if (!type) return InvalidArgument("{}: missing field 'type'", where.str());
  bool found = false;
  for (const auto& tn : kTypeNames) {
    if (*type == tn.name && tn.type != LayerType::kActivation) {
      l->type = tn.type;
      found = true;
    }
  }
  if (const ActivationRow* row = FindActivation(*type)) {
    l->type = LayerType::kActivation;
    l->activation = row->kind;
    l->activation_alpha = row->alpha_default;
    found = true;
  }
  if (!found) {
    std::vector<std::string> names;
    for (const auto& tn : kTypeNames) {
      if (tn.type != LayerType::kActivation) names.push_back(tn.name);
    }
    for (const ActivationRow& row : kActivations) names.push_back(row.name);
    return InvalidArgument("{}: unknown type '{}' (known: {})", where.str(), *type,
                           fmt::join(names, ", "));
  }
  DP_RETURN_IF_ERROR(ReadStringList(t, "bottom", where, &l->bottoms));
  DP_RETURN_IF_ERROR(ReadStringList(t, "top", where, &l->tops));
  switch (l->type) {
    case LayerType::kConvolution:
    case LayerType::kInnerProduct: {
      DP_RETURN_IF_ERROR(ReadNumber(t, "num_output", where, &l->num_output));
      if (l->num_output <= 0)
        return InvalidArgument("{}: num_output must be positive, got {}", where.str(), l->num_output);
      DP_RETURN_IF_ERROR(ReadNumber(t, "bias_term", where, &l->bias_term));
      DP_RETURN_IF_ERROR(ParseFiller(t, "weight_filler", where, &l->weight_filler));
      DP_RETURN_IF_ERROR(ParseFiller(t, "bias_filler", where, &l->bias_filler));
      if (const toml::node* p = t.get("param")) {
        const toml::array* arr = p->as_array();
        if (arr == nullptr || arr->size() > 2)
          return InvalidArgument("{}: 'param' must be a list of at most 2 tables "
                                 "(weight, bias) with lr_mult / decay_mult", where.str());
        for (size_t i = 0; i < arr->size(); ++i) {
          const toml::table* pt = (*arr)[i].as_table();
          if (pt == nullptr) return InvalidArgument("{}: param[{}] must be a table", where.str(), i);
          float* lr = i == 0 ? &l->weight_lr_mult : &l->bias_lr_mult;
          float* decay = i == 0 ? &l->weight_decay_mult : &l->bias_decay_mult;
          DP_RETURN_IF_ERROR(ReadNumber(*pt, "lr_mult", where, lr));
          DP_RETURN_IF_ERROR(ReadNumber(*pt, "decay_mult", where, decay));
        }
      }
      if (l->type == LayerType::kConvolution) {
        DP_RETURN_IF_ERROR(ParseGeometry(t, where, l));
        DP_RETURN_IF_ERROR(ReadNumber(t, "group", where, &l->group));
        if (l->group <= 0 || l->num_output % l->group != 0)
          return InvalidArgument("{}: group {} must be positive and divide num_output {}",
                                 where.str(), l->group, l->num_output);
      }
      break;
    }
    case LayerType::kPooling:
      DP_RETURN_IF_ERROR(ParsePoolMethod(t, where, &l->pool));
      DP_RETURN_IF_ERROR(ParseGeometry(t, where, l));
      break;
    case LayerType::kLRN:
      DP_RETURN_IF_ERROR(ReadNumber(t, "local_size", where, &l->local_size));
      DP_RETURN_IF_ERROR(ReadNumber(t, "alpha", where, &l->alpha));
      DP_RETURN_IF_ERROR(ReadNumber(t, "beta", where, &l->beta));
      DP_RETURN_IF_ERROR(ReadNumber(t, "k", where, &l->k));
      if (l->local_size <= 0 || l->local_size % 2 == 0)
        return InvalidArgument("{}: local_size must be odd and positive, got {}", where.str(),
                               l->local_size);
      break;
    case LayerType::kDropout:
      DP_RETURN_IF_ERROR(ReadNumber(t, "dropout_ratio", where, &l->dropout_ratio));
      if (!(l->dropout_ratio >= 0.0f && l->dropout_ratio < 1.0f))
        return InvalidArgument("{}: dropout_ratio must be in [0, 1), got {}", where.str(),
                               l->dropout_ratio);
      break;
    case LayerType::kAccuracy:
      DP_RETURN_IF_ERROR(ReadNumber(t, "top_k", where, &l->top_k));
      if (l->top_k <= 0) return InvalidArgument("{}: top_k must be positive, got {}", where.str(), l->top_k);
      break;
    case LayerType::kActivation: {
      const ActivationRow& row = ActivationOf(l->activation);
      if (*row.alpha_key == '\0') break;
      DP_RETURN_IF_ERROR(ReadNumber(t, row.alpha_key, where, &l->activation_alpha));
      if (!row.alpha_ok(l->activation_alpha)) {
        return InvalidArgument("{}: {} must be {}, got {}", where.str(), row.alpha_key, row.alpha_rule,
                               l->activation_alpha);
      }
      break;
    }
    case LayerType::kSoftmaxWithLoss:
      break;
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

const char* LayerTypeName(LayerType type) {
  for (const auto& tn : kTypeNames)
    if (tn.type == type) return tn.name;
  return "?";
}

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

Status InferShapes(const NetSpec& spec, int batch, NetShapes* shapes) {
  *shapes = NetShapes();
  if (batch <= 0) return InvalidArgument("{}: batch size must be positive, got {}", spec.source, batch);
  auto& blobs = shapes->blobs;
  blobs["data"] = {batch, spec.input_channels, spec.input_height, spec.input_width};
  blobs["label"] = {batch};
  std::map<std::string, std::string> grad_consumer;  // blob → layer sending a gradient into it
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const LayerSpec& l = spec.layers[li];
    const std::string where = fmt::format("{}: layer '{}' (#{}, {})", spec.source, l.name, li, TypeNameOf(l));
    const bool two_bottoms = l.type == LayerType::kSoftmaxWithLoss || l.type == LayerType::kAccuracy;
    const size_t want_bottoms = two_bottoms ? 2 : 1;
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
    // Gradient routing: bottom 0 of every layer but Accuracy receives a gradient.
    if (l.type != LayerType::kAccuracy && l.bottoms[0] != "data") {
      auto [it, inserted] = grad_consumer.emplace(l.bottoms[0], l.name);
      if (!inserted)
        return InvalidArgument("{}: bottom '{}' already feeds gradient-carrying layer '{}'; a blob "
                               "may have only one such consumer", where, l.bottoms[0], it->second);
    }
    const std::vector<int>& x = in[0];
    std::vector<int> y;
    auto need4d = [&]() -> Status {
      if (x.size() != 4)
        return InvalidArgument("{}: bottom '{}' must be 4-D (N,C,H,W), has shape {}", where,
                               l.bottoms[0], ShapeString(x));
      return Status::Ok();
    };
    auto add_param = [&](const std::string& suffix, std::vector<int64_t> shape, float lr,
                         float decay) {
      shapes->layer_params.resize(li + 1);
      shapes->layer_params[li].push_back(static_cast<int>(shapes->params.size()));
      shapes->params.push_back(TensorSpec{l.name + suffix, std::move(shape), lr, decay});
    };
    shapes->layer_params.resize(li + 1);
    switch (l.type) {
      case LayerType::kConvolution: {
        DP_RETURN_IF_ERROR(need4d());
        if (x[1] % l.group != 0)
          return InvalidArgument("{}: group {} does not divide input channels {}", where, l.group, x[1]);
        int ho = ConvOutputSize(x[2], l.kernel_h, l.stride_h, l.pad_h);
        int wo = ConvOutputSize(x[3], l.kernel_w, l.stride_w, l.pad_w);
        if (ho <= 0 || wo <= 0)
          return InvalidArgument("{}: kernel {}x{} (pad {}) is larger than the input {}", where,
                                 l.kernel_h, l.kernel_w, l.pad_h, ShapeString(x));
        y = {x[0], l.num_output, ho, wo};
        add_param(".weight", {l.num_output, x[1] / l.group, l.kernel_h, l.kernel_w},
                  l.weight_lr_mult, l.weight_decay_mult);
        if (l.bias_term) add_param(".bias", {l.num_output}, l.bias_lr_mult, l.bias_decay_mult);
        break;
      }
      case LayerType::kPooling: {
        DP_RETURN_IF_ERROR(need4d());
        if (l.pad_h >= l.kernel_h || l.pad_w >= l.kernel_w)
          return InvalidArgument("{}: pad {}x{} must be smaller than the kernel {}x{}", where,
                                 l.pad_h, l.pad_w, l.kernel_h, l.kernel_w);
        int ho = PoolOutputSize(x[2], l.kernel_h, l.stride_h, l.pad_h);
        int wo = PoolOutputSize(x[3], l.kernel_w, l.stride_w, l.pad_w);
        if (ho <= 0 || wo <= 0 || x[2] + 2 * l.pad_h < l.kernel_h || x[3] + 2 * l.pad_w < l.kernel_w)
          return InvalidArgument("{}: kernel {}x{} is larger than the input {}", where, l.kernel_h,
                                 l.kernel_w, ShapeString(x));
        // Caffe drops a last window that would start past the input only when there is padding;
        // without, a stride larger than the kernel can leave it empty (Caffe: MAX -FLT_MAX, AVE 0/0).
        if ((ho - 1) * l.stride_h >= x[2] + l.pad_h || (wo - 1) * l.stride_w >= x[3] + l.pad_w)
          return InvalidArgument(
              "{}: kernel {}x{}, stride {}x{}, pad {}x{} on input {}: the last of the {}x{} "
              "windows would start past the input (empty)",
              where, l.kernel_h, l.kernel_w, l.stride_h, l.stride_w, l.pad_h, l.pad_w, ShapeString(x), ho, wo);
        y = {x[0], x[1], ho, wo};
        break;
      }
      case LayerType::kLRN:
        DP_RETURN_IF_ERROR(need4d());
        y = x;
        break;
      case LayerType::kActivation:
      case LayerType::kDropout:
        y = x;
        break;
      case LayerType::kInnerProduct: {
        if (x.size() < 2)
          return InvalidArgument("{}: bottom '{}' must have a batch and feature dims, has {}",
                                 where, l.bottoms[0], ShapeString(x));
        int64_t k = ShapeCount(x) / x[0];
        y = {x[0], l.num_output};
        add_param(".weight", {l.num_output, k}, l.weight_lr_mult, l.weight_decay_mult);
        if (l.bias_term) add_param(".bias", {l.num_output}, l.bias_lr_mult, l.bias_decay_mult);
        break;
      }
      case LayerType::kSoftmaxWithLoss:
      case LayerType::kAccuracy: {
        if (x.size() != 2)
          return InvalidArgument("{}: scores '{}' must be 2-D (N,K), have shape {}", where,
                                 l.bottoms[0], ShapeString(x));
        if (in[1] != std::vector<int>{x[0]})
          return InvalidArgument("{}: label '{}' has shape {}, expected ({})", where, l.bottoms[1],
                                 ShapeString(in[1]), x[0]);
        if (l.type == LayerType::kAccuracy && l.top_k > x[1])
          return InvalidArgument("{}: top_k {} exceeds the {} classes", where, l.top_k, x[1]);
        if (l.type == LayerType::kSoftmaxWithLoss) {
          if (shapes->loss_layer >= 0)
            return InvalidArgument("{}: a second loss layer (first: '{}')", where,
                                   spec.layers[shapes->loss_layer].name);
          shapes->loss_layer = static_cast<int>(li);
          shapes->num_classes = x[1];
        }
        y = {1};
        break;
      }
    }
    blobs[l.tops[0]] = y;
  }
  if (shapes->loss_layer < 0)
    return InvalidArgument("{}: the net has no SoftmaxWithLoss layer", spec.source);
  return Status::Ok();
}

}  // namespace downpour::engine
