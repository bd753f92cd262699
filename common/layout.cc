// layout.cc — see layout.h.
#include "common/layout.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace downpour {
namespace {

// FNV-1a, 64 bit: stable across processes, compilers and runs (std::hash is not).
class Fnv64 {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 1099511628211ull;
    }
  }
  void I64(int64_t v) { Bytes(&v, sizeof(v)); }
  void Str(const std::string& s) {
    I64(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace

Status ParamLayout::Build(std::vector<TensorSpec> specs, int servers, int64_t chunk_elems,
                          ParamLayout* out) {
  if (servers < 1) return InvalidArgument("layout: servers must be >= 1, got {}", servers);
  if (chunk_elems < 1) return InvalidArgument("layout: chunk_elems must be >= 1, got {}", chunk_elems);
  std::set<std::string> names;
  for (const auto& s : specs) {
    if (s.shape.empty()) return InvalidArgument("layout: tensor '{}' has an empty shape", s.name);
    for (int64_t d : s.shape) {
      if (d < 1) return InvalidArgument("layout: tensor '{}' has dimension {} < 1", s.name, d);
    }
    if (!names.insert(s.name).second) {
      return InvalidArgument("layout: duplicate tensor name '{}'", s.name);
    }
  }
  ParamLayout l;
  l.tensors_ = std::move(specs);
  l.servers_ = servers;
  l.chunk_elems_ = chunk_elems;
  l.tensor_offsets_.push_back(0);
  for (const auto& s : l.tensors_) l.tensor_offsets_.push_back(l.tensor_offsets_.back() + s.numel());
  l.total_elems_ = l.tensor_offsets_.back();
  if (l.total_elems_ < servers) {
    return InvalidArgument("layout: {} floats cannot be dealt to {} servers", l.total_elems_, servers);
  }
  // Server s owns flat [s*N/S, (s+1)*N/S): sizes differ by at most one float.
  const int64_t n = l.total_elems_;
  auto server_begin = [&](int s) { return static_cast<int64_t>((__int128)n * s / servers); };
  l.server_chunks_.resize(static_cast<size_t>(servers));
  size_t t = 0;
  for (int s = 0; s < servers; ++s) {
    int64_t pos = server_begin(s);
    const int64_t end = server_begin(s + 1);
    while (pos < end) {
      while (l.tensor_offsets_[t + 1] <= pos) ++t;
      // Segment = the part of tensor t inside this server's range; cut it into equal-ish pieces
      // of at most chunk_elems (equal pieces keep frame sizes uniform).
      const int64_t seg_end = std::min(end, l.tensor_offsets_[t + 1]);
      const int64_t seg_len = seg_end - pos;
      const int64_t pieces = (seg_len + chunk_elems - 1) / chunk_elems;
      for (int64_t i = 0; i < pieces; ++i) {
        const int64_t b = pos + seg_len * i / pieces;
        const int64_t e = pos + seg_len * (i + 1) / pieces;
        Chunk c;
        c.id = static_cast<int32_t>(l.chunks_.size());
        c.tensor = static_cast<int32_t>(t);
        c.tensor_offset = b - l.tensor_offsets_[t];
        c.flat_offset = b;
        c.count = e - b;
        c.server = s;
        l.chunks_.push_back(c);
        l.server_chunks_[static_cast<size_t>(s)].push_back(c.id);
      }
      pos = seg_end;
    }
  }
  Fnv64 h;
  h.I64(servers);
  h.I64(chunk_elems);
  h.I64(static_cast<int64_t>(l.tensors_.size()));
  for (const auto& s : l.tensors_) {
    h.Str(s.name);
    h.I64(static_cast<int64_t>(s.shape.size()));
    for (int64_t d : s.shape) h.I64(d);
  }
  for (const auto& c : l.chunks_) {
    h.I64(c.tensor);
    h.I64(c.tensor_offset);
    h.I64(c.count);
    h.I64(c.server);
  }
  l.hash_ = h.value();
  *out = std::move(l);
  return Status::Ok();
}

uint64_t CombinedLayoutHash(std::span<const ParamLayout> layouts) {
  if (layouts.size() == 1) return layouts[0].hash();
  Fnv64 h;
  h.Str("models");
  h.I64(static_cast<int64_t>(layouts.size()));
  for (const ParamLayout& l : layouts) h.I64(static_cast<int64_t>(l.hash()));
  return h.value();
}

int64_t ParamLayout::ServerElems(int s) const {
  int64_t n = 0;
  for (int32_t id : ServerChunks(s)) n += chunk(id).count;
  return n;
}

std::vector<int32_t> ParamLayout::ChunksInRange(int64_t begin, int64_t end) const {
  std::vector<int32_t> ids;
  // First chunk whose end is past `begin` (chunks are sorted by flat offset).
  auto it = std::partition_point(chunks_.begin(), chunks_.end(), [&](const Chunk& c) {
    return c.flat_offset + c.count <= begin;
  });
  for (; it != chunks_.end() && it->flat_offset < end; ++it) ids.push_back(it->id);
  return ids;
}

int64_t FactorWireFloats(const ParamLayout& layout, int tensor, int64_t batch, int* servers) {
  const TensorSpec& t = layout.tensors()[static_cast<size_t>(tensor)];
  DP_CHECK(t.shape.size() >= 2);
  const int64_t in = t.numel() / t.shape[0], begin = layout.tensor_flat_offset(tensor);
  int64_t floats = 0;
  int last_server = -1, holders = 0;  // chunks ascend by flat offset, so a tensor's servers ascend too
  for (int32_t id : layout.ChunksInRange(begin, begin + t.numel())) {
    const Chunk& c = layout.chunk(id);
    floats += batch * RowsOf(c, in).rows;
    if (c.server != last_server) {
      floats += batch * in;
      ++holders;
    }
    last_server = c.server;
  }
  if (servers != nullptr) *servers = holders;
  return floats;
}

std::vector<RowSpan> FactorRowBlocks(const ParamLayout& layout, int tensor) {
  const TensorSpec& t = layout.tensors()[static_cast<size_t>(tensor)];
  DP_CHECK(t.shape.size() >= 2);
  const int64_t in = t.numel() / t.shape[0], begin = layout.tensor_flat_offset(tensor);
  std::vector<RowSpan> blocks;
  for (int32_t id : layout.ChunksInRange(begin, begin + t.numel())) blocks.push_back(RowsOf(layout.chunk(id), in));
  return blocks;
}

int64_t PackedRows(std::span<const RowSpan> blocks) {
  int64_t rows = 0;
  for (const RowSpan& b : blocks) rows += b.rows;
  return rows;
}

void PackRowBlocks(const float* src, int64_t batch, int64_t width, std::span<const RowSpan> blocks, float* dst) {
  for (const RowSpan& k : blocks) {
    DP_CHECK(k.first >= 0 && k.rows >= 0 && k.first + k.rows <= width);
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(dst + b * k.rows, src + b * width + k.first, static_cast<size_t>(k.rows) * sizeof(float));
    dst += batch * k.rows;
  }
}

int ParamLayout::TensorIndex(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<TensorSpec> AlexNetTensorSpecs() {
  auto w = [](std::string name, std::vector<int64_t> shape) {
    return TensorSpec{std::move(name), std::move(shape), 1.0f, 1.0f};
  };
  auto b = [](std::string name, int64_t n) { return TensorSpec{std::move(name), {n}, 2.0f, 0.0f}; };
  return {w("conv1.weight", {96, 3, 11, 11}),  b("conv1.bias", 96),
          w("conv2.weight", {256, 48, 5, 5}),  b("conv2.bias", 256),
          w("conv3.weight", {384, 256, 3, 3}), b("conv3.bias", 384),
          w("conv4.weight", {384, 192, 3, 3}), b("conv4.bias", 384),
          w("conv5.weight", {256, 192, 3, 3}), b("conv5.bias", 256),
          w("fc6.weight", {4096, 9216}),       b("fc6.bias", 4096),
          w("fc7.weight", {4096, 4096}),       b("fc7.bias", 4096),
          w("fc8.weight", {1000, 4096}),       b("fc8.bias", 1000)};
}

Status ParseTensorList(const std::string& text, const std::string& source_name,
                       std::vector<TensorSpec>* out) {
  std::vector<TensorSpec> specs;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string name, shape;
    if (!(ls >> name)) continue;
    if (!(ls >> shape)) {
      return InvalidArgument("{}:{}: tensor '{}' has no shape (expected e.g. 96x3x11x11)",
                             source_name, line_no, name);
    }
    TensorSpec spec;
    spec.name = name;
    std::istringstream ss(shape);
    std::string dim;
    while (std::getline(ss, dim, 'x')) {
      char* end = nullptr;
      const long long d = std::strtoll(dim.c_str(), &end, 10);
      if (dim.empty() || *end != '\0' || d < 1) {
        return InvalidArgument("{}:{}: tensor '{}': bad dimension '{}' in shape '{}'", source_name,
                               line_no, name, dim, shape);
      }
      spec.shape.push_back(d);
    }
    if (spec.shape.empty()) {
      return InvalidArgument("{}:{}: tensor '{}': empty shape", source_name, line_no, name);
    }
    std::string tok;
    float* mults[2] = {&spec.lr_mult, &spec.decay_mult};
    for (float* m : mults) {
      if (!(ls >> tok)) break;
      char* end = nullptr;
      *m = std::strtof(tok.c_str(), &end);
      if (*end != '\0') {
        return InvalidArgument("{}:{}: tensor '{}': bad multiplier '{}'", source_name, line_no,
                               name, tok);
      }
    }
    if (ls >> tok) {
      return InvalidArgument("{}:{}: tensor '{}': unexpected token '{}'", source_name, line_no,
                             name, tok);
    }
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) return InvalidArgument("{}: no tensors listed", source_name);
  *out = std::move(specs);
  return Status::Ok();
}

Status LoadTensorList(const std::string& path, std::vector<TensorSpec>* out) {
  std::ifstream f(path);
  if (!f) return NotFound("tensor list '{}' cannot be opened", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseTensorList(ss.str(), path, out);
}

}  // namespace downpour

namespace downpour {

Status ResolveTensorList(const std::string& tensors_file, const std::string& model,
                         std::vector<TensorSpec>* out) {
  if (!tensors_file.empty() && !model.empty()) {
    return InvalidArgument("give either --tensors ({}) or --model ({}), not both", tensors_file, model);
  }
  if (!tensors_file.empty()) return LoadTensorList(tensors_file, out);
  if (model == "alexnet-shapes") {
    *out = AlexNetTensorSpecs();
    return Status::Ok();
  }
  if (model.empty()) return InvalidArgument("the model's tensor list is needed: give --tensors <file> or --model alexnet-shapes");
  return InvalidArgument("--model '{}' is not built in (known: alexnet-shapes); use --tensors <file>", model);
}

std::string ModelTensorListPath(const std::string& dir, int model) {
  return (std::filesystem::path(dir) / ("tensors-model-" + std::to_string(model) + ".txt")).string();
}

Status LoadModelTensorLists(const std::string& dir, int models, std::vector<std::vector<TensorSpec>>* out) {
  out->assign(static_cast<size_t>(models), {});
  for (int k = 0; k < models; ++k) {
    DP_RETURN_IF_ERROR(LoadTensorList(ModelTensorListPath(dir, k), &(*out)[static_cast<size_t>(k)]));
  }
  return Status::Ok();
}

}  // namespace downpour
