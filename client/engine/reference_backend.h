// reference_backend.h — the plain reference backend: host memory, dense canonical blobs,
// every layer computed by the naive loops of ref_kernels.h in DOUBLE precision (inputs and
// weights widened, results rounded to float). Slow; it is the source of truth the oneDNN
// and CUDA backends are tested against.
//
// Thread-safety: one thread at a time; single-threaded compute.
#pragma once

#include <memory>

#include "client/engine/layer.h"

namespace downpour::engine {

std::unique_ptr<Backend> MakeReferenceBackend();

}  // namespace downpour::engine
