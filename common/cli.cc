// cli.cc — see cli.h.
#include "common/cli.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <new>

#include "common/version.h"

namespace downpour::cli {

void AddStandardFlags(CLI::App* app, std::string_view program) {
  app->name(std::string(program));
  app->set_version_flag("--version,-V", VersionLine(program), "print the version and git commit, then exit");
  app->footer(kExitCodesHelp);
}

CLI::Option* AddSetOption(CLI::App* app, std::vector<std::string>* sets) {
  return app->add_option("--set", *sets,
                         "override a run-config key: section.key=value (repeatable; TOML value, bare "
                         "strings allowed), e.g. --set worker.steps=500 --set data.train=/d/train_lmdb")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\nRun with --help for the options.\n", app.get_name().c_str(), e.what());
    return kExitUsage;
  }
  return std::nullopt;
}

namespace {

CLI::Validator IntRange(int64_t min, int64_t max, std::string description) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return fmt::format("'{}' is not an integer", text);
        if (v < min) return fmt::format("{} is out of range: must be >= {}", v, min);
        if (v > max) return fmt::format("{} is out of range: must be <= {}", v, max);
        return std::string();
      },
      std::move(description));
}

}  // namespace

CLI::Validator AtLeast(int64_t min) {
  return IntRange(min, INT64_MAX, fmt::format("INT >= {}", min));
}

CLI::Validator Between(int64_t min, int64_t max) {
  return IntRange(min, max, fmt::format("INT in [{}, {}]", min, max));
}

int Main(std::string_view program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%.*s: out of memory\n", static_cast<int>(program.size()), program.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%.*s: unknown exception\n", static_cast<int>(program.size()), program.data());
  }
  return kExitFailure;
}

int ServeMain(std::string_view program, const std::function<Status(bool* serving)>& run) {
  return Main(program, [&] {
    bool serving = false;
    const Status s = run(&serving);
    if (s.ok()) return kExitOk;
    spdlog::error("{}: {}", program, s.ToString());
    return serving ? kExitFailure : SetupExitCode(s);
  });
}

int Fail(std::string_view program, const Status& status, int exit_code) {
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), status.ToString().c_str());
  return exit_code;
}

int SetupExitCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

}  // namespace downpour::cli
