// caffemodel.cc — see caffemodel.h.
#include "client/caffe/caffemodel.h"

#include <fmt/ranges.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <climits>

#include "client/caffe/upgrade_v1.h"
#include "common/file_io.h"
#include "data/caffe.pb.h"

namespace downpour::caffe_io {
namespace {

// One BlobProto → CaffeBlob. `where` is "<file>: layer 'conv1' blob 0".
Status BlobFromProto(const ::caffe::BlobProto& proto, const std::string& where, CaffeBlob* out) {
  out->shape.clear();
  out->legacy_shape = !proto.has_shape();
  if (proto.has_shape()) {
    out->shape.assign(proto.shape().dim().begin(), proto.shape().dim().end());
  } else {
    out->shape = {proto.num(), proto.channels(), proto.height(), proto.width()};
  }
  int64_t count = 1;
  for (int64_t d : out->shape) {
    if (d < 0) return Corrupt("{}: negative dimension in shape ({})", where, fmt::join(out->shape, ","));
    count *= d;
  }
  if (proto.data_size() > 0) {
    out->data.assign(proto.data().begin(), proto.data().end());
  } else {
    // Caffe's Blob::FromProto reads double_data the same way when a blob was saved in double.
    out->data.resize(static_cast<size_t>(proto.double_data_size()));
    for (int i = 0; i < proto.double_data_size(); ++i) out->data[i] = static_cast<float>(proto.double_data(i));
  }
  if (static_cast<int64_t>(out->data.size()) != count) {
    return Corrupt("{}: shape ({}) holds {} values but the blob has {}", where, fmt::join(out->shape, ","), count,
                   out->data.size());
  }
  return Status::Ok();
}

Status LayerFromProto(const ::caffe::LayerParameter& proto, const std::string& source, CaffeLayer* out) {
  out->name = proto.name();
  out->type = proto.type();
  out->bottoms.assign(proto.bottom().begin(), proto.bottom().end());
  out->tops.assign(proto.top().begin(), proto.top().end());
  out->blobs.resize(static_cast<size_t>(proto.blobs_size()));
  for (int b = 0; b < proto.blobs_size(); ++b) {
    DP_RETURN_IF_ERROR(
        BlobFromProto(proto.blobs(b), fmt::format("{}: layer '{}' blob {}", source, proto.name(), b), &out->blobs[b]));
  }
  return Status::Ok();
}

}  // namespace

Status ParseCaffemodel(const std::string& bytes, const std::string& source, CaffeNet* out) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return InvalidArgument("{}: {} bytes is more than protobuf can parse (2 GiB)", source, bytes.size());
  }
  ::caffe::NetParameter net;
  google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&input);
  coded.SetTotalBytesLimit(INT_MAX);  // weights files are far larger than protobuf's default limit
  if (!net.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    return Corrupt("{}: not a Caffe .caffemodel (a binary caffe.NetParameter could not be parsed from its {} bytes)",
                   source, bytes.size());
  }
  if (net.layer_size() > 0 && net.layers_size() > 0) {
    return Corrupt("{}: holds both new-style 'layer' ({}) and V1 'layers' ({}) entries; Caffe refuses such a file too",
                   source, net.layer_size(), net.layers_size());
  }
  CaffeNet result;
  result.name = net.name();
  result.from_v1 = net.layers_size() > 0;
  result.layers.resize(static_cast<size_t>(net.layer_size() + net.layers_size()));
  for (int i = 0; i < net.layer_size(); ++i)
    DP_RETURN_IF_ERROR(LayerFromProto(net.layer(i), source, &result.layers[i]));
  for (int i = 0; i < net.layers_size(); ++i) {
    ::caffe::LayerParameter upgraded;
    UpgradeV1Layer(net.mutable_layers(i), &upgraded);
    DP_RETURN_IF_ERROR(LayerFromProto(upgraded, source, &result.layers[i]));
  }
  *out = std::move(result);
  return Status::Ok();
}

Status ReadCaffemodel(const std::string& path, CaffeNet* out) {
  std::string bytes;
  DP_RETURN_IF_ERROR(ReadWholeFile(path, "caffemodel", &bytes));
  return ParseCaffemodel(bytes, path, out);
}

Status SerializeCaffemodel(const CaffeNet& net, std::string* bytes) {
  ::caffe::NetParameter proto;
  proto.set_name(net.name);
  for (const CaffeLayer& layer : net.layers) {
    ::caffe::LayerParameter* lp = proto.add_layer();
    lp->set_name(layer.name);
    lp->set_type(layer.type);
    for (const std::string& b : layer.bottoms) lp->add_bottom(b);
    for (const std::string& t : layer.tops) lp->add_top(t);
    for (size_t b = 0; b < layer.blobs.size(); ++b) {
      const CaffeBlob& blob = layer.blobs[b];
      int64_t count = 1;
      for (int64_t d : blob.shape) count *= d;
      if (count != static_cast<int64_t>(blob.data.size())) {
        return InvalidArgument("layer '{}' blob {}: shape ({}) holds {} values but {} were given", layer.name, b,
                               fmt::join(blob.shape, ","), count, blob.data.size());
      }
      ::caffe::BlobProto* bp = lp->add_blobs();
      for (int64_t d : blob.shape) bp->mutable_shape()->add_dim(d);
      bp->mutable_data()->Add(blob.data.begin(), blob.data.end());
    }
  }
  if (proto.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return InvalidArgument("net '{}': {} bytes is more than a protobuf message can hold (2 GiB)", net.name,
                           proto.ByteSizeLong());
  }
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!proto.SerializeToCodedStream(&coded)) return Internal("net '{}': protobuf serialization failed", net.name);
  }
  *bytes = std::move(out);
  return Status::Ok();
}

Status WriteCaffemodel(const std::string& path, const CaffeNet& net) {
  std::string bytes;
  Status s = SerializeCaffemodel(net, &bytes);
  if (!s.ok()) return Status(s.code(), fmt::format("{}: {}", path, s.message()));
  return WriteFileAtomic(path, bytes);
}

}  // namespace downpour::caffe_io
