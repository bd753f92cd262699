// weights_io.cc — see weights_io.h.
#include "client/caffe/weights_io.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

namespace downpour::caffe_io {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) { return fmt::format("({})", fmt::join(shape, ",")); }

std::string BlobRole(size_t b) { return b == 0 ? "weight" : b == 1 ? "bias" : fmt::format("#{}", b); }

// Caffe's Blob::ShapeEquals: a new-style blob must match exactly; a legacy 4-D one matches the
// shape padded on the left with 1s to four axes.
bool ShapeMatches(const CaffeBlob& blob, const std::vector<int64_t>& want) {
  if (!blob.legacy_shape) return blob.shape == want;
  if (want.size() > 4) return false;
  std::vector<int64_t> padded(4 - want.size(), 1);
  padded.insert(padded.end(), want.begin(), want.end());
  return blob.shape == padded;
}

// "fc8 (2 blobs), conv9 (1 blob)".
std::string LayerList(const std::vector<const CaffeLayer*>& layers) {
  std::vector<std::string> parts;
  for (const CaffeLayer* l : layers) {
    parts.push_back(fmt::format("{} ({} blob{})", l->name, l->blobs.size(), l->blobs.size() == 1 ? "" : "s"));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Index of each model layer by name.
std::map<std::string, size_t> LayerIndex(const engine::NetSpec& spec) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < spec.layers.size(); ++i) index.emplace(spec.layers[i].name, i);
  return index;
}

const std::vector<int>& ParamsOf(const engine::NetShapes& shapes, size_t layer) {
  static const std::vector<int> kNone;
  return layer < shapes.layer_params.size() ? shapes.layer_params[layer] : kNone;
}

// Copies the tensors in `tensors` (names of net params, shapes already checked) into the net.
void Apply(const std::vector<NamedTensor>& tensors, engine::Net* net) {
  const auto& specs = net->param_specs();
  for (const NamedTensor& t : tensors) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name != t.name) continue;
      std::span<float> dst = net->param(static_cast<int>(i));
      DP_CHECK_EQ(dst.size(), t.data.size());
      std::copy(t.data.begin(), t.data.end(), dst.begin());
    }
  }
}

// Checks a downpour tensor file against the net's params; fills `tensors` with what to load.
Status MatchTensorFile(const TensorFile& file, const std::string& path, const engine::Net& net,
                       const WeightsPolicy& policy, std::vector<NamedTensor>* tensors, WeightsReport* report) {
  const auto& specs = net.param_specs();
  std::set<std::string> names;
  for (const TensorSpec& s : specs) names.insert(s.name);
  std::vector<std::string> extra, missing;
  for (const NamedTensor& t : file.tensors) {
    if (!names.count(t.name)) extra.push_back(t.name);
  }
  if (!extra.empty() && !policy.ignore_extra) {
    return InvalidArgument("{}: tensors {} are not parameters of model '{}' (ignore_extra skips them)", path,
                           fmt::join(extra, ", "), net.spec().name);
  }
  for (const TensorSpec& s : specs) {
    const NamedTensor* t = FindTensor(file, s.name);
    if (t == nullptr) {
      missing.push_back(s.name);
      continue;
    }
    if (t->shape != s.shape) {
      return InvalidArgument("{}: tensor '{}' has shape {} in the file but {} in model '{}'", path, s.name,
                             ShapeText(t->shape), ShapeText(s.shape), net.spec().name);
    }
  }
  if (!missing.empty() && !policy.keep_missing) {
    return NotFound("{}: tensors {} of model '{}' are missing from the file (keep_missing leaves them as they are)",
                    path, fmt::join(missing, ", "), net.spec().name);
  }
  tensors->clear();
  for (const TensorSpec& s : specs) {
    if (const NamedTensor* t = FindTensor(file, s.name)) tensors->push_back(*t);
  }
  if (report != nullptr) {
    report->skipped = std::move(extra);
    report->kept = std::move(missing);
  }
  return Status::Ok();
}

// True when the file at `path` starts with the tensor file magic "DPTF".
Status HasTensorFileMagic(const std::string& path, bool* is_tensor_file) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("{}: no such weights file", path);
    return IoError("{}: cannot open weights file: {}", path, std::strerror(errno));
  }
  char magic[4] = {};
  const ssize_t n = ::read(fd, magic, sizeof(magic));
  ::close(fd);
  const uint32_t expected = kTensorFileMagic;
  *is_tensor_file = n == 4 && std::memcmp(magic, &expected, 4) == 0;
  return Status::Ok();
}

}  // namespace

Status CaffeToTensors(const CaffeNet& caffe, const std::string& source, const engine::NetSpec& spec,
                      const engine::NetShapes& shapes, const WeightsPolicy& policy, std::vector<NamedTensor>* tensors,
                      WeightsReport* report) {
  const std::map<std::string, size_t> model_layers = LayerIndex(spec);
  // The file's layers that carry weights, by name.
  std::map<std::string, const CaffeLayer*> file_layers;
  std::vector<const CaffeLayer*> extra;
  for (const CaffeLayer& layer : caffe.layers) {
    if (layer.blobs.empty()) continue;  // data, ReLU, loss layers: nothing to copy
    if (!file_layers.emplace(layer.name, &layer).second) {
      return Corrupt("{}: two layers named '{}' carry weights; which one is meant is ambiguous", source, layer.name);
    }
    if (!model_layers.count(layer.name)) extra.push_back(&layer);
  }
  if (file_layers.empty()) {
    return InvalidArgument("{}: holds no layer with weights ({} layers, none with blobs): not a trained .caffemodel",
                           source, caffe.layers.size());
  }
  if (!extra.empty() && !policy.ignore_extra) {
    return InvalidArgument(
        "{}: layers with weights that model '{}' does not have: {} (Caffe's fine-tuning ignores them: "
        "ignore_extra / --ignore-extra)",
        source, spec.name, LayerList(extra));
  }
  std::vector<std::string> missing;
  std::vector<NamedTensor> out;
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const std::vector<int>& params = ParamsOf(shapes, li);
    if (params.empty()) continue;
    const engine::LayerSpec& ml = spec.layers[li];
    auto it = file_layers.find(ml.name);
    if (it == file_layers.end()) {
      for (int p : params) missing.push_back(shapes.params[p].name);
      continue;
    }
    const CaffeLayer& fl = *it->second;
    if (fl.blobs.size() != params.size()) {
      std::vector<std::string> names;
      for (int p : params) names.push_back(shapes.params[p].name);
      return InvalidArgument("{}: layer '{}' has {} blob(s) in the file but {} tensor(s) ({}) in model '{}'{}", source,
                             ml.name, fl.blobs.size(), params.size(), fmt::join(names, ", "), spec.name,
                             fl.blobs.size() + 1 == params.size() ? " (bias_term differs?)" : "");
    }
    for (size_t b = 0; b < params.size(); ++b) {
      const TensorSpec& ts = shapes.params[params[b]];
      const CaffeBlob& blob = fl.blobs[b];
      if (!ShapeMatches(blob, ts.shape)) {
        return InvalidArgument("{}: layer '{}' blob {} ({}) has shape {}{} in the file but model '{}' needs {} ({})",
                               source, ml.name, b, BlobRole(b), ShapeText(blob.shape),
                               blob.legacy_shape ? " (legacy num/channels/height/width)" : "", spec.name,
                               ShapeText(ts.shape), ts.name);
      }
      out.push_back(NamedTensor{ts.name, ts.shape, blob.data});
    }
  }
  if (!missing.empty() && !policy.keep_missing) {
    return NotFound(
        "{}: model '{}' tensors {} have no weights in the file (Caffe's fine-tuning leaves them at their fillers: "
        "keep_missing / --keep-missing)",
        source, spec.name, fmt::join(missing, ", "));
  }
  *tensors = std::move(out);
  if (report != nullptr) {
    report->skipped.clear();
    for (const CaffeLayer* l : extra) report->skipped.push_back(l->name);
    report->kept = std::move(missing);
  }
  return Status::Ok();
}

Status TensorsToCaffe(const TensorFile& file, const std::string& source, const engine::NetSpec& spec,
                      const engine::NetShapes& shapes, CaffeNet* out) {
  std::set<std::string> names;
  for (const TensorSpec& s : shapes.params) names.insert(s.name);
  for (const NamedTensor& t : file.tensors) {
    if (!names.count(t.name)) {
      return InvalidArgument("{}: tensor '{}' is not a parameter of model '{}'", source, t.name, spec.name);
    }
  }
  CaffeNet net;
  net.name = spec.name;
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const engine::LayerSpec& ml = spec.layers[li];
    CaffeLayer layer;
    layer.name = ml.name;
    layer.type = engine::TypeNameOf(ml);
    layer.bottoms = ml.bottoms;
    layer.tops = ml.tops;
    for (int p : ParamsOf(shapes, li)) {
      const TensorSpec& ts = shapes.params[p];
      const NamedTensor* t = FindTensor(file, ts.name);
      if (t == nullptr) {
        return NotFound("{}: tensor '{}' (layer '{}') of model '{}' is missing from the file", source, ts.name, ml.name,
                        spec.name);
      }
      if (t->shape != ts.shape) {
        return InvalidArgument("{}: tensor '{}' (layer '{}') has shape {} in the file but {} in model '{}'", source,
                               ts.name, ml.name, ShapeText(t->shape), ShapeText(ts.shape), spec.name);
      }
      layer.blobs.push_back(CaffeBlob{ts.shape, false, t->data});
    }
    net.layers.push_back(std::move(layer));
  }
  *out = std::move(net);
  return Status::Ok();
}

Status LoadWeightsFile(const std::string& path, engine::Net* net, const WeightsPolicy& policy, WeightsReport* report) {
  bool is_tensor_file = false;
  DP_RETURN_IF_ERROR(HasTensorFileMagic(path, &is_tensor_file));
  std::vector<NamedTensor> tensors;
  WeightsReport local;
  if (is_tensor_file) {
    TensorFile file;
    DP_RETURN_IF_ERROR(ReadTensorFile(path, &file));
    DP_RETURN_IF_ERROR(MatchTensorFile(file, path, *net, policy, &tensors, &local));
  } else {
    CaffeNet caffe;
    DP_RETURN_IF_ERROR(ReadCaffemodel(path, &caffe));
    DP_RETURN_IF_ERROR(CaffeToTensors(caffe, path, net->spec(), net->shapes(), policy, &tensors, &local));
  }
  Apply(tensors, net);  // everything is checked: from here on nothing fails
  if (report != nullptr) *report = std::move(local);
  return Status::Ok();
}

}  // namespace downpour::caffe_io
