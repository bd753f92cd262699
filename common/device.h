// device.h — where a worker computes: the one DeviceKind every module uses (the run config's
// worker.device, the engine's backend choice).
#pragma once

namespace downpour {

enum class DeviceKind { kCpu, kGpu };

}  // namespace downpour
