// keys_main.cc — downpour-keys: makes and checks a cluster's CurveZMQ key material
// (common/security.h).
//
//   downpour-keys --out DIR [--force]   make DIR (mode 0700) with the endpoint, admin, server and
//                                       worker keypairs and print which files go to which hosts
//   downpour-keys --check DIR           check every file of DIR (keys well formed, each .key mode
//                                       0600 and belonging to its .pub) and say what is wrong
//
// Exit codes (common/cli.h): 0 ok; 1 the keys could not be written, or --check found a problem;
// 2 usage (neither or both of --out and --check, an existing non-empty DIR without --force).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/cli.h"
#include "common/security.h"

namespace downpour {
namespace {

constexpr std::string_view kProgram = "downpour-keys";

// Which files each host needs, for the operator who copies them.
void PrintDistribution(const std::string& dir) {
  fmt::print(
      "{0}: CurveZMQ keys made in {1}\n"
      "Copy to each host (same path, or point [security] keys at the copy); keep *.key mode 0600:\n"
      "  every host:          {1}/endpoint.pub {1}/admin.pub {1}/server.pub {1}/worker.pub\n"
      "  coordinator host:    {1}/endpoint.key {1}/admin.key {1}/worker.key (the evaluator)\n"
      "  server hosts:        {1}/endpoint.key {1}/server.key\n"
      "  worker hosts:        {1}/worker.key\n"
      "  operator (launcher): {1}/admin.key\n"
      "(A shared filesystem readable only by you can hold the whole directory for every host.)\n"
      "Then set in the run config:  [security] keys = \"{1}\"\n"
      "Check a copy with:           {0} --check {1}\n",
      kProgram, dir);
}

int MakeKeys(const std::string& dir, bool force) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_empty(dir, ec) && !force) {
    return cli::Fail(kProgram,
                     InvalidArgument("--out {}: exists and is not empty; new keys would lock out every host "
                                     "holding the old ones: pass --force to replace them",
                                     dir),
                     cli::kExitUsage);
  }
  const Status s = MakeClusterKeys(dir);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitFailure);
  PrintDistribution(dir);
  return cli::kExitOk;
}

int CheckKeys(const std::string& dir) {
  std::vector<std::string> report;
  const Status s = CheckClusterKeys(dir, &report);
  for (const std::string& line : report) fmt::print("  {}\n", line);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitFailure);
  fmt::print("{}: {}: ok\n", kProgram, dir);
  return cli::kExitOk;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  namespace cli = downpour::cli;
  std::string out, check;
  bool force = false;
  CLI::App app{"downpour-keys: make or check a cluster's CurveZMQ keys ([security] keys in the run config)"};
  cli::AddStandardFlags(&app, "downpour-keys");
  auto* out_opt = app.add_option("--out", out, "directory to make the keys in (created with mode 0700)");
  auto* check_opt = app.add_option("--check", check, "key directory to check");
  app.add_flag("--force", force, "with --out: replace the keys of an existing non-empty directory");
  out_opt->excludes(check_opt);
  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  if (out.empty() && check.empty()) {
    return cli::Fail("downpour-keys", downpour::InvalidArgument("give --out DIR (make keys) or --check DIR"),
                     cli::kExitUsage);
  }
  return cli::Main("downpour-keys",
                   [&] { return out.empty() ? downpour::CheckKeys(check) : downpour::MakeKeys(out, force); });
}
