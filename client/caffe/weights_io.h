// weights_io.h — weights between Caffe's .caffemodel, downpour's tensor file (common/
// tensor_file.h, "DPTF") and an engine::Net.
//
// The mapping, the same in every direction: Caffe layer L with blobs [weight, bias] ↔ the model's
// tensors "L.weight", "L.bias" (engine::NetShapes::params; a layer without bias has [weight]).
// Caffe's canonical layouts are the engine's (convolution O×(C/group)×kh×kw, inner product
// out×in, bias out), so values are copied as they are, never reordered; only shapes are checked.
// A blob's shape must equal the tensor's, except a legacy (num, channels, height, width) blob of
// an old file, accepted when the tensor's shape padded on the left with 1s equals it (Caffe's own
// Blob::ShapeEquals rule): fc6's weight 1×1×4096×9216 is (4096, 9216), its bias 1×1×1×4096 is
// (4096). Every check is done before anything is written or any weight is touched.
//
// Fine-tuning (WeightsPolicy): Caffe's Net::CopyTrainedLayersFrom copies layers by name, ignores
// the file's layers the net lacks and leaves the net's other layers at their fillers. That is
// how a model with fc8 renamed (say fc8_flowers, 102 classes) starts from ImageNet weights for
// every other layer. Here it is explicit: by default both kinds of mismatch are errors; set
// ignore_extra / keep_missing to get Caffe's behaviour, and read WeightsReport for what was
// skipped and what was left alone.
//
// Thread-safety: the functions are reentrant; LoadWeightsFile uses the Net from the calling
// thread only (engine::Net is single-threaded). Ownership: plain values owned by the caller.
#pragma once

#include <string>
#include <vector>

#include "client/caffe/caffemodel.h"
#include "client/engine/net.h"
#include "client/engine/net_spec.h"
#include "common/status.h"
#include "common/tensor_file.h"

namespace downpour::caffe_io {

struct WeightsPolicy {
  // Weights in the file for a layer (caffemodel) or a tensor (tensor file) the model does not
  // have. false (default): an error naming them all. true: ignored (Caffe's rule), listed in
  // WeightsReport::skipped.
  bool ignore_extra = false;
  // Tensors of the model that the file does not hold. false (default): an error naming them all.
  // true: left as they are (their fillers, for a net just initialised), listed in
  // WeightsReport::kept.
  bool keep_missing = false;
};

struct WeightsReport {
  std::vector<std::string> skipped;  // caffemodel: layer names; tensor file: tensor names
  std::vector<std::string> kept;     // model tensor names left untouched
};

// The model's tensors from a .caffemodel, in param order and canonical shapes (a tensor that the
// file lacks is absent when policy.keep_missing). `source` names the file in errors, which name
// the layer, the blob, and both shapes.
Status CaffeToTensors(const CaffeNet& caffe, const std::string& source, const engine::NetSpec& spec,
                      const engine::NetShapes& shapes, const WeightsPolicy& policy, std::vector<NamedTensor>* tensors,
                      WeightsReport* report);

// A .caffemodel of the model's weights: every layer of `spec` in order (name, Caffe type, bottoms,
// tops) with its blobs [weight, bias] in canonical shapes. `file` must hold exactly the model's
// tensors with their shapes (`source` names it in errors).
Status TensorsToCaffe(const TensorFile& file, const std::string& source, const engine::NetSpec& spec,
                      const engine::NetShapes& shapes, CaffeNet* out);

// What the worker calls to start from given weights. `path` is a downpour tensor file (magic
// "DPTF") or, for anything else, a .caffemodel. Every tensor's presence and shape is checked
// against the net before a single weight is written: on error the net is unchanged, and the
// message names the file, the layer / tensor and the shapes. `report` may be null.
Status LoadWeightsFile(const std::string& path, engine::Net* net, const WeightsPolicy& policy = {},
                       WeightsReport* report = nullptr);

}  // namespace downpour::caffe_io
