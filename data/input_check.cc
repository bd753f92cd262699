// input_check.cc — see input_check.h.
#include "data/input_check.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <filesystem>
#include <memory>

#include "data/datum.h"
#include "data/lmdb_io.h"
#include "data/mean_file.h"

namespace downpour::data {
namespace {

// An LMDB is a directory; a data path that is a plain file (an IDX file) is not ours to check.
bool IsLmdbPath(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

Status ReadPositiveInt(const toml::table& input, const char* key, const std::string& model_path, int* out) {
  const std::optional<int64_t> v = input[key].value<int64_t>();
  if (!v || *v <= 0 || *v > 1'000'000) {
    return InvalidArgument("model {}: [input] {} must be a positive integer", model_path, key);
  }
  *out = static_cast<int>(*v);
  return Status::Ok();
}

}  // namespace

std::string InputShape::ToString() const { return fmt::format("{}x{}x{}", c, h, w); }

Status ReadModelInputShape(const std::string& model_path, InputShape* out) {
  toml::table root;
  try {
    root = toml::parse_file(model_path);
  } catch (const toml::parse_error& e) {
    return InvalidArgument("model {}: {}", model_path, e.description());
  }
  const toml::table* input = root["input"].as_table();
  if (input == nullptr) return InvalidArgument("model {}: missing table [input]", model_path);
  InputShape s;
  DP_RETURN_IF_ERROR(ReadPositiveInt(*input, "channels", model_path, &s.c));
  DP_RETURN_IF_ERROR(ReadPositiveInt(*input, "height", model_path, &s.h));
  DP_RETURN_IF_ERROR(ReadPositiveInt(*input, "width", model_path, &s.w));
  *out = s;
  return Status::Ok();
}

Status FirstRecordShape(const std::string& path, InputShape* shape, std::string* key) {
  std::unique_ptr<LmdbEnv> env;
  DP_RETURN_IF_ERROR(LmdbEnv::OpenReadOnly(path, &env));
  std::unique_ptr<ReadTxn> txn;
  DP_RETURN_IF_ERROR(ReadTxn::Begin(env.get(), &txn));
  bool found = false;
  DP_RETURN_IF_ERROR(txn->First(&found));
  if (!found) return InvalidArgument("LMDB {} holds no records", path);
  const std::string where = fmt::format("LMDB {} key {}", path, txn->key());
  caffe::Datum datum;
  DP_RETURN_IF_ERROR(ParseDatum(txn->value(), where, &datum));
  Image scratch;
  ImageView v;
  DP_RETURN_IF_ERROR(ViewDatum(datum, 0, where, &scratch, &v));
  *shape = InputShape{v.c, v.h, v.w};
  if (key != nullptr) *key = std::string(txn->key());
  return Status::Ok();
}

Status CheckLmdbFitsModel(const std::string& lmdb, const std::string& field, int crop, const InputShape& model,
                          const std::string& model_path) {
  InputShape record;
  DP_RETURN_IF_ERROR(FirstRecordShape(lmdb, &record, nullptr));
  const bool crop_fits = crop == 0 || (crop <= record.h && crop <= record.w);
  const InputShape yielded = crop == 0 ? record : InputShape{record.c, crop, crop};
  if (crop_fits && yielded == model) return Status::Ok();
  const std::string after_crop =
      crop == 0 ? std::string("no data.crop")
                : (crop_fits ? fmt::format("{} after data.crop = {}", yielded.ToString(), crop)
                             : fmt::format("too small for data.crop = {}", crop));
  return InvalidArgument("{} = {}: the LMDB's records are {} ({}), but the model {} takes {} input", field, lmdb,
                         record.ToString(), after_crop, model_path, model.ToString());
}

Status CheckRunDataFitsModel(const RunConfig& config) {
  InputShape model;
  DP_RETURN_IF_ERROR(ReadModelInputShape(config.model.config, &model));
  std::vector<std::pair<std::string, std::string>> lmdbs;  // (config key, path)
  if (config.data.sharding == DataSharding::kOwn) {
    for (int j = 0; j < config.cluster.workers; ++j) {
      lmdbs.emplace_back(fmt::format("data.train (sharding \"own\", worker {})", j),
                         OwnShardPath(config.data, j, config.cluster.workers));
    }
  } else {
    lmdbs.emplace_back("data.train", config.data.train);
  }
  if (!config.data.test.empty()) lmdbs.emplace_back("data.test", config.data.test);
  for (const auto& [field, path] : lmdbs) {
    if (!IsLmdbPath(path)) continue;
    DP_RETURN_IF_ERROR(CheckLmdbFitsModel(path, field, config.data.crop, model, config.model.config));
  }
  if (config.data.mean_file.empty() || !IsLmdbPath(lmdbs.front().second)) return Status::Ok();
  // The mean image is subtracted before the crop: it has the records' own shape.
  MeanImage mean;
  DP_RETURN_IF_ERROR(ReadMeanFile(config.data.mean_file, &mean));
  InputShape record;
  DP_RETURN_IF_ERROR(FirstRecordShape(lmdbs.front().second, &record, nullptr));
  const InputShape mean_shape{mean.c, mean.h, mean.w};
  if (mean_shape != record) {
    return InvalidArgument("data.mean_file = {}: the mean image is {}, but the records of {} = {} are {}",
                           config.data.mean_file, mean_shape.ToString(), lmdbs.front().first,
                           lmdbs.front().second, record.ToString());
  }
  return Status::Ok();
}

}  // namespace downpour::data
