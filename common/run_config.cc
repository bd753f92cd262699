// run_config.cc — TOML → RunConfig, validation, and RunConfig → TOML, each made from the sections'
// rows (run_config.h) by one visitor: RowReader, RowChecker, RowWriter, RowLister.
#include "common/run_config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <type_traits>

#include "common/net_address.h"


namespace downpour {
namespace {

using config::NameOf;
using config::ParseName;

// A string in double quotes with TOML/JSON basic-string escapes.
std::string Quote(std::string_view v) {
  std::string out = "\"";
  for (char ch : v) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// The value of a TOML node as it would be written in the file, for error messages.
std::string NodeText(const toml::node& node) {
  if (const auto* s = node.as_string()) return Quote(s->get());
  if (const auto* arr = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < arr->size(); ++i) out += (i ? ", " : "") + NodeText(*arr->get(i));
    return out + "]";
  }
  if (node.is_table()) return "{...}";
  if (const auto* d = node.as_floating_point()) return fmt::format("{}", d->get());  // shortest: 0.1, not 0.1000...01
  std::ostringstream os;
  node.visit([&os](const auto& v) { os << v; });
  return os.str();
}

// Reads the keys of one table and remembers which ones it consumed, so that Finish() can
// reject the rest. A missing table (nullptr) reads as all defaults.
class TableReader {
 public:
  // `overridden`: "table.key" → the --set text that gave it, so errors name the flag.
  TableReader(const toml::table* table, std::string_view name, const std::string& source,
              const std::map<std::string, std::string>& overridden)
      : table_(table), name_(name), source_(source), overridden_(overridden) {}

  const toml::node* Get(const char* key) {
    known_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }

  Status Bad(const char* key, const toml::node& node, std::string_view why) const {
    return InvalidArgument("{}: {}.{} = {}: {}", SourceOf(key), name_, key, NodeText(node), why);
  }

  template <typename T>
  Status Int(const char* key, T* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_integer()) return Bad(key, *n, "expected an integer");
    const int64_t v = n->as_integer()->get();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return Bad(key, *n, "out of range");
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }

  template <typename T>
  Status Float(const char* key, T* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (n->is_integer()) {
      *out = static_cast<T>(n->as_integer()->get());
    } else if (n->is_floating_point()) {
      *out = static_cast<T>(n->as_floating_point()->get());
    } else {
      return Bad(key, *n, "expected a number");
    }
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_boolean()) return Bad(key, *n, "expected true or false");
    *out = n->as_boolean()->get();
    return Status::Ok();
  }

  Status String(const char* key, std::string* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_string()) return Bad(key, *n, "expected a string");
    *out = n->as_string()->get();
    return Status::Ok();
  }

  Status IntList(const char* key, std::vector<int64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    const toml::array* arr = n->as_array();
    if (!arr) return Bad(key, *n, "expected an array of integers");
    out->clear();
    for (const toml::node& e : *arr) {
      if (!e.is_integer()) return Bad(key, *n, "expected an array of integers");
      out->push_back(e.as_integer()->get());
    }
    return Status::Ok();
  }

  Status FloatList(const char* key, std::vector<float>* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    const toml::array* arr = n->as_array();
    if (!arr) return Bad(key, *n, "expected an array of numbers");
    out->clear();
    for (const toml::node& e : *arr) {
      if (e.is_integer()) {
        out->push_back(static_cast<float>(e.as_integer()->get()));
      } else if (e.is_floating_point()) {
        out->push_back(static_cast<float>(e.as_floating_point()->get()));
      } else {
        return Bad(key, *n, "expected an array of numbers");
      }
    }
    return Status::Ok();
  }

  // Rejects keys this reader was never asked about.
  Status Finish() const {
    if (!table_) return Status::Ok();
    for (const auto& [k, v] : *table_) {
      if (!known_.count(std::string(k.str()))) {
        return InvalidArgument("{}: unknown key {}.{} = {} (known keys: {})", SourceOf(k.str()), name_,
                               k.str(), NodeText(v), fmt::join(known_, ", "));
      }
    }
    return Status::Ok();
  }

 private:
  std::string SourceOf(std::string_view key) const {
    const auto it = overridden_.find(fmt::format("{}.{}", name_, key));
    return it == overridden_.end() ? source_ : fmt::format("--set {}", it->second);
  }

  const toml::table* table_;
  std::string name_;
  const std::string& source_;
  const std::map<std::string, std::string>& overridden_;
  std::set<std::string> known_;
};

// What an enum setting's error says it expected: expected "a", "b" or "c" (every key's names
// are listed the same way).
std::string ExpectedNames(std::span<const std::string_view> names) {
  std::string expected = "expected ";
  for (size_t i = 0; i < names.size(); ++i) {
    expected += fmt::format("{}\"{}\"", i == 0 ? "" : i + 1 == names.size() ? " or " : ", ", names[i]);
  }
  return expected;
}

// One range rule: "<source>: <table.key> = <value>: <why>".
class Validator {
 public:
  Validator(const std::string& source, const std::map<std::string, std::string>& overridden)
      : source_(source), overridden_(overridden) {}

  template <typename T>
  Validator& Check(bool ok, std::string_view field, const T& value, std::string_view why) {
    if (ok || !status_.ok()) return *this;
    const auto it = overridden_.find(std::string(field));
    const std::string source = it == overridden_.end() ? source_ : fmt::format("--set {}", it->second);
    if constexpr (std::is_same_v<T, std::string>) {
      status_ = InvalidArgument("{}: {} = {}: {}", source, field, Quote(value), why);
    } else {
      status_ = InvalidArgument("{}: {} = {}: {}", source, field, value, why);
    }
    return *this;
  }
  Status status() const { return status_; }

 private:
  const std::string& source_;
  const std::map<std::string, std::string>& overridden_;
  Status status_;
};

// Applies one "table.key=value" override to the parsed file. The value is TOML (7, 0.5, true,
// "text", [1, 2]); text that is not valid TOML is taken as a bare string (gpu:0, /data/x).
Status ApplyOverride(const std::string& text, toml::table* root, std::map<std::string, std::string>* overridden) {
  const size_t eq = text.find('=');
  const std::string key = eq == std::string::npos ? text : text.substr(0, eq);
  const size_t dot = key.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == key.size() ||
      key.find('.', dot + 1) != std::string::npos) {
    return InvalidArgument("--set {}: expected section.key=value, e.g. --set worker.steps=500", text);
  }
  const std::string table = key.substr(0, dot), name = key.substr(dot + 1), value = text.substr(eq + 1);
  toml::node_view<toml::node> existing = (*root)[table];
  if (existing && !existing.is_table()) {
    return InvalidArgument("--set {}: '{}' is not a table in the config", text, table);
  }
  if (!existing) root->insert(table, toml::table{});
  toml::table& t = *(*root)[table].as_table();
  try {
    toml::table parsed = toml::parse("v = " + value);
    t.insert_or_assign(name, std::move(*parsed.get("v")));
  } catch (const toml::parse_error&) {
    t.insert_or_assign(name, value);
  }
  (*overridden)[key] = text;
  return Status::Ok();
}


// Shortest text that reads back to the same float/double, always with a '.' or exponent so
// TOML reads it as a float.
template <typename T>
std::string FloatText(T v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf / nan
  return s;
}

// The TOML type a member is read as and written as.
template <typename T>
constexpr std::string_view TomlType() {
  if constexpr (std::is_same_v<T, bool>) {
    return "boolean";
  } else if constexpr (std::is_integral_v<T>) {
    return "integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return "array of integers";
  } else {
    static_assert(std::is_same_v<T, std::vector<float>>, "a row's member type the config cannot hold");
    return "array of floats";
  }
}

// A member's value as TOML text: what ToToml writes and what errors show.
template <typename T>
std::string TomlText(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return fmt::format("{}", v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return FloatText(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return Quote(v);
  } else {
    std::vector<std::string> items;
    for (const auto& x : v) items.push_back(TomlText(x));
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
}

// `names` quoted and joined with " | ".
std::string Choices(std::span<const std::string_view> names) {
  std::vector<std::string> quoted;
  for (std::string_view n : names) quoted.push_back(Quote(n));
  return fmt::format("{}", fmt::join(quoted, " | "));
}

// Reads one table's rows from the TOML (the file with the --set overrides applied); the first
// wrong type or unknown name is the status.
class RowReader {
 public:
  explicit RowReader(TableReader& r) : r_(r) {}

  template <typename T, typename Rule>
  void Key(const char* key, T& member, const Rule& /*rule*/, std::string_view /*doc*/) {
    Read(key, member);
  }
  template <typename T>
  void Key(const char* key, T& member, std::string_view /*doc*/) {
    Read(key, member);
  }

  template <typename Enum>
  void Named(const char* key, Enum& member, config::Names names, std::string_view /*doc*/) {
    const toml::node* n = r_.Get(key);
    if (n == nullptr || !status_.ok()) return;
    const auto text = n->value<std::string>();
    for (size_t i = 0; text && i < names.accepted; ++i) {
      if (*text == names.all[i]) {
        member = static_cast<Enum>(i);
        return;
      }
    }
    status_ = r_.Bad(key, *n, ExpectedNames(names.all.first(names.accepted)));
  }

  template <typename Section, typename Format, typename Parse>
  void Text(const char* key, Section& s, Format /*format*/, Parse parse, std::string_view expected,
            std::string_view /*choices*/, std::string_view /*doc*/) {
    const toml::node* n = r_.Get(key);
    if (n == nullptr || !status_.ok()) return;
    const auto text = n->value<std::string>();
    if (!text || !parse(*text, &s)) status_ = r_.Bad(key, *n, expected);
  }

  template <typename Rule>
  void Optional(const char* key, double& member, const Rule& rule, std::string_view /*doc*/) {
    const toml::node* n = r_.Get(key);
    if (n == nullptr || !status_.ok()) return;
    // Absent = off; a value given must pass the rule (0 or less is a mistake, not "off").
    Read(key, member);
    if (status_.ok() && !rule.ok(member)) status_ = r_.Bad(key, *n, rule.why);
  }

  // The first error, else whether the table held a key no row names.
  Status Finish() const { return status_.ok() ? r_.Finish() : status_; }

 private:
  template <typename T>
  void Read(const char* key, T& member) {
    if (!status_.ok()) return;
    if constexpr (std::is_same_v<T, bool>) {
      status_ = r_.Bool(key, &member);
    } else if constexpr (std::is_integral_v<T>) {
      status_ = r_.Int(key, &member);
    } else if constexpr (std::is_floating_point_v<T>) {
      status_ = r_.Float(key, &member);
    } else if constexpr (std::is_same_v<T, std::string>) {
      status_ = r_.String(key, &member);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      status_ = r_.IntList(key, &member);
    } else {
      status_ = r_.FloatList(key, &member);
    }
  }

  TableReader& r_;
  Status status_;
};

// Checks every row's rule; errors name "<table>.<key>" (a model's solver: "models[i].solver").
class RowChecker {
 public:
  RowChecker(Validator& v, std::string table) : v_(v), table_(std::move(table)) {}

  template <typename T, typename Rule>
  void Key(const char* key, const T& member, const Rule& rule, std::string_view /*doc*/) {
    if (!rule.ok || rule.ok(member)) return;
    Fail(key, member, rule.why);
  }
  template <typename T>
  void Key(const char*, const T&, std::string_view) {}
  template <typename Enum>
  void Named(const char*, const Enum&, config::Names, std::string_view) {}
  template <typename Section, typename Format, typename Parse>
  void Text(const char*, const Section&, Format, Parse, std::string_view, std::string_view, std::string_view) {}
  template <typename Rule>
  void Optional(const char* key, const double& member, const Rule& rule, std::string_view /*doc*/) {
    if (member == 0 || rule.ok(member)) return;  // 0 in code = off
    Fail(key, member, rule.why);
  }

 private:
  template <typename T>
  void Fail(const char* key, const T& member, const std::string& why) {
    const std::string field = table_ + "." + key;
    if constexpr (std::is_same_v<T, std::string> || std::is_arithmetic_v<T>) {
      v_.Check(false, field, member, why);
    } else {
      v_.Check(false, field, fmt::format("[{}]", fmt::join(member, ", ")).c_str(), why);
    }
  }

  Validator& v_;
  std::string table_;
};

// Writes "key = value  # doc" for every row.
class RowWriter {
 public:
  explicit RowWriter(std::string* out) : out_(out) {}

  template <typename T, typename Rule>
  void Key(const char* key, const T& member, const Rule& /*rule*/, std::string_view doc) {
    Line(key, TomlText(member), doc);
  }
  template <typename T>
  void Key(const char* key, const T& member, std::string_view doc) {
    Line(key, TomlText(member), doc);
  }
  template <typename Enum>
  void Named(const char* key, const Enum& member, config::Names names, std::string_view doc) {
    Line(key, Quote(names.all[static_cast<size_t>(member)]), doc);
  }
  template <typename Section, typename Format, typename Parse>
  void Text(const char* key, const Section& s, Format format, Parse, std::string_view, std::string_view,
            std::string_view doc) {
    Line(key, Quote(format(s)), doc);
  }
  template <typename Rule>
  void Optional(const char* key, const double& member, const Rule&, std::string_view doc) {
    if (member > 0) {
      Line(key, TomlText(member), doc);
    } else {
      *out_ += fmt::format("# {}: {}\n", key, doc);
    }
  }

 private:
  void Line(std::string_view key, const std::string& value, std::string_view doc) {
    *out_ += fmt::format("{} = {}  # {}\n", key, value, doc);
  }
  std::string* out_;
};

// Lists every row as a ConfigKey of table `table`.
class RowLister {
 public:
  RowLister(std::vector<ConfigKey>* out, std::string table) : out_(out), table_(std::move(table)) {}

  template <typename T, typename Rule>
  void Key(const char* key, const T& member, const Rule& /*rule*/, std::string_view doc) {
    Add(key, TomlType<T>(), TomlText(member), doc, "");
  }
  template <typename T>
  void Key(const char* key, const T& member, std::string_view doc) {
    Add(key, TomlType<T>(), TomlText(member), doc, "");
  }
  template <typename Enum>
  void Named(const char* key, const Enum& member, config::Names names, std::string_view doc) {
    Add(key, "string", Quote(names.all[static_cast<size_t>(member)]), doc, Choices(names.all.first(names.accepted)));
  }
  template <typename Section, typename Format, typename Parse>
  void Text(const char* key, const Section& s, Format format, Parse, std::string_view, std::string_view choices,
            std::string_view doc) {
    Add(key, "string", Quote(format(s)), doc, choices);
  }
  template <typename Rule>
  void Optional(const char* key, const double&, const Rule&, std::string_view doc) {
    Add(key, "float", "", doc, "");
  }

 private:
  void Add(const char* key, std::string_view type, std::string value, std::string_view doc, std::string_view choices) {
    out_->push_back(ConfigKey{table_ + "." + key, std::string(type), std::move(value), std::string(doc),
                              std::string(choices)});
  }
  std::vector<ConfigKey>* out_;
  std::string table_;
};

// Reads every table that has rows; the first error is the status.
struct SectionReader {
  const toml::table& root;
  const std::string& source;
  const std::map<std::string, std::string>& overridden;
  Status status;

  template <typename S>
  void Section(const char* name, S& s) {
    if (!status.ok()) return;
    const toml::node* node = root.get(name);
    TableReader table(node ? node->as_table() : nullptr, name, source, overridden);
    RowReader rows(table);
    S::Rows(s, rows);
    status = rows.Finish();
  }
};

struct SectionChecker {
  Validator& v;
  template <typename S>
  void Section(const char* name, const S& s) {
    RowChecker rows(v, name);
    S::Rows(s, rows);
  }
};

struct SectionWriter {
  std::string* out;
  template <typename S>
  void Section(const char* name, const S& s) {
    *out += fmt::format("{}[{}]\n", out->empty() ? "" : "\n", name);
    RowWriter rows(out);
    S::Rows(s, rows);
  }
};

struct SectionLister {
  std::vector<ConfigKey>* out;
  template <typename S>
  void Section(const char* name, const S& s) {
    RowLister rows(out, name);
    S::Rows(s, rows);
  }
};

struct SectionNameList {
  std::vector<std::string> out;
  template <typename S>
  void Section(const char* name, const S&) {
    out.emplace_back(name);
  }
};

// The names of the tables that have rows, in ToToml's order.
std::vector<std::string> SectionNames() {
  SectionNameList names;
  const RunConfig defaults;
  RunConfig::Sections(defaults, names);
  return names.out;
}

// from the run's [solver].
Status ReadModels(const toml::node& node, const RunConfig& base, const std::string& source,
                  const std::map<std::string, std::string>& overridden, std::vector<ModelEntry>* out) {
  const toml::array* arr = node.as_array();
  if (arr != nullptr && arr->empty()) {
    return InvalidArgument("{}: models = []: no models (K = 0); give at least one [[models]] entry, or leave models out "
                           "for a one-model run",
                           source);
  }
  if (arr == nullptr || !arr->is_array_of_tables()) {
    return InvalidArgument("{}: models = {}: expected [[models]] tables (name, config, [models.solver])", source,
                           NodeText(node));
  }
  out->clear();
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = arr->get(i)->as_table();
    TableReader r(t, fmt::format("models[{}]", i), source, overridden);
    ModelEntry e;
    e.config = base.model.config;
    e.solver = base.solver;
    DP_RETURN_IF_ERROR(r.String("name", &e.name));
    if (!r.Get("name")) return InvalidArgument("{}: models[{}].name is missing: every model needs a name", source, i);
    DP_RETURN_IF_ERROR(r.String("config", &e.config));
    if (const toml::node* s = r.Get("solver")) {
      if (!s->is_table()) return r.Bad("solver", *s, "expected a table of [solver] keys");
      TableReader sr(s->as_table(), fmt::format("models[{}].solver", i), source, overridden);
      RowReader rows(sr);
      SolverConfig::Rows(e.solver, rows);
      DP_RETURN_IF_ERROR(rows.Finish());
    }
    DP_RETURN_IF_ERROR(r.Finish());
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

// [sweep]: "table.key = [values]" for the kSweepKeys; expands to the cross product (first key
// slowest), one model per point, named "key=value+key=value".

Status ReadSweep(const toml::table& sweep, const RunConfig& base, const std::string& source,
                 std::vector<ModelEntry>* out) {
  struct Axis {
    std::string key;  // "solver.base_lr"
    const toml::array* values;
  };
  std::vector<Axis> axes;
  for (const auto& [table, sub] : sweep) {
    const std::string prefix(table.str());
    if (!sub.is_table()) {
      return InvalidArgument("{}: sweep.{} = {}: not a sweepable key (sweepable: {})", source, prefix, NodeText(sub),
                             fmt::join(kSweepKeys, ", "));
    }
    for (const auto& [k, v] : *sub.as_table()) {
      const std::string key = prefix + "." + std::string(k.str());
      if (std::find(std::begin(kSweepKeys), std::end(kSweepKeys), key) == std::end(kSweepKeys)) {
        return InvalidArgument("{}: sweep.{} = {}: not a sweepable key (sweepable: {})", source, key, NodeText(v),
                               fmt::join(kSweepKeys, ", "));
      }
      const toml::array* arr = v.as_array();
      if (arr == nullptr) return InvalidArgument("{}: sweep.{} = {}: expected a list of values", source, key, NodeText(v));
      if (arr->empty()) {
        return InvalidArgument("{}: sweep.{} = []: an empty list gives no models (K = 0)", source, key);
      }
      const bool text = key == "model.config";
      for (const toml::node& e : *arr) {
        const bool ok = text ? e.is_string() : (e.is_integer() || (e.is_floating_point() && key != "solver.max_iter"));
        if (!ok) {
          return InvalidArgument("{}: sweep.{} = {}: expected a list of {}", source, key, NodeText(v),
                                 text ? "model TOML paths" : key == "solver.max_iter" ? "integers" : "numbers");
        }
      }
      axes.push_back({key, arr});
    }
  }
  if (axes.empty()) return InvalidArgument("{}: [sweep] is empty: no models (K = 0)", source);
  size_t points = 1;
  for (const Axis& a : axes) {
    points *= a.values->size();
    if (points > 4096) return InvalidArgument("{}: [sweep] expands to more than 4096 models", source);
  }
  out->clear();
  for (size_t p = 0; p < points; ++p) {
    ModelEntry e;
    e.config = base.model.config;
    e.solver = base.solver;
    std::vector<std::string> parts;
    size_t rest = p;
    std::vector<size_t> index(axes.size());
    for (size_t a = axes.size(); a-- > 0;) {
      index[a] = rest % axes[a].values->size();
      rest /= axes[a].values->size();
    }
    for (size_t a = 0; a < axes.size(); ++a) {
      const toml::node& v = *axes[a].values->get(index[a]);
      const std::string& key = axes[a].key;
      const std::string field = key.substr(key.find('.') + 1);
      if (key == "model.config") {
        e.config = v.as_string()->get();
        parts.push_back("config=" + std::filesystem::path(e.config).stem().string());
        continue;
      }
      // The value through the [solver] rows, as if the point's key were written in [solver].
      toml::table point;
      point.insert(field, v);
      const std::map<std::string, std::string> no_overrides;
      TableReader table(&point, "sweep.solver", source, no_overrides);
      RowReader rows(table);
      SolverConfig::Rows(e.solver, rows);
      DP_RETURN_IF_ERROR(rows.Finish());
      parts.push_back(fmt::format("{}={}", field, NodeText(v)));
    }
    e.name = fmt::format("{}", fmt::join(parts, "+"));
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

// "<prefix><digits>" with at most `max_digits` digits, into *out.
bool ParseIndexed(std::string_view text, std::string_view prefix, size_t max_digits, int* out) {
  if (!text.starts_with(prefix) || text.size() == prefix.size() || text.size() > prefix.size() + max_digits) {
    return false;
  }
  int n = 0;
  for (char ch : text.substr(prefix.size())) {
    if (ch < '0' || ch > '9') return false;
    n = n * 10 + (ch - '0');
  }
  *out = n;
  return true;
}

}  // namespace

bool IsHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  int64_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || i - colon > 5) return false;
    port = port * 10 + (s[i] - '0');
  }
  return port >= 1 && port <= 65535;
}

const char* LrPolicyName(LrPolicy policy) { return NameOf(kLrPolicyNames, policy); }
bool ParseLrPolicy(std::string_view text, LrPolicy* out) { return ParseName(kLrPolicyNames, text, out); }
const char* UpdateRuleName(UpdateRuleKind kind) { return NameOf(kUpdateRuleNames, kind); }
bool ParseUpdateRule(std::string_view text, UpdateRuleKind* out) { return ParseName(kUpdateRuleNames, text, out); }
const char* WireCodecName(WireCodec codec) { return NameOf(kWireCodecNames, codec); }
bool ParseWireCodec(std::string_view text, WireCodec* out) { return ParseName(kWireCodecNames, text, out); }
std::string AlgorithmString(Algorithm a) { return NameOf(kAlgorithmNames, a); }
bool ParseAlgorithm(std::string_view text, Algorithm* out) { return ParseName(kAlgorithmNames, text, out); }
const char* ClusterTransportName(ClusterTransport transport) { return NameOf(kClusterTransportNames, transport); }
const char* ReplyOrderName(ReplyOrder order) { return NameOf(kReplyOrderNames, order); }
const char* SendOrderName(SendOrder order) { return NameOf(kSendOrderNames, order); }
const char* RotationSchemeName(RotationScheme scheme) { return NameOf(kRotationSchemeNames, scheme); }
const char* RotationGroupsName(RotationGroups groups) { return NameOf(kRotationGroupsNames, groups); }

std::string ConsistencyModeString(const ConsistencyConfig& c) {
  switch (c.mode) {
    case ConsistencyMode::kAsync: return "async";
    case ConsistencyMode::kSync: return "sync";
    case ConsistencyMode::kSsp: return fmt::format("ssp:{}", c.staleness_bound);
  }
  return "?";
}

bool ParseConsistencyMode(std::string_view text, ConsistencyConfig* c) {
  if (text == "async" || text == "sync") {
    c->mode = text == "async" ? ConsistencyMode::kAsync : ConsistencyMode::kSync;
    c->staleness_bound = 0;
    return true;
  }
  int s = 0;
  if (!ParseIndexed(text, "ssp:", 9, &s)) return false;
  c->mode = ConsistencyMode::kSsp;
  c->staleness_bound = s;
  return true;
}

std::string DeviceString(const WorkerConfig& w) {
  return w.device == DeviceKind::kCpu ? std::string("cpu") : fmt::format("gpu:{}", w.gpu_index);
}

bool ParseDevice(std::string_view text, WorkerConfig* w) {
  if (text == "cpu") {
    w->device = DeviceKind::kCpu;
    w->gpu_index = 0;
    return true;
  }
  int index = 0;
  if (!ParseIndexed(text, "gpu:", 4, &index)) return false;
  w->device = DeviceKind::kGpu;
  w->gpu_index = index;
  return true;
}

SolverConfig RunSolver(const RunConfig& config, bool local) {
  SolverConfig s = config.solver;
  if (s.max_iter == 0) s.max_iter = std::max<int64_t>(1, config.worker.steps * (local ? 1 : std::max(1, config.cluster.workers)));
  return s;
}

SolverConfig ModelSolver(const RunConfig& config, int model) {
  SolverConfig s = config.models.at(static_cast<size_t>(model)).solver;
  if (s.max_iter == 0) {
    s.max_iter = std::max<int64_t>(1, int64_t{config.rotation.passes} * std::max(1, config.cluster.workers) *
                                          config.rotation.stage_steps);
  }
  return s;
}

RunConfig ModelRunConfig(const RunConfig& config, int model) {
  RunConfig one = config;
  one.model.config = config.models.at(static_cast<size_t>(model)).config;
  one.models.clear();
  return one;
}


bool RunHasEvaluator(const RunConfig& config) {
  return config.eval.evaluator && !config.data.test.empty() && config.models.empty();
}

int64_t EvaluatorEveryUpdates(const RunConfig& config) {
  if (config.eval.every_updates > 0) return config.eval.every_updates;
  return config.eval.every_steps * std::max(1, config.cluster.workers);
}

float EasgdAlpha(const ConsistencyConfig& c, int workers) {
  return c.easgd_alpha > 0.0f ? c.easgd_alpha : 0.9f / static_cast<float>(std::max(1, workers));
}

std::string OwnShardPath(const DataConfig& data, int worker, int workers) {
  const std::filesystem::path dir(data.train);
  const std::filesystem::path converted = dir / fmt::format("shard_{}_of_{}", worker, workers);
  std::error_code ec;
  if (std::filesystem::is_directory(converted, ec)) return converted.string();
  return (dir / std::to_string(worker)).string();
}



std::string ServerIpcPath(const ClusterConfig& cluster, const std::string& run_dir, int server) {
  std::filesystem::path dir(cluster.ipc_dir);
  if (cluster.ipc_dir.empty()) {
    dir = run_dir;
  } else if (dir.is_relative()) {
    dir = std::filesystem::path(run_dir) / dir;
  }
  return (dir / fmt::format("server-{}.sock", server)).lexically_normal().string();
}

std::string ServerAddress(const ClusterConfig& cluster, const std::string& run_dir, int server) {
  if (cluster.transport == ClusterTransport::kIpc) return IpcUrl(ServerIpcPath(cluster, run_dir, server));
  const std::string host = IsWildcardAddress(cluster.bind) ? "127.0.0.1" : cluster.bind;
  return TcpUrl(host, cluster.base_port + server);
}

Status CheckIpcPathLengths(const ClusterConfig& cluster, const std::string& run_dir) {
  if (cluster.transport != ClusterTransport::kIpc) return Status::Ok();
  // The last server has the longest name.
  const std::string path = ServerIpcPath(cluster, run_dir, cluster.servers - 1);
  if (path.size() <= kIpcPathMax) return Status::Ok();
  return InvalidArgument(
      "cluster.ipc_dir = \"{}\"{}: the socket path {} is {} bytes, longer than the {} a Unix socket path can hold; "
      "set cluster.ipc_dir to a shorter directory, e.g. \"/tmp/{}\"",
      cluster.ipc_dir, cluster.ipc_dir.empty() ? " (the run directory)" : "", path, path.size(), kIpcPathMax,
      std::filesystem::path(run_dir).filename().string());
}

std::vector<std::string> RunConfigWarnings(const RunConfig& c) {
  std::vector<std::string> out;
  const int64_t frame = c.cluster.chunk_elems * int64_t{4};
  if (frame >= kLargeFrameBytes) {
    out.push_back(fmt::format(
        "warning: cluster.chunk_elems = {} makes payload frames of {:.1f} MiB: frames of 32 MiB or more fall past "
        "glibc's mmap threshold and page-fault on every receive (measured 10x slower than 4 MiB frames); keep it "
        "near 1048576 (4 MiB)",
        c.cluster.chunk_elems, static_cast<double>(frame) / (1 << 20)));
  }
  return out;
}



namespace {

// The rules of one solver that join two keys, or a solver key and the run's: the run's
// [solver] (table "solver") or a model's ("models[i].solver"). Each key's own rule is its row's.
void CheckSolver(Validator& v, const SolverConfig& so, const RunConfig& c, const std::string& table) {
  const std::string T = table;
  v.Check(so.max_iter > 0 || so.lr_policy != LrPolicy::kPoly || c.worker.epochs == 0, T + ".max_iter", so.max_iter,
          "0 (the run's length) needs a run counted in worker.steps, not worker.epochs")
      .Check(so.lr_policy != LrPolicy::kMultistep || !so.stepvalues.empty(), T + ".stepvalues",
             fmt::format("[{}]", fmt::join(so.stepvalues, ", ")).c_str(),
             "lr_policy \"multistep\" needs at least one step value");
}

}  // namespace

Status ValidateRunConfig(const RunConfig& c, const std::string& src) { return ValidateRunConfig(c, src, {}); }

Status ValidateRunConfig(const RunConfig& c, const std::string& src,
                         const std::map<std::string, std::string>& overridden) {
  Validator v(src, overridden);
  SectionChecker rows{v};
  RunConfig::Sections(c, rows);  // each key's own rule
  // The rules that join keys.
  const auto& cl = c.cluster;
  const auto& co = c.consistency;
  const auto& wo = c.worker;
  const auto& da = c.data;
  v.Check(cl.base_port >= 1 && cl.base_port + cl.servers - 1 <= 65535, "cluster.base_port", cl.base_port,
          fmt::format("servers use base_port..base_port+{}, must lie in 1..65535", cl.servers - 1))
      .Check(cl.heartbeat_timeout_ms > cl.heartbeat_ms, "cluster.heartbeat_timeout_ms", cl.heartbeat_timeout_ms,
             fmt::format("must be > cluster.heartbeat_ms ({})", cl.heartbeat_ms))
      .Check(cl.server_wait_ms > cl.heartbeat_timeout_ms, "cluster.server_wait_ms", cl.server_wait_ms,
             fmt::format("must be > cluster.heartbeat_timeout_ms ({})", cl.heartbeat_timeout_ms))
      .Check(cl.max_workers == 0 || cl.max_workers >= cl.workers, "cluster.max_workers", cl.max_workers,
             fmt::format("must be 0 (= workers) or >= cluster.workers ({})", cl.workers))
      .Check(cl.transport != ClusterTransport::kIpc || IsLoopbackLiteral(cl.bind) || cl.bind == "localhost",
             "cluster.transport", std::string(ClusterTransportName(cl.transport)),
             fmt::format("ipc reaches processes on this host only, but cluster.bind = \"{}\" is for a job across "
                         "hosts: use transport = \"tcp\" or a loopback cluster.bind",
                         cl.bind))
      .Check(cl.inflight_mb < cl.peer_queue_mb, "cluster.inflight_mb", cl.inflight_mb,
             fmt::format("must be < cluster.peer_queue_mb ({}): a server drops a peer whose unsent replies "
                         "outgrow that, and a worker asks for up to this much per connection",
                         cl.peer_queue_mb))
      .Check(cl.reply_order == ReplyOrder::kArrival || cl.link_gbps > 0, "cluster.reply_order",
             std::string(ReplyOrderName(cl.reply_order)),
             "\"step\" orders replies on an emulated link: it needs cluster.link_gbps (on a real network the NIC "
             "decides; not implemented)");
  v.Check(!c.checkpoint.history || c.checkpoint.wal, "checkpoint.history", c.checkpoint.history,
          "the history is the servers' write-ahead logs: it needs checkpoint.wal = true")
      .Check(!c.checkpoint.history || c.models.empty(), "checkpoint.history", c.checkpoint.history,
             "is kept for single-model runs only (this run trains [[models]])");
  CheckSolver(v, c.solver, c, "solver");
  v.Check(co.staleness_bound >= 0, "consistency.mode", ConsistencyModeString(co), "staleness bound must be >= 0")
      .Check(co.backup_workers == 0 || co.mode == ConsistencyMode::kSync, "consistency.backup_workers",
             co.backup_workers,
             fmt::format("only mode \"sync\" has backup workers (mode is \"{}\")", ConsistencyModeString(co)))
      .Check(co.backup_workers < cl.workers, "consistency.backup_workers", co.backup_workers,
             fmt::format("must be < cluster.workers ({})", cl.workers))
      .Check(!co.staleness_aware_lr || co.mode != ConsistencyMode::kSync, "consistency.staleness_aware_lr",
             co.staleness_aware_lr, "applies to async and ssp only (sync has no staleness)")
      .Check(!ExchangesModels(co.algorithm) || co.mode == ConsistencyMode::kAsync, "consistency.algorithm",
             AlgorithmString(co.algorithm),
             fmt::format("\"{}\" exchanges asynchronously: it needs mode \"async\"", AlgorithmString(co.algorithm)))
      .Check(!ExchangesModels(co.algorithm) || !co.staleness_aware_lr, "consistency.staleness_aware_lr",
             co.staleness_aware_lr,
             fmt::format("does not apply to \"{}\" (workers step with their own lr)", AlgorithmString(co.algorithm)))
      .Check(!DelayCompensated(co.algorithm) || co.mode != ConsistencyMode::kSync, "consistency.algorithm",
             AlgorithmString(co.algorithm),
             fmt::format("\"{}\" compensates delays; mode \"sync\" has none (use async or ssp:<s>)",
                         AlgorithmString(co.algorithm)))
      .Check(wo.outstanding_steps == 1 || !DelayCompensated(co.algorithm) || co.mode != ConsistencyMode::kAsync,
             "worker.outstanding_steps", wo.outstanding_steps,
             fmt::format("must be 1 with consistency.algorithm = \"{}\": its servers compensate from the weights "
                         "they last sent a worker, and a step that may lack its own last pushes computes on older ones",
                         AlgorithmString(co.algorithm)))
      .Check(wo.gpu_index >= 0, "worker.device", DeviceString(wo), "GPU index must be >= 0")
      .Check(wo.straggler >= -1 && wo.straggler < cl.workers, "worker.straggler", wo.straggler,
             fmt::format("must be a worker id (0..{}) or -1 (none)", cl.workers - 1))
      .Check(wo.emulate_ms.size() % 2 == 0, "worker.emulate_ms", fmt::format("{} values", wo.emulate_ms.size()).c_str(),
             "expected a forward and a backward ms per layer (an even count)")
      .Check(da.pad == 0 || !(da.train.ends_with("idx3-ubyte") || da.train.ends_with("idx3-ubyte.gz")), "data.pad",
             da.pad, "needs an LMDB data.train (IDX files are read without augmentation; downpour-data convert-idx)")
      .Check(da.mean_file.empty() || da.mean_values.empty(), "data.mean_values",
             fmt::format("[{}]", fmt::join(da.mean_values, ", ")).c_str(),
             fmt::format("give either data.mean_file ({}) or data.mean_values, not both", Quote(da.mean_file)))
      .Check(!ExchangesModels(co.algorithm) || !c.compression.factors, "compression.factors", c.compression.factors,
             fmt::format("\"{}\" workers push no gradients (their exchanges are dense weight differences): turn it "
                         "off",
                         AlgorithmString(co.algorithm)))
      .Check(!ExchangesModels(co.algorithm) || c.compression.push == WireCodec::kFp32, "compression.push",
             WireCodecName(c.compression.push),
             fmt::format("\"{}\" exchanges must be exact: use \"fp32\"", AlgorithmString(co.algorithm)));
  // Several models (docs/multi_model.md).
  const auto& ro = c.rotation;
  if (!c.models.empty()) {
    v.Check(ro.scheme != RotationScheme::kPipeline || da.sharding == DataSharding::kOwn, "data.sharding",
            std::string(kDataShardingNames[static_cast<size_t>(da.sharding)]),
            "rotation.scheme = \"pipeline\" moves models, not data: every worker reads its own partition "
            "(data.sharding = \"own\", downpour-data convert-* --shards W)")
        .Check(wo.push_every == 1, "worker.push_every", wo.push_every,
               "must be 1 with [[models]] (a stage's local SGD updates after every batch)")
        .Check(co.mode == ConsistencyMode::kAsync || ro.stage_steps > 0, "consistency.mode", ConsistencyModeString(co),
               "sync and ssp with [[models]] need rotation.stage_steps > 0: every worker must take the same steps "
               "on a model (partitions may differ by a record)")
        .Check(!ExchangesModels(co.algorithm), "consistency.algorithm", AlgorithmString(co.algorithm),
               fmt::format("\"{}\" keeps worker-local weights, which a model moving between workers would lose: "
                           "not with [[models]]",
                           AlgorithmString(co.algorithm)));
    // A pipeline with K < W: each stage's holders of a model train it together through the
    // servers (rotation.h); the servers find a stage's holders from the model's version.
    const int K = static_cast<int>(c.models.size());
    if (ro.scheme == RotationScheme::kPipeline && K < cl.workers && ro.groups == RotationGroups::kDataParallel) {
      v.Check(ro.stage_steps > 0, "rotation.stage_steps", ro.stage_steps,
              fmt::format("a pipeline of {} models on {} workers trains each stage's holders of a model together "
                          "(rotation.groups = \"data_parallel\"): they must take the same steps; set stage_steps > 0 "
                          "(or groups = \"average\")",
                          K, cl.workers))
          .Check(co.mode != ConsistencyMode::kSsp, "consistency.mode", ConsistencyModeString(co),
                 "ssp bounds the clocks of all of a model's workers, but a pipeline's holders of a model change "
                 "every stage: use \"async\" or \"sync\" (or rotation.groups = \"average\")")
          .Check(co.backup_workers < cl.workers / K, "consistency.backup_workers", co.backup_workers,
                 fmt::format("must be < the smallest group of holders of a model in a stage ({} = {} workers / {} "
                             "models)",
                             cl.workers / K, cl.workers, K));
    }
  }
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < c.models.size(); ++i) {
    const ModelEntry& m = c.models[i];
    const std::string at = fmt::format("models[{}]", i);
    const bool charset = std::all_of(m.name.begin(), m.name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '=' || ch == '+' ||
             ch == '-';
    });
    v.Check(!m.name.empty() && m.name.size() <= 128 && charset, at + ".name", m.name,
            "must be 1..128 letters, digits or _ . = + - (it names the model's files)")
        .Check(!m.config.empty(), at + ".config", m.config, "must name a model TOML");
    const auto [it, fresh] = names.emplace(m.name, i);
    v.Check(fresh, at + ".name", m.name, fmt::format("the same name as models[{}]: model names must differ", it->second));
    RowChecker solver_rows(v, at + ".solver");
    SolverConfig::Rows(m.solver, solver_rows);
    CheckSolver(v, m.solver, c, at + ".solver");
    v.Check(m.solver.max_iter > 0 || m.solver.lr_policy != LrPolicy::kPoly || ro.stage_steps > 0,
            at + ".solver.max_iter", m.solver.max_iter,
            "0 (the run's length) needs rotation.stage_steps > 0 (a model's planned batches); give max_iter");
  }
  return v.status();
}

Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, RunConfig* out) {
  return ParseRunConfig(toml_text, source_name, {}, out);
}

Status ParseRunConfig(std::string_view toml_text, const std::string& source_name, const std::vector<std::string>& sets,
                      RunConfig* out) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return InvalidArgument("{}:{}:{}: TOML syntax error: {}", source_name, where.line,
                           where.column, e.description());
  }
  std::map<std::string, std::string> overridden;  // "table.key" → the --set text
  for (const std::string& set : sets) DP_RETURN_IF_ERROR(ApplyOverride(set, &root, &overridden));
  const std::vector<std::string> tables = SectionNames();
  for (const auto& [key, node] : root) {
    if (key.str() == "models") continue;  // [[models]]: an array of tables, read below
    const bool known = key.str() == "sweep" || std::find(tables.begin(), tables.end(), key.str()) != tables.end();
    if (!known) {
      std::string source = source_name;
      for (const auto& [k, text] : overridden) {
        if (k.starts_with(std::string(key.str()) + ".")) source = "--set " + text;
      }
      return InvalidArgument("{}: unknown {} '{}' (known tables: {}, sweep, [[models]])", source,
                             node.is_table() ? "table" : "top-level key", key.str(), fmt::join(tables, ", "));
    }
    if (!node.is_table()) {
      return InvalidArgument("{}: '{}' = {} must be a table [{}]", source_name, key.str(),
                             NodeText(node), key.str());
    }
  }
  RunConfig c;
  SectionReader reader{root, source_name, overridden, Status::Ok()};
  RunConfig::Sections(c, reader);
  DP_RETURN_IF_ERROR(reader.status);
  // Several models: [[models]] entries or a [sweep], over the [model] and [solver] just read.
  const toml::node* models = root.get("models");
  const toml::table* sweep = root["sweep"].as_table();
  if (models && sweep) {
    return InvalidArgument("{}: give [[models]] or [sweep], not both (a sweep expands to the models itself)", source_name);
  }
  if (models) DP_RETURN_IF_ERROR(ReadModels(*models, c, source_name, overridden, &c.models));
  if (sweep) DP_RETURN_IF_ERROR(ReadSweep(*sweep, c, source_name, &c.models));
  DP_RETURN_IF_ERROR(ValidateRunConfig(c, source_name, overridden));
  *out = std::move(c);
  return Status::Ok();
}

Status LoadRunConfig(const std::string& path, RunConfig* out) { return LoadRunConfig(path, {}, out); }

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& sets, RunConfig* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("{}: cannot open run config: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("{}: read failed", path);
  return ParseRunConfig(text.str(), path, sets, out);
}

std::string ToToml(const RunConfig& c) {
  std::string s;
  SectionWriter sections{&s};
  RunConfig::Sections(c, sections);
  s = "# Run configuration as used (written by ToToml; every field explicit, its doc beside it).\n" + s;
  for (const ModelEntry& m : c.models) {  // a [sweep] is stored expanded
    s += fmt::format("\n[[models]]\nname = {}\nconfig = {}\n[models.solver]\n", Quote(m.name), Quote(m.config));
    RowWriter rows(&s);
    SolverConfig::Rows(m.solver, rows);
  }
  return s;
}

std::vector<ConfigKey> RunConfigKeys() {
  std::vector<ConfigKey> out;
  SectionLister sections{&out};
  const RunConfig defaults;
  RunConfig::Sections(defaults, sections);
  return out;
}

}  // namespace downpour
