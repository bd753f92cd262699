// onednn_backend.h — the CPU backend on oneDNN (v2 API, Debian libdnnl-dev).
//
// Activations stay in the layouts oneDNN's primitives choose (format_tag::any: blocked
// nChw16c / nChw8c on AVX-512 / AVX2) between convolution, ReLU, LRN, pooling and dropout;
// a Blob's `format` holds its dnnl::memory::desc. Reorders happen only at the net's edges:
// the input image batch (NCHW → conv1's layout), before an inner product (→ plain N×K), and
// when reading a blob to the host. Weights stay canonical in the net's contiguous buffer
// (OIHW / out×in); convolution reorders them to its preferred layout every step and its
// weight gradient back (counted in the timings: oneDNN picks the layout, we pay for it).
//
// Thread-safety: one thread at a time; compute is parallel over OpenMP threads
// (SetThreads → omp_set_num_threads).
#pragma once

#include <memory>

#include "client/engine/layer.h"

namespace downpour::engine {

std::unique_ptr<Backend> MakeOneDnnBackend();

}  // namespace downpour::engine
