// mean_file.cc — mean image over an LMDB, stored as a common tensor file.
#include "data/mean_file.h"

#include <fmt/ranges.h>

#include <cstdlib>

#include "common/tensor_file.h"
#include "data/datum.h"
#include "data/lmdb_io.h"

namespace downpour::data {

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

Status ReadMeanFile(const std::string& path, MeanImage* out) {
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
  if (t->shape.size() != 3 || t->shape[0] <= 0 || t->shape[0] > 64 || t->shape[1] <= 0 ||
      t->shape[1] > 65536 || t->shape[2] <= 0 || t->shape[2] > 65536) {
    return Corrupt("mean file {}: tensor '{}' has shape [{}], expected [c, h, w]", path,
                   kMeanTensorName, fmt::join(t->shape, ", "));
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

}  // namespace downpour::data
