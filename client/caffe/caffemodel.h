// caffemodel.h — Caffe's .caffemodel weights file as plain values: a binary caffe.NetParameter
// whose layers carry their parameter blobs (data/caffe.proto).
//
// Reading accepts both forms Caffe has written:
//   new   NetParameter.layer  (field 100): LayerParameter { name = 1, type = 2, blobs = 7 },
//         each BlobProto with `shape` (BlobShape dims);
//   old   NetParameter.layers (field 2):   V1LayerParameter { name = 4, type = 5 (enum), blobs = 6 },
//         BlobProtos with the legacy num/channels/height/width (the model zoo's
//         bvlc_alexnet.caffemodel), upgraded as Caffe upgrades them (upgrade_v1.h).
// Writing always produces the new form, blob shapes as BlobShape, float data.
//
// Thread-safety: pure functions over values. Ownership: plain values, owned by the caller.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::caffe_io {

struct CaffeBlob {
  // BlobShape dims, or (num, channels, height, width) when the file used the legacy fields
  // (then legacy_shape is true: Caffe compares such a blob with a shape padded on the left
  // with 1s, e.g. fc6's weight 1×1×4096×9216 against (4096, 9216)).
  std::vector<int64_t> shape;
  bool legacy_shape = false;
  std::vector<float> data;  // row-major, product(shape) values (from double_data if the file held doubles)
  bool operator==(const CaffeBlob&) const = default;
};

struct CaffeLayer {
  std::string name;
  std::string type;  // Caffe's type string ("Convolution"); V1 enum types are mapped to it
  std::vector<std::string> bottoms, tops;
  std::vector<CaffeBlob> blobs;  // Convolution / InnerProduct: [weight, bias] or [weight]
  bool operator==(const CaffeLayer&) const = default;
};

struct CaffeNet {
  std::string name;                // NetParameter.name
  bool from_v1 = false;            // read from V1 `layers` (not written; writing is always new-form)
  std::vector<CaffeLayer> layers;  // in file order, layers without blobs included
};

// Parses `bytes` (a binary NetParameter); `source` names the file in errors. Refuses a file with
// both `layer` and `layers`, a blob whose data count differs from its shape, negative dims.
Status ParseCaffemodel(const std::string& bytes, const std::string& source, CaffeNet* out);
Status ReadCaffemodel(const std::string& path, CaffeNet* out);

// The binary NetParameter of `net` (new form). Deterministic: the same CaffeNet always gives
// the same bytes.
Status SerializeCaffemodel(const CaffeNet& net, std::string* bytes);
// Writes it to `path` atomically (common/file_io.h).
Status WriteCaffemodel(const std::string& path, const CaffeNet& net);

}  // namespace downpour::caffe_io
