// version.cc — see version.h (Version() and GitCommit() are generated).
#include "common/version.h"

#include <fmt/format.h>

namespace downpour {

std::string VersionLine(std::string_view program) {
  return fmt::format("{} {} (commit {})", program, Version(), GitCommit());
}

}  // namespace downpour
