// version.h — the project's version (the repository's VERSION file) and the git commit the
// binaries were built from (generated at build time by cmake/GitVersion.cmake).
//
// Thread-safety: pure functions over constants.
#pragma once

#include <string>
#include <string_view>

namespace downpour {

const char* Version();    // e.g. "0.2.0"
const char* GitCommit();  // short sha, with "-dirty" for a modified tree; "unknown" outside git

// "<program> <version> (commit <sha>)", what every binary prints for --version.
std::string VersionLine(std::string_view program);

}  // namespace downpour
