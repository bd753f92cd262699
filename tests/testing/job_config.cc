// job_config.cc — JobConfig over a toml::table (job_config.h).
#include "tests/testing/job_config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <utility>

#include "tests/testing/harness.h"

namespace downpour::test {

struct JobConfig::Table {
  toml::table root;
};

namespace {

// "a.b.c" -> {"a", "b"} and "c".
std::pair<std::vector<std::string>, std::string> SplitKey(std::string_view key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = key.find('.'); dot != std::string_view::npos; dot = key.find('.', start)) {
    parts.emplace_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  return {std::move(parts), std::string(key.substr(start))};
}

// The table that holds `key`'s last part, made on the way when `make`; nullptr if a part is a
// value, not a table (or is absent and !make).
toml::table* Parent(toml::table& root, std::string_view key, bool make, std::string* leaf) {
  auto [tables, last] = SplitKey(key);
  toml::table* t = &root;
  for (const std::string& name : tables) {
    if (make && !t->contains(name)) t->insert(name, toml::table{});
    toml::node* next = t->get(name);
    if (next == nullptr || !next->is_table()) return nullptr;
    t = next->as_table();
  }
  *leaf = std::move(last);
  return t;
}

template <typename V>
void SetValue(toml::table& root, std::string_view key, V&& value) {
  std::string leaf;
  toml::table* t = Parent(root, key, /*make=*/true, &leaf);
  if (t == nullptr) {
    ADD_FAILURE() << "JobConfig::Set(\"" << key << "\"): a part of the path is a value, not a table";
    return;
  }
  t->insert_or_assign(leaf, std::forward<V>(value));
}

const toml::node* Find(const toml::table& root, std::string_view key) {
  std::string leaf;
  // make = false: Parent only walks, so the cast writes nothing.
  const toml::table* t = Parent(const_cast<toml::table&>(root), key, /*make=*/false, &leaf);
  return t == nullptr ? nullptr : t->get(leaf);
}

// `from`'s tables merge into `into`'s; every other value replaces.
void MergeInto(toml::table& into, const toml::table& from) {
  for (const auto& [k, v] : from) {
    toml::node* mine = into.get(k);
    if (v.is_table() && mine != nullptr && mine->is_table()) {
      MergeInto(*mine->as_table(), *v.as_table());
    } else {
      into.insert_or_assign(k, v);
    }
  }
}

// A value as TOML: floats in their shortest form that reads back to the same double (fmt), so a
// kept config says 0.9, not toml++'s 0.90000000000000002; strings, integers and booleans as toml++
// prints them.
std::string Value(const toml::node& v) {
  if (const auto* d = v.as_floating_point()) {
    std::string text = fmt::format("{}", d->get());
    if (text.find_first_of(".en") == std::string::npos) text += ".0";  // 1 -> 1.0; inf, nan, 1e-05 stay
    return text;
  }
  if (const auto* list = v.as_array()) {
    std::string text = "[";
    for (size_t i = 0; i < list->size(); ++i) text += (i ? ", " : "") + Value(*list->get(i));
    return text + "]";
  }
  std::ostringstream out;
  out << toml::toml_formatter(v);
  return out.str();
}

// A key bare when TOML allows it (the run config's own names), else quoted.
std::string Key(std::string_view k) {
  const bool bare = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  return bare ? std::string(k) : Value(toml::value<std::string>(std::string(k)));
}

// `t`'s keys, then its tables as [prefix.key] and its arrays of tables as [[prefix.key]].
void Render(const toml::table& t, const std::string& prefix, std::string* out) {
  for (const auto& [k, v] : t) {
    if (!v.is_table() && !v.is_array_of_tables()) *out += fmt::format("{} = {}\n", Key(k.str()), Value(v));
  }
  for (const auto& [k, v] : t) {
    const std::string name = prefix.empty() ? Key(k.str()) : fmt::format("{}.{}", prefix, Key(k.str()));
    if (const toml::table* sub = v.as_table()) {
      // A table of tables only ([sweep] of [sweep.solver]) needs no header of its own.
      const bool header = sub->empty() || std::any_of(sub->begin(), sub->end(), [](const auto& kv) {
                            return !kv.second.is_table() && !kv.second.is_array_of_tables();
                          });
      if (header) *out += fmt::format("{}[{}]\n", out->empty() ? "" : "\n", name);
      Render(*sub, name, out);
    } else if (v.is_array_of_tables()) {
      for (const toml::node& element : *v.as_array()) {
        *out += fmt::format("{}[[{}]]\n", out->empty() ? "" : "\n", name);
        Render(*element.as_table(), name, out);
      }
    }
  }
}

}  // namespace

JobConfig::JobConfig() : table_(std::make_unique<Table>()) {}
JobConfig::~JobConfig() = default;
JobConfig::JobConfig(const JobConfig& other) : table_(std::make_unique<Table>(*other.table_)) {}
JobConfig& JobConfig::operator=(const JobConfig& other) {
  if (this != &other) table_ = std::make_unique<Table>(*other.table_);
  return *this;
}

JobConfig& JobConfig::Set(std::string_view key, std::string_view value) {
  SetValue(table_->root, key, std::string(value));
  return *this;
}
JobConfig& JobConfig::Set(std::string_view key, const char* value) { return Set(key, std::string_view(value)); }
JobConfig& JobConfig::Set(std::string_view key, int value) { return Set(key, static_cast<int64_t>(value)); }
JobConfig& JobConfig::Set(std::string_view key, int64_t value) {
  SetValue(table_->root, key, value);
  return *this;
}
JobConfig& JobConfig::Set(std::string_view key, double value) {
  SetValue(table_->root, key, value);
  return *this;
}
JobConfig& JobConfig::Set(std::string_view key, bool value) {
  SetValue(table_->root, key, value);
  return *this;
}
JobConfig& JobConfig::SetList(std::string_view key, const std::vector<double>& values) {
  toml::array list;
  for (double v : values) list.push_back(v);
  SetValue(table_->root, key, std::move(list));
  return *this;
}

JobConfig& JobConfig::Merge(std::string_view toml) {
  try {
    MergeInto(table_->root, toml::parse(toml));
  } catch (const toml::parse_error& e) {
    ADD_FAILURE() << "JobConfig::Merge: " << e.description() << " in:\n" << toml;
  }
  return *this;
}

JobConfig& JobConfig::Erase(std::string_view key) {
  std::string leaf;
  if (toml::table* t = Parent(table_->root, key, /*make=*/false, &leaf)) t->erase(leaf);
  return *this;
}

int64_t JobConfig::Int(std::string_view key) const {
  const toml::node* n = Find(table_->root, key);
  if (n == nullptr || !n->is_integer()) {
    ADD_FAILURE() << "JobConfig::Int(\"" << key << "\"): no integer there";
    return 0;
  }
  return n->as_integer()->get();
}

std::string JobConfig::String(std::string_view key) const {
  const toml::node* n = Find(table_->root, key);
  if (n == nullptr || !n->is_string()) {
    ADD_FAILURE() << "JobConfig::String(\"" << key << "\"): no string there";
    return "";
  }
  return n->as_string()->get();
}

std::string JobConfig::Toml() const {
  std::string out;
  Render(table_->root, "", &out);
  return out;
}

std::string JobConfig::Write(const std::filesystem::path& path) const {
  WriteFile(path, Toml());
  return path.string();
}

JobConfig FashionJob(const std::string& model, int steps, int servers, int workers) {
  const int port = FreePortRange(1 + servers);
  const std::string model_config =
      model.find('/') == std::string::npos ? SourcePath(fmt::format("configs/models/{}.toml", model)) : model;
  const std::string fashion = kFashionMnistDir;
  JobConfig job;
  job.Set("run.seed", 5)
      .Set("model.config", model_config)
      .Set("cluster.servers", servers)
      .Set("cluster.workers", workers)
      .Set("cluster.coordinator", fmt::format("127.0.0.1:{}", port))
      .Set("cluster.base_port", port + 1)
      .Set("cluster.heartbeat_ms", 200)
      .Set("cluster.heartbeat_timeout_ms", 2000)
      .Set("solver.base_lr", 0.01)
      .Set("solver.lr_policy", "fixed")
      .Set("worker.batch_size", 32)
      .Set("worker.steps", steps)
      .Set("worker.threads", 1)
      .Set("data.train", fashion + "/train-images-idx3-ubyte.gz")
      .Set("data.test", fashion + "/t10k-images-idx3-ubyte.gz")
      .Set("eval.every_steps", 0)
      .Set("checkpoint.every_updates", 0);
  return job;
}

JobConfig ExactUpdateJob(int servers, int workers) {
  JobConfig job;
  job.Set("cluster.servers", servers)
      .Set("cluster.workers", workers)
      .Set("cluster.coordinator", fmt::format("127.0.0.1:{}", FreePort()))
      .Set("cluster.heartbeat_ms", 100)
      .Set("cluster.heartbeat_timeout_ms", 2000)
      .Set("cluster.chunk_elems", 128)
      .Set("solver.base_lr", 1.0)
      .Set("solver.momentum", 0.0)
      .Set("solver.weight_decay", 0.0)
      .Set("checkpoint.every_updates", 0)
      .Set("checkpoint.dir", "ckpt");
  return job;
}

}  // namespace downpour::test
