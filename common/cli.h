// cli.h — what every downpour executable shares on its command line (CLI11):
//
//   --version, -V   prints "<program> <version> (commit <sha>)" (common/version.h), exits 0.
//   exit codes      0 ok; 1 runtime failure (I/O, a peer, a failed run); 2 usage or config
//                   error (bad flag, bad config file or value, missing input found before work
//                   starts). The same scheme in every binary and tool (docs/operations.md).
//   --set K=V       (programs that read a run config) overrides one run-config key,
//                   repeatable; common/run_config.h LoadRunConfig validates it like the file.
//   Main()          runs a program body so that an exception escaping it (downpour::Error
//                   from the engine, a CUDA / oneDNN failure, std::bad_alloc) is one line
//                   "<program>: <what>" and exit 1, never std::terminate.
//
// Thread-safety: call from main's thread. Ownership: the App owns the options added here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace downpour::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// One line for --help footers.
inline constexpr char kExitCodesHelp[] =
    "Exit codes: 0 ok, 1 runtime failure, 2 usage or config error.";

// Adds --version/-V and the exit-code footer to `app`.
void AddStandardFlags(CLI::App* app, std::string_view program);

// Adds the repeatable --set section.key=value option, collected into `sets`.
CLI::Option* AddSetOption(CLI::App* app, std::vector<std::string>* sets);

// Parses argv. Returns std::nullopt to go on; otherwise the code to exit with now: 0 after
// --help or --version (printed), kExitUsage after a usage error (printed as
// "<program>: <error>" plus a pointer to --help).
std::optional<int> Parse(CLI::App& app, int argc, char** argv);

// Integer validators whose messages name the bound, not a 300-digit double limit:
// "--workers: 0 is out of range: must be >= 1".
CLI::Validator AtLeast(int64_t min);
CLI::Validator Between(int64_t min, int64_t max);

// An enum's option values from the config's name table (one source per setting): names[i] is
// value i. For CLI::CheckedTransformer, which then refuses any other name.
template <typename Enum, size_t N>
std::map<std::string, Enum> NamedValues(const std::string_view (&names)[N]) {
  std::map<std::string, Enum> values;
  for (size_t i = 0; i < N; ++i) values.emplace(std::string(names[i]), static_cast<Enum>(i));
  return values;
}

// Runs `body` and returns its exit code; an exception escaping it is printed as
// "<program>: <what>" and gives kExitFailure.
int Main(std::string_view program, const std::function<int()>& body);

// Main for a program that serves (server, coordinator): runs `run`, which sets *serving once it
// serves. An error before then is a setup error (SetupExitCode: 2 for a bad flag, config or
// input); after it, a runtime failure (1). Either is logged once as "<program>: <status>".
int ServeMain(std::string_view program, const std::function<Status(bool* serving)>& run);

// Prints "<program>: <status>" to stderr and returns `exit_code`.
int Fail(std::string_view program, const Status& status, int exit_code);

// The exit code for a Status that ends a program before its work started: InvalidArgument,
// NotFound and FailedPrecondition (bad flag, config or input) → 2; anything else → 1.
int SetupExitCode(const Status& status);

}  // namespace downpour::cli
