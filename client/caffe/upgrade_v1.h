// upgrade_v1.h — Caffe's V1 layers (NetParameter field `layers`, enum types, blobs_lr) as the
// current LayerParameter, the way Caffe's own UpgradeV1LayerParameter (upgrade_proto.cpp) does
// it, so the prototxt importer and the .caffemodel reader see one kind of layer.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "data/caffe.pb.h"

namespace downpour::caffe_io {

// Caffe's type string for a V1 enum type ("Convolution" for CONVOLUTION, "SoftmaxWithLoss" for
// SOFTMAX_LOSS, ...); "" for NONE.
std::string V1TypeName(::caffe::V1LayerParameter::LayerType type);

// Moves `v1` (its blobs included, so a large .caffemodel is not copied) into `out`: name, type,
// bottoms, tops, include/exclude rules, blobs, blobs_lr[i] / weight_decay[i] as param[i] {
// lr_mult decay_mult }, loss_weight and the per-type parameter messages.
void UpgradeV1Layer(::caffe::V1LayerParameter* v1, ::caffe::LayerParameter* out);

}  // namespace downpour::caffe_io
