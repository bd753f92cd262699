// mean_file.cc — mean image over an LMDB; the DPMN file format.
#include "data/mean_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

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
  *out = std::move(mean);
  return Status::Ok();
}

Status WriteMeanFile(const MeanImage& mean, const std::string& path) {
  DP_CHECK_EQ(mean.values.size(), size_t(mean.c) * mean.h * mean.w);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IoError("mean file {}: cannot create", tmp);
    const uint32_t head[2] = {kMeanFileMagic, kMeanFileVersion};
    const int32_t dims[3] = {mean.c, mean.h, mean.w};
    f.write(reinterpret_cast<const char*>(head), sizeof(head));
    f.write(reinterpret_cast<const char*>(dims), sizeof(dims));
    f.write(reinterpret_cast<const char*>(mean.values.data()),
            static_cast<std::streamsize>(mean.values.size() * sizeof(float)));
    f.flush();
    if (!f.good()) return IoError("mean file {}: write failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IoError("mean file {}: rename from {} failed: {}", path, tmp, ec.message());
  return Status::Ok();
}

Status ReadMeanFile(const std::string& path, MeanImage* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("mean file {}: cannot open", path);
  uint32_t head[2] = {0, 0};
  int32_t dims[3] = {0, 0, 0};
  f.read(reinterpret_cast<char*>(head), sizeof(head));
  f.read(reinterpret_cast<char*>(dims), sizeof(dims));
  if (!f) return Corrupt("mean file {}: truncated header", path);
  if (head[0] != kMeanFileMagic) {
    return Corrupt("mean file {}: bad magic 0x{:08x}, expected 0x{:08x}", path, head[0],
                   kMeanFileMagic);
  }
  if (head[1] != kMeanFileVersion) {
    return Corrupt("mean file {}: version {}, this build reads {}", path, head[1],
                   kMeanFileVersion);
  }
  if (dims[0] <= 0 || dims[1] <= 0 || dims[2] <= 0 || dims[0] > 64 || dims[1] > 65536 ||
      dims[2] > 65536) {
    return Corrupt("mean file {}: bad shape {}x{}x{}", path, dims[0], dims[1], dims[2]);
  }
  MeanImage m;
  m.c = dims[0];
  m.h = dims[1];
  m.w = dims[2];
  m.values.resize(size_t(m.c) * m.h * m.w);
  f.read(reinterpret_cast<char*>(m.values.data()),
         static_cast<std::streamsize>(m.values.size() * sizeof(float)));
  if (!f) return Corrupt("mean file {}: truncated: shape {}x{}x{} needs {} floats", path, m.c,
                         m.h, m.w, m.values.size());
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace downpour::data
