// job_config.h — the run config of a multi-process test's job, built as a TOML table (toml++, the
// parser the programs read it with) instead of a format string per test file: a test states only
// what its job does differently from FashionJob's, and a change of a key is a Set, not a search and
// replace in TOML text.
//
// Thread-safety: none (one test thread). Copyable: a copy is a deep copy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace downpour::test {

class JobConfig {
 public:
  JobConfig();
  ~JobConfig();
  JobConfig(const JobConfig& other);
  JobConfig& operator=(const JobConfig& other);

  // Sets a key by its dotted path ("cluster.max_workers", "sweep.solver.base_lr"), making the
  // tables on the way; replaces what the key held.
  JobConfig& Set(std::string_view key, std::string_view value);
  JobConfig& Set(std::string_view key, const char* value);
  JobConfig& Set(std::string_view key, int value);
  JobConfig& Set(std::string_view key, int64_t value);
  JobConfig& Set(std::string_view key, double value);
  JobConfig& Set(std::string_view key, bool value);
  JobConfig& SetList(std::string_view key, const std::vector<double>& values);
  // A TOML fragment (e.g. "[[models]]\nname = \"a\"\n"): its tables merge into this one's, any
  // other value replaces what its key held. Fails the test (gtest ADD_FAILURE) if it does not parse.
  JobConfig& Merge(std::string_view toml);
  // Removes a key or a whole table ("sweep"); nothing if absent.
  JobConfig& Erase(std::string_view key);

  // An integer or string key's value; fails the test (and gives 0 / "") if absent or of another type.
  int64_t Int(std::string_view key) const;
  std::string String(std::string_view key) const;

  std::string Toml() const;
  // Writes Toml() to `path`; returns path.string().
  std::string Write(const std::filesystem::path& path) const;

 private:
  struct Table;
  std::unique_ptr<Table> table_;
};

// The job most multi-process tests run: `model` (a name in configs/models/, or a path to a model
// config) on Debian's Fashion-MNIST (harness.h kFashionMnistDir), `servers` × `workers` (async,
// the default mode) at a fresh loopback port range (coordinator 127.0.0.1:P, servers from P + 1), seed 5,
// heartbeats every 200 ms with silence after 2 s, batch 32, one engine thread, `steps` per worker,
// lr 0.01 fixed, no momentum or weight decay set (the solver's defaults), no periodic evaluation
// or checkpoint; the final evaluation's test_batches and everything else at their defaults.
JobConfig FashionJob(const std::string& model, int steps, int servers = 2, int workers = 2);

// The parameter service alone (no model or data), for tests that check weights exactly: `servers`
// × `workers`, the coordinator at a free loopback port (the servers take --port 0), heartbeats
// every 100 ms with silence after 2 s, chunks of 128 floats, base_lr 1 with no momentum or weight
// decay (a gradient g changes a weight by exactly −lr_mult · g), no periodic checkpoint, and
// checkpoints, when asked for, under ckpt/.
JobConfig ExactUpdateJob(int servers, int workers);

}  // namespace downpour::test
