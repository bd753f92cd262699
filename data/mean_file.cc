// mean_file.cc — mean image over an LMDB, stored as a common tensor file or as Caffe's
// BlobProto (.binaryproto).
#include "data/mean_file.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/file_io.h"
#include "common/tensor_file.h"
#include "data/caffe.pb.h"
#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"

namespace downpour::data {
namespace {

constexpr char kBinaryprotoExtension[] = ".binaryproto";
// Bounds on a mean image's sides (as the tensor-file reader's): larger values mean a wrong
// or corrupt file.
constexpr int64_t kMaxChannels = 64;
constexpr int64_t kMaxSide = 65536;

bool ShapeInBounds(int64_t c, int64_t h, int64_t w) {
  return c > 0 && c <= kMaxChannels && h > 0 && h <= kMaxSide && w > 0 && w <= kMaxSide;
}

Status ReadMeanTensorFile(const std::string& path, MeanImage* out) {
  TensorFile file;
  Status s = ReadTensorFile(path, &file);
  if (!s.ok()) return Status(s.code(), fmt::format("mean file {}: {}", path, s.message()));
  const auto kind = file.meta.find("kind");
  if (kind == file.meta.end() || kind->second != kMeanFileKind) {
    return Corrupt("mean file {}: metadata kind is '{}', expected '{}'", path,
                   kind == file.meta.end() ? "" : kind->second, kMeanFileKind);
  }
  const NamedTensor* t = FindTensor(file, kMeanTensorName);
  if (t == nullptr) return Corrupt("mean file {}: no tensor named '{}'", path, kMeanTensorName);
  if (t->shape.size() != 3 || !ShapeInBounds(t->shape[0], t->shape[1], t->shape[2])) {
    return Corrupt("mean file {}: tensor '{}' has shape [{}], expected [c, h, w]", path, kMeanTensorName,
                   fmt::join(t->shape, ", "));
  }
  MeanImage m;
  m.c = static_cast<int>(t->shape[0]);
  m.h = static_cast<int>(t->shape[1]);
  m.w = static_cast<int>(t->shape[2]);
  m.values = t->data;
  if (auto it = file.meta.find("source"); it != file.meta.end()) m.source = it->second;
  if (auto it = file.meta.find("records"); it != file.meta.end()) m.records = std::atoll(it->second.c_str());
  *out = std::move(m);
  return Status::Ok();
}

// The BlobProto's num x channels x height x width, from `shape` or the legacy fields.
Status BlobShapeOf(const caffe::BlobProto& blob, const std::string& path, int64_t dims[4]) {
  if (blob.has_shape()) {
    const auto& d = blob.shape().dim();
    if (d.size() == 4) {
      for (int i = 0; i < 4; ++i) dims[i] = d[i];
    } else if (d.size() == 3) {  // Blob::ToProto of a 3-axis blob: [c, h, w]
      dims[0] = 1;
      for (int i = 0; i < 3; ++i) dims[i + 1] = d[i];
    } else {
      return Corrupt(
          "mean file {}: Caffe BlobProto shape has {} dims [{}]; a mean image is "
          "[1, channels, height, width]",
          path, d.size(), fmt::join(d, ", "));
    }
    return Status::Ok();
  }
  if (blob.has_num() || blob.has_channels() || blob.has_height() || blob.has_width()) {
    dims[0] = blob.num();
    dims[1] = blob.channels();
    dims[2] = blob.height();
    dims[3] = blob.width();
    return Status::Ok();
  }
  return Corrupt(
      "mean file {}: Caffe BlobProto has no shape (neither shape nor "
      "num/channels/height/width)",
      path);
}

Status ReadMeanBinaryproto(const std::string& path, const std::string& bytes, MeanImage* out) {
  if (bytes.empty()) return Corrupt("mean file {}: empty (0 bytes)", path);
  caffe::BlobProto blob;
  // Arbitrary bytes often parse as a message of unknown fields; a real BlobProto has none.
  if (!blob.ParseFromString(bytes) || !blob.GetReflection()->GetUnknownFields(blob).empty()) {
    return Corrupt(
        "mean file {}: neither a downpour tensor file (no \"DPTF\" magic) nor a "
        "Caffe BlobProto .binaryproto ({} bytes that do not parse as one)",
        path, bytes.size());
  }
  int64_t dims[4] = {};
  DP_RETURN_IF_ERROR(BlobShapeOf(blob, path, dims));
  const int64_t num = dims[0], c = dims[1], h = dims[2], w = dims[3];
  if (num != 1) {
    return Corrupt(
        "mean file {}: Caffe BlobProto has num {} (shape {}x{}x{}x{}); a mean image "
        "has num 1",
        path, num, num, c, h, w);
  }
  if (!ShapeInBounds(c, h, w)) {
    return Corrupt(
        "mean file {}: Caffe BlobProto has channels {}, height {}, width {}; "
        "expected 1..{} channels and sides of 1..{}",
        path, c, h, w, kMaxChannels, kMaxSide);
  }
  const int64_t count = c * h * w;
  const bool as_double = blob.data_size() == 0 && blob.double_data_size() > 0;
  const int64_t have = as_double ? blob.double_data_size() : blob.data_size();
  if (have != count) {
    return Corrupt(
        "mean file {}: Caffe BlobProto holds {} {} values but channels x height x "
        "width = {}x{}x{} = {}",
        path, have, as_double ? "double_data" : "data", c, h, w, count);
  }
  MeanImage m;
  m.c = static_cast<int>(c);
  m.h = static_cast<int>(h);
  m.w = static_cast<int>(w);
  if (as_double) {
    m.values.assign(blob.double_data().begin(), blob.double_data().end());
  } else {
    m.values.assign(blob.data().begin(), blob.data().end());
  }
  *out = std::move(m);
  return Status::Ok();
}

// Our tensor files start with kTensorFileMagic (little-endian: the bytes "DPTF").
bool IsTensorFile(const std::string& path) {
  uint32_t magic = 0;
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(&magic), 4);
  return f.gcount() == 4 && magic == kTensorFileMagic;
}

}  // namespace

Status ComputeMean(const std::string& db_path, MeanImage* out) {
  std::unique_ptr<LmdbEnv> env;
  DP_RETURN_IF_ERROR(LmdbEnv::OpenReadOnly(db_path, &env));
  std::unique_ptr<ReadTxn> txn;
  DP_RETURN_IF_ERROR(ReadTxn::Begin(env.get(), &txn));
  caffe::Datum datum;
  Image scratch;
  std::vector<double> sum;
  MeanImage mean;
  int64_t count = 0;
  bool found = false;
  DP_RETURN_IF_ERROR(txn->First(&found));
  while (found) {
    const std::string where = fmt::format("LMDB {} key {}", db_path, txn->key());
    DP_RETURN_IF_ERROR(ParseDatum(txn->value(), where, &datum));
    ImageView v;
    DP_RETURN_IF_ERROR(ViewDatum(datum, 0, where, &scratch, &v));
    if (count == 0) {
      mean.c = v.c;
      mean.h = v.h;
      mean.w = v.w;
      sum.assign(size_t(v.c) * v.h * v.w, 0.0);
    } else if (v.c != mean.c || v.h != mean.h || v.w != mean.w) {
      return InvalidArgument("{}: shape {}x{}x{} differs from the first record's {}x{}x{}; "
                             "a mean image needs one shape", where, v.c, v.h, v.w, mean.c,
                             mean.h, mean.w);
    }
    size_t i = 0;
    for (int ch = 0; ch < v.c; ++ch)
      for (int y = 0; y < v.h; ++y)
        for (int x = 0; x < v.w; ++x, ++i) {
          const int64_t off = ch * v.channel_stride + y * v.row_stride + x * v.col_stride;
          sum[i] += v.u8 ? double(v.u8[off]) : double(v.f32[off]);
        }
    ++count;
    DP_RETURN_IF_ERROR(txn->Next(&found));
  }
  if (count == 0) return InvalidArgument("LMDB {}: empty, no mean to compute", db_path);
  mean.values.resize(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) mean.values[i] = static_cast<float>(sum[i] / count);
  mean.source = db_path;
  mean.records = count;
  *out = std::move(mean);
  return Status::Ok();
}

Status WriteMeanFile(const MeanImage& mean, const std::string& path) {
  if (path.ends_with(kBinaryprotoExtension)) return WriteMeanBinaryproto(mean, path);
  DP_CHECK_EQ(mean.values.size(), size_t(mean.c) * mean.h * mean.w);
  TensorFile file;
  file.meta["kind"] = kMeanFileKind;
  if (!mean.source.empty()) file.meta["source"] = mean.source;
  if (mean.records > 0) file.meta["records"] = std::to_string(mean.records);
  file.tensors.push_back(NamedTensor{kMeanTensorName, {mean.c, mean.h, mean.w}, mean.values});
  Status s = WriteTensorFile(path, file);
  if (!s.ok()) return Status(s.code(), fmt::format("mean file {}: {}", path, s.message()));
  return Status::Ok();
}

Status WriteMeanBinaryproto(const MeanImage& mean, const std::string& path) {
  DP_CHECK_EQ(mean.values.size(), size_t(mean.c) * mean.h * mean.w);
  caffe::BlobProto blob;
  blob.set_num(1);
  blob.set_channels(mean.c);
  blob.set_height(mean.h);
  blob.set_width(mean.w);
  blob.mutable_data()->Add(mean.values.begin(), mean.values.end());
  return WriteFileAtomic(path, blob.SerializeAsString());
}

Status ReadMeanFile(const std::string& path, MeanImage* out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound("mean file {}: no such file", path);
  if (!std::filesystem::is_regular_file(path, ec)) {
    return InvalidArgument("mean file {}: not a regular file", path);
  }
  if (IsTensorFile(path)) return ReadMeanTensorFile(path, out);
  std::string bytes;
  DP_RETURN_IF_ERROR(ReadFileBytes(path, &bytes));
  return ReadMeanBinaryproto(path, bytes, out);
}

}  // namespace downpour::data
