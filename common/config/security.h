// config/security.h — [security]: CurveZMQ keys and the loopback run secret.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <string>

#include "common/config/table.h"

namespace downpour {

// [security] — CurveZMQ keys and the loopback run secret (common/security.h).
struct SecurityConfig {
  std::string keys = "";
  bool insecure = false;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    v.Key("keys", s.keys, "directory made by downpour-keys; \"\" = no CurveZMQ (loopback only)");
    v.Key("insecure", s.insecure, "allow binding off-host without keys (trusted networks only)");
  }
  bool operator==(const SecurityConfig&) const = default;
};

}  // namespace downpour
