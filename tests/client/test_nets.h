// test_nets.h — small model configs that several engine and worker tests build (on the
// reference, oneDNN and CUDA backends), written once.
#pragma once

namespace downpour::engine::testing {

// Every layer kind the backends must agree on in one small net: convolution with groups, a
// rectangular kernel, stride and pad; ReLU; LRN; overlapping max pooling with pad; a second
// convolution; average pooling whose windows overhang the input (Caffe's ceil); inner product,
// dropout, inner product; softmax loss. Input 4×13×11: conv1 7×6 → pool1 4×4 → conv2 3×3 →
// pool2 2×2. The engine's backends agree on it and its gradients match central differences.
inline constexpr char kMixedNet[] = R"(
name = "mixed"
[input]
channels = 4
height = 13
width = 11
[[layer]]
name = "conv1"
type = "Convolution"
bottom = "data"
top = "conv1"
num_output = 8
kernel_h = 3
kernel_w = 2
stride = 2
pad = 1
group = 2
weight_filler = { type = "gaussian", std = 0.3 }
bias_filler = { type = "constant", value = 0.1 }
[[layer]]
name = "relu1"
type = "ReLU"
bottom = "conv1"
top = "relu1"
[[layer]]
name = "norm1"
type = "LRN"
bottom = "relu1"
top = "norm1"
local_size = 3
alpha = 0.5
beta = 0.75
k = 2.0
[[layer]]
name = "pool1"
type = "Pooling"
bottom = "norm1"
top = "pool1"
kernel_size = 3
stride = 2
pad = 1
[[layer]]
name = "conv2"
type = "Convolution"
bottom = "pool1"
top = "conv2"
num_output = 6
kernel_size = 2
weight_filler = { type = "xavier" }
bias_filler = { type = "constant", value = 0.05 }
[[layer]]
name = "pool2"
type = "Pooling"
bottom = "conv2"
top = "pool2"
pool = "ave"
kernel_size = 2
stride = 2
[[layer]]
name = "fc1"
type = "InnerProduct"
bottom = "pool2"
top = "fc1"
num_output = 12
weight_filler = { type = "msra" }
bias_filler = { type = "uniform", scale = 0.2 }
[[layer]]
name = "drop1"
type = "Dropout"
bottom = "fc1"
top = "drop1"
dropout_ratio = 0.25
[[layer]]
name = "fc2"
type = "InnerProduct"
bottom = "drop1"
top = "fc2"
num_output = 5
weight_filler = { type = "xavier" }
[[layer]]
name = "loss"
type = "SoftmaxWithLoss"
bottom = ["fc2", "label"]
top = "loss"
)";

// conv1 (4×1×3×3, pad 1) → ReLU → fc1 (16×256) → ReLU → fc2 (10×16) → softmax loss, on 1×8×8
// inputs; six parameter tensors (conv1.weight is index 0, fc1.weight 2). Small enough that a
// training run against in-process servers takes milliseconds.
inline constexpr char kTinyConvNet[] = R"(name = "tinyconv"
[input]
channels = 1
height = 8
width = 8
[[layer]]
name = "conv1"
type = "Convolution"
bottom = ["data"]
top = ["conv1"]
num_output = 4
kernel_size = 3
pad = 1
weight_filler = { type = "gaussian", std = 0.3 }
bias_filler = { type = "constant", value = 0.1 }
[[layer]]
name = "relu1"
type = "ReLU"
bottom = ["conv1"]
top = ["relu1"]
[[layer]]
name = "fc1"
type = "InnerProduct"
bottom = ["relu1"]
top = ["fc1"]
num_output = 16
weight_filler = { type = "gaussian", std = 0.1 }
bias_filler = { type = "constant", value = 0.0 }
[[layer]]
name = "relu2"
type = "ReLU"
bottom = ["fc1"]
top = ["relu2"]
[[layer]]
name = "fc2"
type = "InnerProduct"
bottom = ["relu2"]
top = ["fc2"]
num_output = 10
weight_filler = { type = "gaussian", std = 0.3 }
bias_filler = { type = "constant", value = 0.0 }
[[layer]]
name = "loss"
type = "SoftmaxWithLoss"
bottom = ["fc2", "label"]
top = ["loss"]
)";

}  // namespace downpour::engine::testing
