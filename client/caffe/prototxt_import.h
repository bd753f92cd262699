// prototxt_import.h — a Caffe net definition (NetParameter in protobuf text format, a
// .prototxt) → a downpour model config (TOML, client/engine/net_spec.h format).
//
// What is read: the net's `layer` list (or the V1 `layers` list of old files, upgraded as Caffe
// upgrades it), parsed with protobuf's TextFormat against the subset of caffe.proto in
// data/caffe.proto. Fields outside that subset are ignored (listed in Import::notes); a layer type
// the engine does not have is one error naming the layer, its type and the supported types.
//
// How layers map (Caffe → TOML, net_spec.h):
//   Convolution    num_output, kernel / stride / pad (single, per-axis or _h/_w), group,
//                  bias_term, weight/bias fillers, param { lr_mult decay_mult } (always written:
//                  Caffe's default multipliers are 1/1, the TOML parser's bias default is 2/0).
//   InnerProduct   num_output, bias_term, fillers, multipliers.
//   Pooling        MAX → pool = "max", AVE → pool = "ave"; kernel / stride / pad.
//   LRN            local_size, alpha, beta, k (ACROSS_CHANNELS only).
//   ReLU, Dropout  (dropout_ratio), SoftmaxWithLoss, Accuracy (top_k).
//   Softmax        (deploy nets) its scores become the input of a SoftmaxWithLoss over them and
//                  "label": the engine trains with the loss and evaluates from the scores, so
//                  the model keeps both uses of the deploy net.
//   Data, ImageData, Input (and NetParameter input/input_shape/input_dim)
//                  give the input blob: top 0 is the engine's "data", top 1 its "label".
//                  Input fixes C×H×W; Data/ImageData fix H×W with transform_param crop_size
//                  (ImageData also with new_height/new_width; colour gives C = 3, Data assumes
//                  C = 3 unless force_gray). A net that does not fix its input size (LeNet's and
//                  CIFAR-10 quick's Data layers) needs ImportOptions::input (--input CxHxW).
// Fillers: constant (value), gaussian (std, mean 0), uniform (min = -max), xavier and msra
// (FAN_IN). Anything the engine would compute differently (dilation, N-D kernels, a leaky
// ReLU, WITHIN_CHANNEL LRN, FLOOR pooling, global pooling, ignore_label, a transposed inner
// product, shared weights, a loss_weight other than 1 ...) is an error naming the layer and field.
//
// Phases: a layer is kept when Caffe's include/exclude rules select it for the chosen phase
// (NetState: that phase, level 0, no stages). Accuracy layers are kept in both phases: downpour
// evaluates with the same net it trains (engine::Net::Forward), so bvlc_alexnet's TEST-only
// accuracy layer belongs in the one model file.
//
// In-place layers (ReLU, Dropout with bottom == top) are renamed: the top becomes the layer's
// name and later layers read it, as configs/models/alexnet.toml is written (relu1's top is
// "relu1"), because the engine forbids a blob produced twice.
//
// The TOML names the prototxt in its header comment and carries, as comments, the train Data
// layer's preprocessing (crop_size, mirror, mean_file, mean_value, scale, source, batch_size)
// as the run-config keys that reproduce it (data.crop, data.mirror, ...). The result is parsed
// back with engine::ParseNetSpecString and shape-checked with engine::InferShapes before it is
// returned, so an import either gives a model that builds or an error.
//
// Thread-safety: pure functions. Ownership: plain values owned by the caller.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "client/engine/net_spec.h"
#include "common/status.h"

namespace downpour::caffe_io {

enum class CaffePhase { kTrain, kTest };

struct ImportOptions {
  CaffePhase phase = CaffePhase::kTrain;  // default train
  // --input CxHxW; 0×0×0 (default) = from the prototxt. When the prototxt fixes the size too,
  // both must agree (a mismatch is an error naming both).
  int input_channels = 0, input_height = 0, input_width = 0;
};

struct Import {
  std::string toml;                // the model config
  engine::NetSpec spec;            // `toml` parsed back
  engine::NetShapes shapes;        // its shapes at batch 1
  std::vector<std::string> notes;  // what the import decided or ignored, one line each
};

// "3x227x227" (also "3X227X227") → options->input_*; errors name the text.
Status ParseInputSize(std::string_view text, ImportOptions* options);
// "train" / "test".
Status ParsePhase(std::string_view text, ImportOptions* options);

// `text` is the prototxt; `source` names it in errors and in the TOML header.
Status ImportPrototxtText(const std::string& text, const std::string& source, const ImportOptions& options,
                          Import* out);
Status ImportPrototxtFile(const std::string& path, const ImportOptions& options, Import* out);

}  // namespace downpour::caffe_io
