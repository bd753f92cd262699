// cuda_input.h — the CUDA backend's byte input (Backend::StageInput / NormalizeInput,
// common/byte_batch.h): a batch goes up as uint8 crop windows, a quarter of the floats' bytes, and
// a kernel on the compute stream normalises it into the input blob.
//
//  * Two staging slots of device memory, so the next step's batch uploads while this step's is
//    read. A slot is reused only after the kernel that read its last batch has run (an event).
//  * An input stream of its own: the upload runs beside the copy stream's weight uploads and
//    gradient downloads (PCIe carries both directions at once), not queued behind them.
//  * The compute stream waits for its own batch's upload only.
//
// Ownership: owns its stream, events and device buffers; shares the backend's CudaContext.
// Thread-safety: the backend's thread, like every backend call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "client/engine/gpu/cuda_context.h"
#include "common/byte_batch.h"
#include "common/status.h"

namespace downpour::engine::gpu {

class CudaInput {
 public:
  explicit CudaInput(std::shared_ptr<CudaContext> context) : ctx_(std::move(context)) {}
  ~CudaInput();
  CudaInput(const CudaInput&) = delete;
  CudaInput& operator=(const CudaInput&) = delete;

  // The mean image and values to device memory, and both slots sized for `batch` images; out of
  // device memory → an error naming the buffer and the free memory.
  Status Prepare(const InputNormalization& norm, int batch);
  // Starts the upload of a batch into the slot the last normalisation did not read (pixels and
  // windows must stay until the step that normalises it has ended); it replaces a batch staged
  // before and not normalised. A larger batch than prepared grows the slot (throws when it cannot).
  void Stage(const ByteBatch& batch);
  // Queues the normalisation of `batch` into `out` (n × c × h × w floats): from the batch staged
  // last when it is this one, else staged now.
  void Normalize(const ByteBatch& batch, float* out);

 private:
  struct Slot {
    const uint8_t* source = nullptr;  // the staged batch's host pixels
    DeviceBuffer pixels, windows;
    cudaEvent_t landed = nullptr;    // its upload is done (input stream)
    cudaEvent_t consumed = nullptr;  // the kernel that read it has run (compute stream)
  };
  Status Init();

  std::shared_ptr<CudaContext> ctx_;
  InputNormalization norm_;
  DeviceBuffer mean_image_, mean_values_;
  cudaStream_t stream_ = nullptr;
  Slot slots_[2];
  int staged_ = -1;     // the slot of the batch staged and not yet normalised; -1 = none
  int last_read_ = -1;  // the slot the last normalisation read (its kernel may still run)
};

}  // namespace downpour::engine::gpu
