// process_util.cc — see process_util.h.
#include "server/process_util.h"

#include <signal.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>

namespace downpour {

namespace {
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockStopSignals() {
  sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool StopSignalArrived(std::chrono::milliseconds timeout) {
  sigset_t set = StopSignals();
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>((timeout.count() % 1000) * 1000000)};
  return sigtimedwait(&set, nullptr, &ts) > 0;
}

Status ParsePort(const std::string& host_port, const std::string& what, int* port, std::string* host) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("{} = '{}': expected host:port", what, host_port);
  char* end = nullptr;
  const long p = std::strtol(host_port.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535 || colon + 1 == host_port.size()) {
    return InvalidArgument("{} = '{}': bad port", what, host_port);
  }
  *port = static_cast<int>(p);
  if (host) *host = host_port.substr(0, colon);
  return Status::Ok();
}

}  // namespace downpour
