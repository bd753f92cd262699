// prototxt_import.cc — see prototxt_import.h.
#include "client/caffe/prototxt_import.h"

#include <fmt/ranges.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <type_traits>
#include <variant>

#include "client/caffe/upgrade_v1.h"
#include "client/engine/activations.h"
#include "client/engine/net_spec.h"
#include "common/file_io.h"
#include "data/caffe.pb.h"

namespace downpour::caffe_io {
namespace {

using ::caffe::LayerParameter;

// The types converted to a [[layer]] by hand below, besides those converted from their row
// (net_spec.h kLayerTypes with a caffe_message: TableRow) and the activations (activations.h),
// which are all converted (the input types are read, not converted).
const std::set<std::string> kConvertible = {"Convolution",     "InnerProduct", "Pooling", "LRN",
                                            "SoftmaxWithLoss", "Softmax",      "Accuracy"};

// The layer type row `type` is converted from, or null.
const engine::LayerTypeRow* TableRow(const std::string& type) {
  const engine::LayerTypeRow* row = engine::FindLayerType(type);
  return row != nullptr && *row->caffe_message != '\0' ? row : nullptr;
}

std::string SupportedTypes() {
  std::vector<std::string> names(kConvertible.begin(), kConvertible.end());
  for (const engine::LayerTypeRow& row : engine::kLayerTypes) {
    if (*row.caffe_message != '\0') names.emplace_back(row.name);
  }
  for (const engine::ActivationRow& row : engine::kActivations) names.emplace_back(row.name);
  std::sort(names.begin(), names.end());
  return fmt::format("{}; inputs: Data, ImageData, Input", fmt::join(names, ", "));
}

bool IsInputType(const std::string& type) { return type == "Data" || type == "ImageData" || type == "Input"; }

// ---------------------------------------------------------------------------------------------
// Parsing.

// Collects protobuf's parse errors (the first one is reported) and its warnings (fields outside
// the subset of caffe.proto that data/caffe.proto declares, skipped by AllowUnknownField).
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (!has_error) {
      has_error = true;
      error_line = line;
      error_at = fmt::format("{}:{}", line + 1, column + 1);
      error = message;
    }
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    warnings.push_back(fmt::format("line {}:{}: {}", line + 1, column + 1, message));
  }
  bool has_error = false;
  int error_line = 0;    // 0-based
  std::string error_at;  // "line:column", 1-based
  std::string error;
  std::vector<std::string> warnings;
};

// The name of the layer a (0-based) line falls in, for parse errors: the first `name: "..."`
// after the last line opening `layer {` / `layers {` at or before it. "" if none.
std::string LayerNameAt(const std::string& text, int line) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (int i = 0; i <= line && start <= text.size(); ++i) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  int open = -1;
  for (int i = static_cast<int>(lines.size()) - 1; i >= 0; --i) {
    std::string t = lines[i];
    t.erase(0, t.find_first_not_of(" \t"));
    if (t.rfind("layer", 0) == 0 && t.find('{') != std::string::npos) {
      open = i;
      break;
    }
  }
  if (open < 0) return "";
  for (size_t i = static_cast<size_t>(open); i < lines.size(); ++i) {
    const size_t at = lines[i].find("name:");
    if (at == std::string::npos) continue;
    const size_t q1 = lines[i].find('"', at);
    const size_t q2 = q1 == std::string::npos ? q1 : lines[i].find('"', q1 + 1);
    if (q2 != std::string::npos) return lines[i].substr(q1 + 1, q2 - q1 - 1);
  }
  return "";
}

struct ParsedNet {
  ::caffe::NetParameter net;
  std::vector<LayerParameter> layers;  // `layer`, or `layers` upgraded
  std::vector<int> lines;              // 1-based line where each layer opens
  std::vector<std::string> ignored;    // protobuf's warnings about skipped fields
};

Status ParseNet(const std::string& text, const std::string& source, ParsedNet* out) {
  Collector collector;
  google::protobuf::TextFormat::ParseInfoTree tree;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowUnknownField(true);
  parser.RecordErrorsTo(&collector);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &out->net)) {
    if (!collector.has_error) return InvalidArgument("{}: not a valid Caffe NetParameter prototxt", source);
    const std::string layer = LayerNameAt(text, collector.error_line);
    return InvalidArgument("{}:{}: not a valid Caffe NetParameter prototxt{}: {}", source, collector.error_at,
                           layer.empty() ? "" : fmt::format(" (in layer '{}')", layer), collector.error);
  }
  out->ignored = std::move(collector.warnings);
  const auto* desc = ::caffe::NetParameter::descriptor();
  if (out->net.layer_size() > 0 && out->net.layers_size() > 0) {
    return InvalidArgument("{}: mixes new-style 'layer' ({}) and V1 'layers' ({}) entries; Caffe refuses that too",
                           source, out->net.layer_size(), out->net.layers_size());
  }
  if (out->net.layer_size() > 0) {
    const auto* field = desc->FindFieldByName("layer");
    for (int i = 0; i < out->net.layer_size(); ++i) {
      out->layers.push_back(out->net.layer(i));
      out->lines.push_back(tree.GetLocation(field, i).line + 1);
    }
  } else {
    const auto* field = desc->FindFieldByName("layers");
    for (int i = 0; i < out->net.layers_size(); ++i) {
      LayerParameter upgraded;
      UpgradeV1Layer(out->net.mutable_layers(i), &upgraded);
      out->layers.push_back(std::move(upgraded));
      out->lines.push_back(tree.GetLocation(field, i).line + 1);
    }
  }
  if (out->layers.empty()) return InvalidArgument("{}: the net has no layers", source);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Phase rules: Caffe's Net::StateMeetsRule / FilterNet with NetState {phase, level, stages}.

struct NetState {
  ::caffe::Phase phase = ::caffe::TRAIN;
  int level = 0;
  std::set<std::string> stages;
};

bool RuleMet(const NetState& state, const ::caffe::NetStateRule& rule) {
  if (rule.has_phase() && rule.phase() != state.phase) return false;
  if (rule.has_min_level() && state.level < rule.min_level()) return false;
  if (rule.has_max_level() && state.level > rule.max_level()) return false;
  for (const std::string& s : rule.stage()) {
    if (!state.stages.count(s)) return false;
  }
  for (const std::string& s : rule.not_stage()) {
    if (state.stages.count(s)) return false;
  }
  return true;
}

bool Included(const NetState& state, const LayerParameter& layer) {
  bool included = layer.include_size() == 0;
  for (const auto& rule : layer.exclude()) {
    if (RuleMet(state, rule)) included = false;
  }
  for (const auto& rule : layer.include()) {
    if (RuleMet(state, rule)) included = true;
  }
  return included;
}

const char* PhaseName(::caffe::Phase phase) { return phase == ::caffe::TRAIN ? "train" : "test"; }

// ---------------------------------------------------------------------------------------------
// TOML text.

std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A float as a TOML float (always with a '.' or an exponent), shortest round-trip digits.
std::string TomlFloat(float v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string TomlStringList(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& s : items) quoted.push_back(TomlString(s));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

// Text for a comment line: no newlines can escape the comment.
std::string CommentSafe(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

// ---------------------------------------------------------------------------------------------
// Layer conversion.

// Where a layer is, for errors: "net.prototxt:57: layer 'conv2' (#5, Convolution)".
struct LayerWhere {
  std::string text;
};
LayerWhere Where(const std::string& source, int line, int index, const LayerParameter& layer) {
  return {fmt::format("{}:{}: layer '{}' (#{}, {})", source, line, layer.name(), index,
                      layer.type().empty() ? "no type" : layer.type())};
}

// One [[layer]] table being written.
struct TomlLayer {
  std::string text;
  void Key(const std::string& key, const std::string& value) { text += key + " = " + value + "\n"; }
  void Int(const std::string& key, int64_t v) { Key(key, fmt::format("{}", v)); }
  void Float(const std::string& key, float v) { Key(key, TomlFloat(v)); }
  void Bool(const std::string& key, bool v) { Key(key, v ? "true" : "false"); }
};

Status FillerToml(const ::caffe::FillerParameter& f, const LayerWhere& where, const char* field, std::string* out) {
  const std::string& type = f.type();
  if (type == "constant") {
    *out = fmt::format("{{ type = \"constant\", value = {} }}", TomlFloat(f.value()));
  } else if (type == "gaussian") {
    if (f.mean() != 0.0f) {
      return InvalidArgument("{}: {}.mean = {}: the engine's gaussian filler has mean 0", where.text, field, f.mean());
    }
    if (f.sparse() != -1) {
      return InvalidArgument("{}: {}.sparse = {}: sparse gaussian fillers are not supported", where.text, field,
                             f.sparse());
    }
    *out = fmt::format("{{ type = \"gaussian\", std = {} }}", TomlFloat(f.std()));
  } else if (type == "uniform") {
    if (f.min() != -f.max()) {
      return InvalidArgument("{}: {} is uniform on [{}, {}]: the engine's uniform filler is symmetric [-scale, scale]",
                             where.text, field, f.min(), f.max());
    }
    *out = fmt::format("{{ type = \"uniform\", scale = {} }}", TomlFloat(f.max()));
  } else if (type == "xavier" || type == "msra") {
    if (f.variance_norm() != ::caffe::FillerParameter::FAN_IN) {
      return InvalidArgument("{}: {}.variance_norm = {}: the engine's {} filler normalises by FAN_IN only", where.text,
                             field, ::caffe::FillerParameter::VarianceNorm_Name(f.variance_norm()), type);
    }
    *out = fmt::format("{{ type = \"{}\" }}", type);
  } else {
    return InvalidArgument("{}: {}.type '{}' is not supported (supported: constant, gaussian, uniform, xavier, msra)",
                           where.text, field, type);
  }
  return Status::Ok();
}

// A layer's param { } entries: at most one per parameter blob (`tensors`).
Status CheckParamEntries(const LayerParameter& layer, int tensors, const LayerWhere& where) {
  if (layer.param_size() <= tensors) return Status::Ok();
  return InvalidArgument("{}: {} param {{ }} entries for {} parameter blob(s)", where.text, layer.param_size(),
                         tensors);
}

// The TOML `param` list of a layer with `tensors` parameter blobs: Caffe's multipliers default to
// 1 (ParamSpec), written out because the TOML parser's bias default is Caffe's usual 2/0, not the
// proto default.
std::string ParamEntriesToml(const LayerParameter& layer, int tensors) {
  std::vector<std::string> params;
  for (int i = 0; i < tensors; ++i) {
    const ::caffe::ParamSpec p = i < layer.param_size() ? layer.param(i) : ::caffe::ParamSpec();
    params.push_back(
        fmt::format("{{ lr_mult = {}, decay_mult = {} }}", TomlFloat(p.lr_mult()), TomlFloat(p.decay_mult())));
  }
  return fmt::format("[{}]", fmt::join(params, ", "));
}

// Learnable-layer fields shared by Convolution and InnerProduct.
Status LearnableToml(const LayerParameter& layer, const LayerWhere& where, uint32_t num_output, bool bias_term,
                     const ::caffe::FillerParameter& weight_filler, const ::caffe::FillerParameter& bias_filler,
                     TomlLayer* t) {
  if (num_output == 0) return InvalidArgument("{}: num_output must be set and positive", where.text);
  const int tensors = bias_term ? 2 : 1;
  DP_RETURN_IF_ERROR(CheckParamEntries(layer, tensors, where));
  t->Int("num_output", num_output);
  t->Bool("bias_term", bias_term);
  std::string filler;
  DP_RETURN_IF_ERROR(FillerToml(weight_filler, where, "weight_filler", &filler));
  t->Key("weight_filler", filler);
  if (bias_term) {
    DP_RETURN_IF_ERROR(FillerToml(bias_filler, where, "bias_filler", &filler));
    t->Key("bias_filler", filler);
  }
  t->Key("param", ParamEntriesToml(layer, tensors));
  return Status::Ok();
}

// (h, w) from Caffe's repeated single-or-per-axis field, or the _h/_w pair.
Status AxisPair(const google::protobuf::RepeatedField<uint32_t>& values, bool has_h, bool has_w, uint32_t h, uint32_t w,
                uint32_t dflt, const LayerWhere& where, const char* name, int* out_h, int* out_w) {
  if (has_h || has_w) {
    if (values.size() > 0) {
      return InvalidArgument("{}: give either {} or {}_h/{}_w, not both", where.text, name, name, name);
    }
    *out_h = static_cast<int>(has_h ? h : dflt);
    *out_w = static_cast<int>(has_w ? w : dflt);
    return Status::Ok();
  }
  switch (values.size()) {
    case 0:
      *out_h = *out_w = static_cast<int>(dflt);
      return Status::Ok();
    case 1:
      *out_h = *out_w = static_cast<int>(values[0]);
      return Status::Ok();
    case 2:
      *out_h = static_cast<int>(values[0]);
      *out_w = static_cast<int>(values[1]);
      return Status::Ok();
    default:
      return InvalidArgument("{}: {} has {} values: only 2-D (one value or height, width) is supported", where.text,
                             name, values.size());
  }
}

void GeometryToml(int kh, int kw, int sh, int sw, int ph, int pw, TomlLayer* t) {
  if (kh == kw) {
    t->Int("kernel_size", kh);
  } else {
    t->Int("kernel_h", kh);
    t->Int("kernel_w", kw);
  }
  if (sh == sw) {
    t->Int("stride", sh);
  } else {
    t->Int("stride_h", sh);
    t->Int("stride_w", sw);
  }
  if (ph == pw) {
    t->Int("pad", ph);
  } else {
    t->Int("pad_h", ph);
    t->Int("pad_w", pw);
  }
}

Status ConvolutionToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer* t) {
  const ::caffe::ConvolutionParameter& p = layer.convolution_param();
  if (p.axis() != 1)
    return InvalidArgument("{}: convolution_param.axis = {}: only axis 1 is supported", where.text, p.axis());
  for (uint32_t d : p.dilation()) {
    if (d != 1)
      return InvalidArgument("{}: convolution_param.dilation = {}: dilated convolution is not supported", where.text,
                             d);
  }
  if ((p.has_kernel_h() || p.has_kernel_w()) && !(p.has_kernel_h() && p.has_kernel_w())) {
    return InvalidArgument("{}: kernel_h and kernel_w must be given together", where.text);
  }
  if (p.kernel_size_size() == 0 && !p.has_kernel_h()) {
    return InvalidArgument("{}: convolution_param has no kernel_size (nor kernel_h/kernel_w)", where.text);
  }
  int kh, kw, sh, sw, ph, pw;
  DP_RETURN_IF_ERROR(AxisPair(p.kernel_size(), p.has_kernel_h(), p.has_kernel_w(), p.kernel_h(), p.kernel_w(), 0, where,
                              "kernel_size", &kh, &kw));
  DP_RETURN_IF_ERROR(AxisPair(p.stride(), p.has_stride_h(), p.has_stride_w(), p.stride_h(), p.stride_w(), 1, where,
                              "stride", &sh, &sw));
  DP_RETURN_IF_ERROR(AxisPair(p.pad(), p.has_pad_h(), p.has_pad_w(), p.pad_h(), p.pad_w(), 0, where, "pad", &ph, &pw));
  if (p.group() == 0 || p.num_output() % p.group() != 0) {
    return InvalidArgument("{}: group {} must be positive and divide num_output {}", where.text, p.group(),
                           p.num_output());
  }
  DP_RETURN_IF_ERROR(LearnableToml(layer, where, p.num_output(), p.bias_term(), p.weight_filler(), p.bias_filler(), t));
  GeometryToml(kh, kw, sh, sw, ph, pw, t);
  t->Int("group", p.group());
  return Status::Ok();
}

Status InnerProductToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer* t) {
  const ::caffe::InnerProductParameter& p = layer.inner_product_param();
  if (p.axis() != 1)
    return InvalidArgument("{}: inner_product_param.axis = {}: only axis 1 is supported", where.text, p.axis());
  if (p.transpose()) {
    return InvalidArgument("{}: inner_product_param.transpose = true: the engine stores weights out×in only",
                           where.text);
  }
  return LearnableToml(layer, where, p.num_output(), p.bias_term(), p.weight_filler(), p.bias_filler(), t);
}

Status PoolingToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer* t) {
  const ::caffe::PoolingParameter& p = layer.pooling_param();
  if (p.global_pooling()) {
    return InvalidArgument("{}: global_pooling is not supported; give kernel_size = the input's height and width",
                           where.text);
  }
  if (p.round_mode() != ::caffe::PoolingParameter::CEIL) {
    return InvalidArgument("{}: round_mode {}: the engine rounds pooled sizes up (CEIL) only", where.text,
                           ::caffe::PoolingParameter::RoundMode_Name(p.round_mode()));
  }
  std::string pool;
  switch (p.pool()) {
    case ::caffe::PoolingParameter::MAX:
      pool = "max";
      break;
    case ::caffe::PoolingParameter::AVE:
      pool = "ave";
      break;
    default:
      return InvalidArgument("{}: pool: {} is not supported (MAX, AVE)", where.text,
                             ::caffe::PoolingParameter::PoolMethod_Name(p.pool()));
  }
  int kh, kw;
  if (p.has_kernel_size()) {
    if (p.has_kernel_h() || p.has_kernel_w()) {
      return InvalidArgument("{}: give either kernel_size or kernel_h/kernel_w, not both", where.text);
    }
    kh = kw = static_cast<int>(p.kernel_size());
  } else if (p.has_kernel_h() && p.has_kernel_w()) {
    kh = static_cast<int>(p.kernel_h());
    kw = static_cast<int>(p.kernel_w());
  } else {
    return InvalidArgument("{}: pooling_param needs kernel_size, or both kernel_h and kernel_w", where.text);
  }
  // Caffe: pad_h/pad_w (stride_h/stride_w) replace pad (stride) when given.
  const int ph = static_cast<int>(p.has_pad_h() ? p.pad_h() : p.pad());
  const int pw = static_cast<int>(p.has_pad_h() ? p.pad_w() : p.pad());
  const int sh = static_cast<int>(p.has_stride_h() ? p.stride_h() : p.stride());
  const int sw = static_cast<int>(p.has_stride_h() ? p.stride_w() : p.stride());
  t->Key("pool", TomlString(pool));
  GeometryToml(kh, kw, sh, sw, ph, pw, t);
  return Status::Ok();
}

Status LrnToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer* t) {
  const ::caffe::LRNParameter& p = layer.lrn_param();
  if (p.norm_region() != ::caffe::LRNParameter::ACROSS_CHANNELS) {
    return InvalidArgument("{}: lrn_param.norm_region {}: only ACROSS_CHANNELS is supported", where.text,
                           ::caffe::LRNParameter::NormRegion_Name(p.norm_region()));
  }
  t->Int("local_size", p.local_size());
  t->Float("alpha", p.alpha());
  t->Float("beta", p.beta());
  t->Float("k", p.k());
  return Status::Ok();
}

// An activation (engine/activations.h): its row says where a prototxt keeps the parameter
// (LayerParameter.<caffe_message>.<caffe_field>), read here by reflection, so a new row needs no
// code here. A row without a TOML key takes only its default.
Status ActivationToml(const LayerParameter& layer, const engine::ActivationRow& row, const LayerWhere& where,
                      TomlLayer* t) {
  float alpha = row.alpha_default;
  const google::protobuf::FieldDescriptor* holder = layer.GetDescriptor()->FindFieldByName(row.caffe_message);
  DP_CHECK(holder != nullptr && "an activation's caffe_message is a field of data/caffe.proto's LayerParameter");
  if (layer.GetReflection()->HasField(layer, holder)) {
    const google::protobuf::Message& m = layer.GetReflection()->GetMessage(layer, holder);
    const google::protobuf::FieldDescriptor* field = m.GetDescriptor()->FindFieldByName(row.caffe_field);
    DP_CHECK(field != nullptr && field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_FLOAT);
    alpha = m.GetReflection()->GetFloat(m, field);  // its proto default when unset
  }
  if (*row.alpha_key == '\0') {
    if (alpha != row.alpha_default) {
      return InvalidArgument("{}: {}.{} = {}: the engine's {} takes only {}", where.text, row.caffe_message,
                             row.caffe_field, alpha, row.name, row.alpha_default);
    }
    return Status::Ok();
  }
  if (!row.alpha_ok(alpha)) {
    return InvalidArgument("{}: {}.{} = {}: must be {}", where.text, row.caffe_message, row.caffe_field, alpha,
                           row.alpha_rule);
  }
  t->Float(row.alpha_key, alpha);
  return Status::Ok();
}

// A type converted from its row (net_spec.h LayerTypeRow::caffe_message): each key from its
// caffe_field of that message (the proto default when unset, which the rows' defaults follow),
// weight_filler from caffe_filler, and its one param { } entry.
Status TableRowToml(const LayerParameter& layer, const engine::LayerTypeRow& row, const LayerWhere& where,
                    TomlLayer* t) {
  using google::protobuf::FieldDescriptor;
  const FieldDescriptor* holder = layer.GetDescriptor()->FindFieldByName(row.caffe_message);
  DP_CHECK(holder != nullptr && holder->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
           "a layer row's caffe_message is a message field of data/caffe.proto's LayerParameter");
  const google::protobuf::Message& m = layer.GetReflection()->GetMessage(layer, holder);  // defaults if unset
  const google::protobuf::Reflection* r = m.GetReflection();
  for (const engine::LayerKey& key : row.keys) {
    if (*key.caffe_field == '\0') continue;
    const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(key.caffe_field);
    DP_CHECK(f != nullptr && "a layer key's caffe_field is a field of its row's caffe_message");
    double v = 0;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_BOOL:
        v = r->GetBool(m, f);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        v = r->GetFloat(m, f);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        v = r->GetInt32(m, f);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        v = r->GetUInt32(m, f);
        break;
      default:
        DP_CHECK(false && "a layer key's caffe_field is a bool or a number");
    }
    if (key.ok != nullptr && !key.ok(v)) {
      return InvalidArgument("{}: {}.{} = {}: must be {}", where.text, row.caffe_message, key.caffe_field, v, key.rule);
    }
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(engine::LayerSpec{}.*member)>;
          if constexpr (std::is_same_v<T, bool>) {
            t->Bool(key.name, v != 0);
          } else if constexpr (std::is_integral_v<T>) {
            t->Int(key.name, static_cast<int64_t>(v));
          } else {
            t->Float(key.name, static_cast<float>(v));
          }
        },
        key.member);
  }
  if (*row.caffe_filler != '\0') {
    const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(row.caffe_filler);
    DP_CHECK(f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE);
    if (r->HasField(m, f)) {
      std::string filler;
      const std::string field = fmt::format("{}.{}", row.caffe_message, row.caffe_filler);
      DP_RETURN_IF_ERROR(
          FillerToml(static_cast<const ::caffe::FillerParameter&>(r->GetMessage(m, f)), where, field.c_str(), &filler));
      t->Key("weight_filler", filler);
    }
  }
  if (row.groups & engine::kSlopeKeys) {
    DP_RETURN_IF_ERROR(CheckParamEntries(layer, 1, where));
    t->Key("param", ParamEntriesToml(layer, 1));
  }
  return Status::Ok();
}

Status LossToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer*) {
  if (layer.has_loss_param()) {
    const ::caffe::LossParameter& p = layer.loss_param();
    if (p.has_ignore_label()) {
      return InvalidArgument("{}: loss_param.ignore_label = {} is not supported", where.text, p.ignore_label());
    }
    if (p.has_normalization() && p.normalization() == ::caffe::LossParameter::NONE) {
      return InvalidArgument("{}: loss_param.normalization NONE (a summed loss): the engine's loss is the batch mean",
                             where.text);
    }
  }
  if (layer.softmax_param().axis() != 1) {
    return InvalidArgument("{}: softmax_param.axis = {}: only axis 1 is supported", where.text,
                           layer.softmax_param().axis());
  }
  return Status::Ok();
}

Status AccuracyToml(const LayerParameter& layer, const LayerWhere& where, TomlLayer* t) {
  const ::caffe::AccuracyParameter& p = layer.accuracy_param();
  if (p.axis() != 1)
    return InvalidArgument("{}: accuracy_param.axis = {}: only axis 1 is supported", where.text, p.axis());
  if (p.has_ignore_label()) {
    return InvalidArgument("{}: accuracy_param.ignore_label = {} is not supported", where.text, p.ignore_label());
  }
  t->Int("top_k", p.top_k());
  return Status::Ok();
}

// Checks that hold for every layer: loss weights, propagate_down, shared parameters.
Status CommonChecks(const LayerParameter& layer, const LayerWhere& where,
                    std::map<std::string, std::string>* param_owners) {
  for (float w : layer.loss_weight()) {
    const bool is_loss = layer.type() == "SoftmaxWithLoss";
    if (is_loss ? w != 1.0f : w != 0.0f) {
      return InvalidArgument(
          "{}: loss_weight {} is not supported (the engine's only loss is SoftmaxWithLoss, weight 1)", where.text, w);
    }
  }
  for (bool down : layer.propagate_down()) {
    if (!down) return InvalidArgument("{}: propagate_down: false is not supported", where.text);
  }
  for (const auto& p : layer.param()) {
    if (p.name().empty()) continue;
    auto [it, inserted] = param_owners->emplace(p.name(), layer.name());
    if (!inserted && it->second != layer.name()) {
      return InvalidArgument("{}: shares parameter '{}' with layer '{}': weight sharing is not supported", where.text,
                             p.name(), it->second);
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// The input: which layer gives it, and what it fixes.

struct InputSize {
  std::string layer;  // the layer (or "NetParameter.input") that gives the input
  std::string type;
  int c = 0, h = 0, w = 0;
  bool c_fixed = false;   // C is stated (Input shape, ImageData is_color, --input)
  bool hw_fixed = false;  // H and W are stated (Input shape, crop_size, new_height/new_width)
  std::string how;        // how C×H×W was found, for the TOML header
};

// The preprocessing of a Data / ImageData layer, new transform_param first, then the deprecated
// copies in data_param / image_data_param (as Caffe's UpgradeNetDataTransformation reads them).
struct Transform {
  uint32_t crop = 0;
  bool mirror = false;
  std::string mean_file;
  std::vector<float> mean_values;
  float scale = 1.0f;
  bool force_gray = false;
};

Transform TransformOf(const LayerParameter& layer) {
  Transform t;
  const ::caffe::TransformationParameter& tp = layer.transform_param();
  t.crop = tp.crop_size();
  t.mirror = tp.mirror();
  t.mean_file = tp.mean_file();
  t.mean_values.assign(tp.mean_value().begin(), tp.mean_value().end());
  t.scale = tp.scale();
  t.force_gray = tp.force_gray();
  auto old = [&](auto& p) {
    if (t.crop == 0) t.crop = p.crop_size();
    if (!tp.has_mirror() && p.mirror()) t.mirror = true;
    if (t.mean_file.empty()) t.mean_file = p.mean_file();
    if (!tp.has_scale() && p.has_scale()) t.scale = p.scale();
  };
  if (layer.has_data_param()) old(layer.data_param());
  if (layer.has_image_data_param()) old(layer.image_data_param());
  return t;
}

Status InputFromLayer(const LayerParameter& layer, const LayerWhere& where, InputSize* in) {
  in->layer = layer.name();
  in->type = layer.type();
  if (layer.type() == "Input") {
    if (layer.input_param().shape_size() == 0) {
      in->how = fmt::format("Input layer '{}' gives no shape", layer.name());
      return Status::Ok();
    }
    const ::caffe::BlobShape& s = layer.input_param().shape(0);
    if (s.dim_size() != 4) {
      return InvalidArgument("{}: input_param.shape has {} dims; the engine's input is N×C×H×W", where.text,
                             s.dim_size());
    }
    in->c = static_cast<int>(s.dim(1));
    in->h = static_cast<int>(s.dim(2));
    in->w = static_cast<int>(s.dim(3));
    in->c_fixed = in->hw_fixed = true;
    in->how = fmt::format("input_param.shape of Input layer '{}'", layer.name());
    return Status::Ok();
  }
  const Transform t = TransformOf(layer);
  if (layer.type() == "ImageData") {
    in->c = layer.image_data_param().is_color() ? 3 : 1;
    in->c_fixed = true;
    const uint32_t nh = layer.image_data_param().new_height(), nw = layer.image_data_param().new_width();
    if (t.crop > 0) {
      in->h = in->w = static_cast<int>(t.crop);
      in->hw_fixed = true;
      in->how = fmt::format("crop_size of ImageData layer '{}', C from is_color", layer.name());
    } else if (nh > 0 && nw > 0) {
      in->h = static_cast<int>(nh);
      in->w = static_cast<int>(nw);
      in->hw_fixed = true;
      in->how = fmt::format("new_height/new_width of ImageData layer '{}', C from is_color", layer.name());
    }
    return Status::Ok();
  }
  // Data: the LMDB records carry C×H×W; the prototxt fixes H×W only through a crop.
  in->c = t.force_gray ? 1 : 3;
  if (t.crop > 0) {
    in->h = in->w = static_cast<int>(t.crop);
    in->hw_fixed = true;
    in->how = fmt::format(
        "H×W from transform_param.crop_size of Data layer '{}', C = {} {} (the LMDB holds C; "
        "--input overrides it)",
        layer.name(), in->c, t.force_gray ? "from force_gray" : "assumed: colour images");
  }
  return Status::Ok();
}

Status InputFromNetFields(const ::caffe::NetParameter& net, const std::string& source, InputSize* in) {
  in->layer = "NetParameter.input";
  in->type = "input";
  std::vector<int64_t> dims;
  if (net.input_shape_size() > 0) {
    dims.assign(net.input_shape(0).dim().begin(), net.input_shape(0).dim().end());
  } else if (net.input_dim_size() >= 4) {
    dims.assign(net.input_dim().begin(), net.input_dim().begin() + 4);
  }
  if (dims.empty()) {
    in->how = "NetParameter.input without a shape";
    return Status::Ok();
  }
  if (dims.size() != 4) {
    return InvalidArgument("{}: input_shape of '{}' has {} dims; the engine's input is N×C×H×W", source, net.input(0),
                           dims.size());
  }
  in->c = static_cast<int>(dims[1]);
  in->h = static_cast<int>(dims[2]);
  in->w = static_cast<int>(dims[3]);
  in->c_fixed = in->hw_fixed = true;
  in->how =
      fmt::format("the net's input '{}' ({})", net.input(0), net.input_shape_size() > 0 ? "input_shape" : "input_dim");
  return Status::Ok();
}

// Combines what the prototxt fixed with --input.
Status ResolveInput(const std::string& source, const ImportOptions& opt, bool has_input, InputSize* in,
                    std::vector<std::string>* notes) {
  const bool given = opt.input_channels > 0;
  const std::string given_text = fmt::format("--input {}x{}x{}", opt.input_channels, opt.input_height, opt.input_width);
  if (!given) {
    if (!has_input) {
      return InvalidArgument(
          "{}: the net has no input layer (Data, ImageData, Input) nor NetParameter.input: pass "
          "--input CxHxW; the blobs 'data' and 'label' are then the inputs",
          source);
    }
    if (!in->hw_fixed) {
      return InvalidArgument(
          "{}: {} layer '{}' does not fix the input size (no transform_param crop_size{}): pass "
          "--input CxHxW (e.g. --input 1x28x28 for MNIST, --input 3x32x32 for CIFAR-10)",
          source, in->type, in->layer, in->type == "Input" ? ", no input_param shape" : "");
    }
    if (in->c <= 0 || in->h <= 0 || in->w <= 0) {
      return InvalidArgument("{}: {} '{}' gives the input size {}x{}x{}; every dimension must be positive", source,
                             in->type, in->layer, in->c, in->h, in->w);
    }
    return Status::Ok();
  }
  if (in->hw_fixed && (in->h != opt.input_height || in->w != opt.input_width)) {
    return InvalidArgument("{}: {} disagrees with {} ({}x{})", source, given_text, in->how, in->h, in->w);
  }
  if (in->c_fixed && in->c != opt.input_channels) {
    return InvalidArgument("{}: {} disagrees with {} ({} channels)", source, given_text, in->how, in->c);
  }
  if (!has_input) notes->push_back("no input layer: the blobs 'data' and 'label' are the net's inputs (--input)");
  in->c = opt.input_channels;
  in->h = opt.input_height;
  in->w = opt.input_width;
  in->how = in->hw_fixed ? fmt::format("{} (agrees with {})", given_text, in->how) : given_text;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// The whole import.

class Importer {
 public:
  Importer(const std::string& source, const ImportOptions& options) : source_(source), options_(options) {
    state_.phase = options.phase == CaffePhase::kTrain ? ::caffe::TRAIN : ::caffe::TEST;
  }

  Status Run(const std::string& text, Import* out) {
    DP_RETURN_IF_ERROR(ParseNet(text, source_, &parsed_));
    if (parsed_.net.has_state()) {
      state_.level = parsed_.net.state().level();
      state_.stages.insert(parsed_.net.state().stage().begin(), parsed_.net.state().stage().end());
    }
    for (const std::string& w : parsed_.ignored) notes_.push_back("ignored (outside the supported subset): " + w);
    DP_RETURN_IF_ERROR(SelectLayers());
    DP_RETURN_IF_ERROR(FindInput());
    DP_RETURN_IF_ERROR(ConvertLayers());
    DP_RETURN_IF_ERROR(ResolveInput(source_, options_, has_input_, &input_, &notes_));
    std::string toml = Header() + body_;
    Import result;
    Status s = engine::ParseNetSpecString(toml, source_, &result.spec);
    if (s.ok()) s = engine::InferShapes(result.spec, 1, &result.shapes);
    if (!s.ok()) return Status(s.code(), "the imported model does not build: " + s.message());
    result.toml = std::move(toml);
    result.notes = std::move(notes_);
    *out = std::move(result);
    return Status::Ok();
  }

 private:
  // Layers of the chosen phase, plus Accuracy layers of the other one (see the header).
  Status SelectLayers() {
    std::set<std::string> names;
    for (size_t i = 0; i < parsed_.layers.size(); ++i) {
      const LayerParameter& l = parsed_.layers[i];
      const LayerWhere where = Where(source_, parsed_.lines[i], static_cast<int>(i), l);
      if (l.include_size() > 0 && l.exclude_size() > 0) {
        return InvalidArgument("{}: has both include and exclude rules; Caffe allows one kind only", where.text);
      }
      if (Included(state_, l)) {
        selected_.push_back(i);
        names.insert(l.name());
      }
    }
    // Accuracy layers of the other phase, unless one of the same name is in already.
    std::vector<size_t> all;
    for (size_t i = 0; i < parsed_.layers.size(); ++i) {
      const LayerParameter& l = parsed_.layers[i];
      const bool chosen = std::find(selected_.begin(), selected_.end(), i) != selected_.end();
      if (chosen) {
        all.push_back(i);
      } else if (l.type() == "Accuracy" && !names.count(l.name())) {
        all.push_back(i);
        extra_accuracy_.insert(i);
        names.insert(l.name());
      }
    }
    selected_ = std::move(all);
    return Status::Ok();
  }

  Status FindInput() {
    const size_t none = parsed_.layers.size();
    size_t input_layer = none;
    for (size_t i : selected_) {
      const LayerParameter& l = parsed_.layers[i];
      if (!IsInputType(l.type())) continue;
      if (input_layer != none) {
        return InvalidArgument("{}: a second input layer in phase {} (the first is '{}'); the engine has one input",
                               Where(source_, parsed_.lines[i], static_cast<int>(i), l).text, PhaseName(state_.phase),
                               parsed_.layers[input_layer].name());
      }
      input_layer = i;
    }
    if (parsed_.net.input_size() > 0) {
      if (input_layer != none) {
        return InvalidArgument("{}: has both NetParameter.input '{}' and input layer '{}'", source_,
                               parsed_.net.input(0), parsed_.layers[input_layer].name());
      }
      if (parsed_.net.input_size() > 2) {
        return InvalidArgument("{}: {} NetParameter.input blobs; the engine has one image input and its label", source_,
                               parsed_.net.input_size());
      }
      DP_RETURN_IF_ERROR(InputFromNetFields(parsed_.net, source_, &input_));
      blobs_[parsed_.net.input(0)] = "data";
      if (parsed_.net.input_size() > 1) blobs_[parsed_.net.input(1)] = "label";
      has_input_ = true;
    } else if (input_layer != none) {
      const LayerParameter& l = parsed_.layers[input_layer];
      DP_RETURN_IF_ERROR(
          InputFromLayer(l, Where(source_, parsed_.lines[input_layer], static_cast<int>(input_layer), l), &input_));
      has_input_ = true;
    } else {
      blobs_["data"] = "data";
      blobs_["label"] = "label";
    }
    return Status::Ok();
  }

  // A name for a new top that no earlier layer produced.
  std::string Unique(const std::string& want) {
    std::string name = want;
    for (int n = 2; produced_.count(name); ++n) name = fmt::format("{}_{}", want, n);
    produced_.insert(name);
    return name;
  }

  Status ConvertLayers() {
    produced_ = {"data", "label"};
    bool has_loss = false;
    for (size_t i : selected_) has_loss = has_loss || parsed_.layers[i].type() == "SoftmaxWithLoss";
    std::map<std::string, std::string> param_owners;
    std::map<std::string, std::string> softmax_tops;  // our blob → Softmax layer (must stay unread)
    for (size_t i : selected_) {
      const LayerParameter& l = parsed_.layers[i];
      const LayerWhere where = Where(source_, parsed_.lines[i], static_cast<int>(i), l);
      const std::string& type = l.type();
      if (type.empty()) return InvalidArgument("{}: has no type", where.text);
      if (IsInputType(type)) {
        DP_RETURN_IF_ERROR(InputTops(l, where));
        continue;
      }
      const engine::ActivationRow* activation = engine::FindActivation(type);
      const engine::LayerTypeRow* table_row = TableRow(type);
      if (!kConvertible.count(type) && activation == nullptr && table_row == nullptr) {
        return InvalidArgument("{}: layer type '{}' is not supported by the downpour engine (supported: {})",
                               where.text, type, SupportedTypes());
      }
      DP_RETURN_IF_ERROR(CommonChecks(l, where, &param_owners));
      // Bottoms, through the renames so far.
      std::vector<std::string> bottoms;
      for (const std::string& b : l.bottom()) {
        auto it = blobs_.find(b);
        if (it == blobs_.end()) {
          if (extra_accuracy_.count(i)) break;
          return InvalidArgument("{}: bottom '{}' is not produced by an earlier layer of phase {}", where.text, b,
                                 PhaseName(state_.phase));
        }
        if (softmax_tops.count(it->second)) {
          return InvalidArgument(
              "{}: reads '{}', the output of Softmax layer '{}'; the engine turns a Softmax into "
              "the loss, so nothing may read it",
              where.text, b, softmax_tops[it->second]);
        }
        bottoms.push_back(it->second);
      }
      if (extra_accuracy_.count(i)) {
        if (bottoms.size() != static_cast<size_t>(l.bottom_size())) {
          notes_.push_back(
              fmt::format("dropped Accuracy layer '{}' of the other phase: its bottoms are not in phase {}", l.name(),
                          PhaseName(state_.phase)));
          continue;
        }
        notes_.push_back(
            fmt::format("kept Accuracy layer '{}' although its rules leave it out of phase {}: "
                        "downpour evaluates with the same net it trains",
                        l.name(), PhaseName(state_.phase)));
      }
      TomlLayer t;
      std::string our_type = type;
      Status s;
      if (activation != nullptr)
        s = ActivationToml(l, *activation, where, &t);
      else if (table_row != nullptr)
        s = TableRowToml(l, *table_row, where, &t);
      else if (type == "Convolution")
        s = ConvolutionToml(l, where, &t);
      else if (type == "InnerProduct")
        s = InnerProductToml(l, where, &t);
      else if (type == "Pooling")
        s = PoolingToml(l, where, &t);
      else if (type == "LRN")
        s = LrnToml(l, where, &t);
      else if (type == "SoftmaxWithLoss")
        s = LossToml(l, where, &t);
      else if (type == "Accuracy")
        s = AccuracyToml(l, where, &t);
      else if (type == "Softmax") {
        if (has_loss) {
          return InvalidArgument(
              "{}: a Softmax beside a SoftmaxWithLoss is not supported (the engine has one "
              "output head)",
              where.text);
        }
        if (l.softmax_param().axis() != 1) {
          return InvalidArgument("{}: softmax_param.axis = {}: only axis 1 is supported", where.text,
                                 l.softmax_param().axis());
        }
        our_type = "SoftmaxWithLoss";
        bottoms.resize(std::min<size_t>(bottoms.size(), 1));
        bottoms.push_back("label");
        notes_.push_back(
            fmt::format("Softmax layer '{}' (a deploy net's output) became a SoftmaxWithLoss over its "
                        "scores and 'label': the engine trains with it and evaluates from the scores",
                        l.name()));
      } else {
        DP_CHECK(false && "kConvertible lists a type with no conversion");
      }
      DP_RETURN_IF_ERROR(s);
      const bool learnable = type == "Convolution" || type == "InnerProduct" ||
                             (table_row != nullptr && (table_row->groups & engine::kSlopeKeys));
      if (l.param_size() > 0 && !learnable) {
        return InvalidArgument("{}: {} param {{ }} entries for a layer without parameters", where.text, l.param_size());
      }
      std::vector<std::string> tops;
      for (const std::string& top : l.top()) {
        const bool in_place = std::find(l.bottom().begin(), l.bottom().end(), top) != l.bottom().end();
        if (!in_place && blobs_.count(top)) {
          return InvalidArgument(
              "{}: top '{}' is already produced by an earlier layer (and this is not an in-place "
              "layer)",
              where.text, top);
        }
        const std::string ours = Unique(in_place ? l.name() : top);
        if (in_place) {
          notes_.push_back(fmt::format("in-place layer '{}': its top '{}' is renamed '{}'", l.name(), top, ours));
        } else if (ours != top) {
          notes_.push_back(
              fmt::format("layer '{}': top '{}' is renamed '{}' (the name was taken)", l.name(), top, ours));
        }
        blobs_[top] = ours;
        tops.push_back(ours);
        if (type == "Softmax") softmax_tops[ours] = l.name();
      }
      std::string text = "\n[[layer]]\n";
      text += "name = " + TomlString(l.name()) + "\n";
      text += "type = " + TomlString(our_type) + "\n";
      text += "bottom = " + TomlStringList(bottoms) + "\n";
      text += "top = " + TomlStringList(tops) + "\n";
      body_ += text + t.text;
    }
    return Status::Ok();
  }

  // The input layer's tops become the engine's "data" and "label".
  Status InputTops(const LayerParameter& l, const LayerWhere& where) {
    if (l.top_size() == 0 || l.top_size() > 2) {
      return InvalidArgument("{}: has {} tops; an input layer gives the image blob and optionally the label",
                             where.text, l.top_size());
    }
    blobs_[l.top(0)] = "data";
    if (l.top_size() > 1) blobs_[l.top(1)] = "label";
    if (l.top(0) != "data" || (l.top_size() > 1 && l.top(1) != "label")) {
      notes_.push_back(fmt::format("input layer '{}': its tops are the engine's 'data'{}", l.name(),
                                   l.top_size() > 1 ? " and 'label'" : ""));
    }
    return Status::Ok();
  }

  // The train Data layer's preprocessing as run-config keys (comments).
  std::string DataComments() const {
    NetState train = state_;
    train.phase = ::caffe::TRAIN;
    NetState test = state_;
    test.phase = ::caffe::TEST;
    const LayerParameter* train_layer = nullptr;
    const LayerParameter* test_layer = nullptr;
    for (const LayerParameter& l : parsed_.layers) {
      if (l.type() != "Data" && l.type() != "ImageData") continue;
      if (train_layer == nullptr && Included(train, l)) train_layer = &l;
      if (test_layer == nullptr && Included(test, l)) test_layer = &l;
    }
    const LayerParameter* l = train_layer != nullptr ? train_layer : test_layer;
    if (l == nullptr) return "";
    const Transform t = TransformOf(*l);
    std::string c = fmt::format(
        "#\n# Caffe's {} {} layer '{}' preprocessed the images. The run-config keys that do the same\n"
        "# (common/run_config.h):\n#   [data]\n",
        train_layer != nullptr ? "train" : "test", l->type(), CommentSafe(l->name()));
    auto source_of = [](const LayerParameter* layer) {
      return layer->type() == "Data" ? layer->data_param().source() : layer->image_data_param().source();
    };
    if (train_layer != nullptr && !source_of(train_layer).empty()) {
      c += fmt::format("#   train = {}   # data_param.source (convert it with downpour-data)\n",
                       CommentSafe(TomlString(source_of(train_layer))));
    }
    if (test_layer != nullptr && !source_of(test_layer).empty()) {
      c += fmt::format("#   test = {}   # the test layer's source\n", CommentSafe(TomlString(source_of(test_layer))));
    }
    c += fmt::format("#   crop = {}   # data.crop: transform_param.crop_size{}\n", t.crop,
                     t.crop == 0 ? " (0 = no crop)" : "");
    c += fmt::format("#   mirror = {}   # data.mirror\n", t.mirror ? "true" : "false");
    if (!t.mean_file.empty()) {
      c += fmt::format("#   mean_file = {}   # data.mean_file (a Caffe .binaryproto is read as it is)\n",
                       CommentSafe(TomlString(t.mean_file)));
    }
    if (!t.mean_values.empty()) {
      std::vector<std::string> values;
      for (float v : t.mean_values) values.push_back(TomlFloat(v));
      c += fmt::format("#   mean_values = [{}]   # data.mean_values (transform_param.mean_value)\n",
                       fmt::join(values, ", "));
    }
    c += fmt::format("#   scale = {}   # data.scale (Caffe's default is 1; downpour's is 0.00390625)\n",
                     TomlFloat(t.scale));
    const uint32_t batch = l->type() == "Data" ? l->data_param().batch_size() : l->image_data_param().batch_size();
    if (train_layer != nullptr && batch > 0) {
      c += fmt::format("#   [worker]\n#   batch_size = {}   # data_param.batch_size (per worker in downpour)\n", batch);
    }
    return c;
  }

  std::string Header() const {
    const std::string name =
        !parsed_.net.name().empty() ? parsed_.net.name() : std::filesystem::path(source_).stem().string();
    std::string h =
        fmt::format("# Imported from the Caffe prototxt {} by downpour-caffe import-prototxt\n", CommentSafe(source_));
    h += fmt::format("# (net '{}', phase {}). Model config format: client/engine/net_spec.h.\n",
                     CommentSafe(parsed_.net.name()), PhaseName(state_.phase));
    h += fmt::format("# Input {}x{}x{}: {}.\n", input_.c, input_.h, input_.w, CommentSafe(input_.how));
    if (!notes_.empty()) {
      h += "# Notes:\n";
      for (const std::string& n : notes_) h += "#   " + CommentSafe(n) + "\n";
    }
    h += DataComments();
    h += "\nname = " + TomlString(name) + "\n\n[input]\n";
    h += fmt::format("channels = {}\nheight = {}\nwidth = {}\n", input_.c, input_.h, input_.w);
    return h;
  }

  const std::string source_;
  const ImportOptions options_;
  NetState state_;
  ParsedNet parsed_;
  std::vector<size_t> selected_;     // indices into parsed_.layers, in order
  std::set<size_t> extra_accuracy_;  // Accuracy layers kept from the other phase
  InputSize input_;
  bool has_input_ = false;
  std::map<std::string, std::string> blobs_;  // Caffe blob name → our blob name (latest)
  std::set<std::string> produced_;            // our blob names so far
  std::string body_;                          // the [[layer]] tables
  std::vector<std::string> notes_;
};

bool ParseDim(std::string_view text, int* out) {
  if (text.empty() || text.size() > 6) return false;
  int v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return v > 0;
}

}  // namespace

Status ParseInputSize(std::string_view text, ImportOptions* options) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == 'x' || text[i] == 'X') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  int c = 0, h = 0, w = 0;
  if (parts.size() != 3 || !ParseDim(parts[0], &c) || !ParseDim(parts[1], &h) || !ParseDim(parts[2], &w)) {
    return InvalidArgument("--input '{}': expected CxHxW with positive integers, e.g. 3x227x227", text);
  }
  options->input_channels = c;
  options->input_height = h;
  options->input_width = w;
  return Status::Ok();
}

Status ParsePhase(std::string_view text, ImportOptions* options) {
  if (text == "train")
    options->phase = CaffePhase::kTrain;
  else if (text == "test")
    options->phase = CaffePhase::kTest;
  else
    return InvalidArgument("--phase '{}': expected train or test", text);
  return Status::Ok();
}

Status ImportPrototxtText(const std::string& text, const std::string& source, const ImportOptions& options,
                          Import* out) {
  Importer importer(source, options);
  return importer.Run(text, out);
}

Status ImportPrototxtFile(const std::string& path, const ImportOptions& options, Import* out) {
  std::string text;
  DP_RETURN_IF_ERROR(ReadWholeFile(path, "prototxt", &text));
  return ImportPrototxtText(text, path, options, out);
}

}  // namespace downpour::caffe_io
