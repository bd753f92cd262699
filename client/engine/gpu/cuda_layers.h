// cuda_layers.h — the GPU layer classes' factory (definitions in cuda_layers.cc, one class per
// layer type: cuDNN convolution / ReLU / LRN / pooling / softmax, cuBLAS inner product, kernel
// dropout / loss / accuracy / ceil-mode pooling).
//
// Every layer owns its top's device storage (dense NCHW, data and grad, zeroed on Reshape) and
// keeps its cuDNN descriptors; parameters are the net's ParamSlots (device pointers). The layer
// holds a shared_ptr to the backend's CudaContext. Thread-safety: one thread at a time.
#pragma once

#include <memory>

#include "client/engine/gpu/cuda_context.h"
#include "client/engine/layer.h"

namespace downpour::engine::gpu {

Status CreateCudaLayer(std::shared_ptr<CudaContext> context, const LayerContext& layer_context,
                       std::unique_ptr<Layer>* layer);

}  // namespace downpour::engine::gpu
