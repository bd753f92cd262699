// input_check.h — does a run's data fit its model? The check downpour-launch makes before any
// process starts, and every worker makes before it builds its net: the first record of every
// LMDB the run reads (data.train, or each worker's own shard with sharding = "own", and
// data.test), as the loader yields it (encoded records decoded as stored, then cropped to
// data.crop), must be the model's [input] channels x height x width; a mean file must have the
// records' shape. So an AlexNet run (3x227x227 input) over a 28x28 LMDB is refused with one
// line naming the LMDB, its record shape and the model's input shape, instead of failing in a
// worker after the servers started.
//
// IDX files given as data paths are not LMDBs and are left to the IDX source's own checks.
//
// Thread-safety: free functions; each opens its own read-only LMDB environment and read
// transaction. Ownership: outputs are caller-owned values.
#pragma once

#include <string>

#include "common/run_config.h"
#include "common/status.h"

namespace downpour::data {

// channels x height x width of one image.
struct InputShape {
  int c = 0, h = 0, w = 0;
  bool operator==(const InputShape&) const = default;
  std::string ToString() const;  // "3x227x227"
};

// The [input] table (channels, height, width) of a model TOML (the format of
// client/engine/net_spec.h). Errors name the file and the key.
Status ReadModelInputShape(const std::string& model_path, InputShape* out);

// The shape of the first record (in key order) of the LMDB at `path`, decoded as stored when
// encoded. `key` (may be null) receives its key. An empty LMDB is kInvalidArgument naming it.
Status FirstRecordShape(const std::string& path, InputShape* shape, std::string* key);

// The shape the loader yields from records of `record` with data.crop = `crop` (0 = none).
// `model_path` and `field` ("data.train", "data.test", ...) name the model and the LMDB's
// config key in the one-line error when it is not `model`.
Status CheckLmdbFitsModel(const std::string& lmdb, const std::string& field, int crop, const InputShape& model,
                          const std::string& model_path);

// Every LMDB of the run (and its mean file) against the input of config.model.config.
Status CheckRunDataFitsModel(const RunConfig& config);

}  // namespace downpour::data
