// config_reference_test.cc — docs/config.md (the run-config reference) against the sections'
// rows (common/run_config.h, common/config/*.h; RunConfigKeys), so the reference cannot drift from the code:
//   * every key a row names is documented, once;
//   * every documented key has a row;
//   * each documented default equals the row's default, both parsed as TOML values with toml++
//     (same TOML type; floats compared as float32, the type the config holds them in);
//   * each documented type names the row's TOML type;
//   * a key with a fixed set of values has each of them in its meaning;
//   * every row has a one-line doc.
// An Optional row (cluster.link_gbps: absent = no emulated link, any value given must be > 0)
// is documented with the default cell `absent` (no backticks).
//
// What the test reads: the Markdown tables of docs/config.md whose header row is exactly
//   | key | type | default | meaning |
// Each row of such a table is  | `section.key` | type | `TOML value` | meaning |  (a '|' inside a
// cell is written "\|", as Markdown wants). Tables with another header (the model format's) are
// not read. A malformed row of a reference table is an error naming its line.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <toml++/toml.h>

#include "common/run_config.h"
#include "downpour_config.h"

namespace downpour {
namespace {

constexpr char kReferencePath[] = DOWNPOUR_SOURCE_DIR "/docs/config.md";
constexpr char kReferenceName[] = "docs/config.md";
constexpr std::string_view kHeaderRow = "| key | type | default | meaning |";

// One row of a reference table.
struct DocRow {
  std::string key;           // "section.key"
  std::string type;          // the type cell as written, e.g. "integer", "array of floats"
  std::string default_text;  // the default cell without its backticks: TOML, e.g. "64", "\"cpu\""
  int line = 0;              // 1-based line in the page
  bool optional = false;     // default cell "absent": a key ToToml writes only when it is set
  std::string meaning;       // the meaning cell as written
};

struct Reference {
  std::vector<DocRow> rows;
  std::vector<std::string> errors;  // malformed rows, each naming its line
  int tables = 0;                   // reference tables found
};

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// The cells of a Markdown table row, trimmed; "\|" is a literal '|' inside a cell.
std::vector<std::string> SplitRow(std::string_view line) {
  std::string row = Trim(line);
  if (row.starts_with('|')) row.erase(0, 1);
  if (row.ends_with('|') && !row.ends_with("\\|")) row.pop_back();
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(Trim(cell));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  cells.push_back(Trim(cell));
  return cells;
}

// "`text`" → "text"; false when the cell is not one code span.
bool StripBackticks(const std::string& cell, std::string* out) {
  if (cell.size() < 2 || cell.front() != '`' || cell.back() != '`') return false;
  const std::string inner = cell.substr(1, cell.size() - 2);
  if (inner.empty() || inner.find('`') != std::string::npos) return false;
  *out = inner;
  return true;
}

// "section.key" with lower-case identifiers on both sides of exactly one dot.
bool IsDottedKey(const std::string& key) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size() || key.find('.', dot + 1) != std::string::npos) {
    return false;
  }
  for (char ch : key) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.')) return false;
  }
  return true;
}

Reference ParseReference(std::string_view text, const std::string& source) {
  Reference ref;
  std::istringstream in{std::string(text)};
  std::string line;
  int line_no = 0;
  enum class State { kOutside, kSeparator, kRows } state = State::kOutside;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = Trim(line);
    if (state == State::kOutside) {
      if (t == kHeaderRow) {
        ++ref.tables;
        state = State::kSeparator;
      }
      continue;
    }
    if (state == State::kSeparator) {
      if (!t.starts_with("|") || t.find_first_not_of("|-: ") != std::string::npos) {
        ref.errors.push_back(source + ":" + std::to_string(line_no) +
                             ": expected the separator row (| --- | --- | --- | --- |) under the header");
        state = State::kOutside;
      } else {
        state = State::kRows;
      }
      continue;
    }
    if (!t.starts_with("|")) {  // the table ended
      state = State::kOutside;
      continue;
    }
    const std::string where = source + ":" + std::to_string(line_no);
    const std::vector<std::string> cells = SplitRow(t);
    if (cells.size() != 4) {
      ref.errors.push_back(where + ": a reference row needs 4 cells (key, type, default, meaning), has " +
                           std::to_string(cells.size()) + " (write a '|' inside a cell as \\|)");
      continue;
    }
    DocRow row;
    row.line = line_no;
    if (!StripBackticks(cells[0], &row.key) || !IsDottedKey(row.key)) {
      ref.errors.push_back(where + ": key cell '" + cells[0] + "' is not `section.key`");
      continue;
    }
    row.type = cells[1];
    row.meaning = cells[3];
    if (cells[2] == "absent") {
      row.optional = true;
    } else if (!StripBackticks(cells[2], &row.default_text)) {
      ref.errors.push_back(where + ": default of " + row.key + " ('" + cells[2] +
                           "') is not a TOML value in backticks");
      continue;
    }
    ref.rows.push_back(std::move(row));
  }
  return ref;
}

// The value of a TOML text, as toml++ reads `v = <text>`; false (and why) if it is not TOML.
bool ParseValue(const std::string& text, toml::table* holder, const toml::node** out, std::string* why) {
  try {
    *holder = toml::parse("v = " + text);
  } catch (const toml::parse_error& e) {
    *why = std::string(e.description());
    return false;
  }
  *out = holder->get("v");
  return *out != nullptr;
}

std::string TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    default: return "other";
  }
}

// Equal as TOML values: same type; strings, integers and booleans exactly; floats as float32
// (the config keeps them as float, and a reference writes the short decimal); arrays elementwise.
bool SameValue(const toml::node& doc, const toml::node& code, std::string* why) {
  if (doc.type() != code.type()) {
    *why = std::string("the reference's value is a TOML ") + TypeName(doc.type()) + ", the code's a " +
           TypeName(code.type());
    return false;
  }
  switch (doc.type()) {
    case toml::node_type::string:
      if (doc.as_string()->get() == code.as_string()->get()) return true;
      break;
    case toml::node_type::integer:
      if (doc.as_integer()->get() == code.as_integer()->get()) return true;
      break;
    case toml::node_type::floating_point:
      if (static_cast<float>(doc.as_floating_point()->get()) == static_cast<float>(code.as_floating_point()->get())) {
        return true;
      }
      break;
    case toml::node_type::boolean:
      if (doc.as_boolean()->get() == code.as_boolean()->get()) return true;
      break;
    case toml::node_type::array: {
      const toml::array& a = *doc.as_array();
      const toml::array& b = *code.as_array();
      if (a.size() != b.size()) {
        *why = std::string("arrays of ") + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " elements";
        return false;
      }
      for (size_t i = 0; i < a.size(); ++i) {
        if (!SameValue(*a.get(i), *b.get(i), why)) {
          *why = std::string("element ") + std::to_string(i) + ": " + *why;
          return false;
        }
      }
      return true;
    }
    default:
      *why = std::string("a ") + TypeName(doc.type()) + " is not a run-config value";
      return false;
  }
  *why = "the values differ";
  return false;
}

// The TOML type a reference's type cell names by its first word.
bool TypeOfCell(const std::string& cell, toml::node_type* out) {
  const std::string word = cell.substr(0, cell.find(' '));
  static const std::map<std::string, toml::node_type> kTypes = {
      {"integer", toml::node_type::integer}, {"float", toml::node_type::floating_point},
      {"string", toml::node_type::string},   {"boolean", toml::node_type::boolean},
      {"array", toml::node_type::array}};
  const auto it = kTypes.find(word);
  if (it == kTypes.end()) return false;
  *out = it->second;
  return true;
}

// The code's keys, as the sections' rows list them (RunConfigKeys): "section.key" → its default
// parsed as TOML; keys that are off unless given (no default) apart.
class CodeDefaults {
 public:
  CodeDefaults() : listed_(RunConfigKeys()) {
    for (const ConfigKey& k : listed_) {
      sections_.insert(k.key.substr(0, k.key.find('.')));
      by_key_[k.key] = &k;
      if (k.default_value.empty()) {
        optional_[k.key] = &k;
        continue;
      }
      holders_.push_back(std::make_unique<toml::table>(toml::parse("v = " + k.default_value)));
      keys_[k.key] = holders_.back()->get("v");
    }
  }
  const std::map<std::string, const toml::node*>& keys() const { return keys_; }
  // Keys written only when set (their rows are Optional), as "section.key" → the row.
  const std::map<std::string, const ConfigKey*>& optional() const { return optional_; }
  const std::set<std::string>& sections() const { return sections_; }
  const ConfigKey* Find(const std::string& key) const {
    const auto it = by_key_.find(key);
    return it == by_key_.end() ? nullptr : it->second;
  }
  // "key = value" as ToToml writes it, for messages.
  std::string LineOf(const std::string& dotted) const {
    const ConfigKey* k = Find(dotted);
    if (k == nullptr) return "?";
    return dotted.substr(dotted.find('.') + 1) + " = " + (k->default_value.empty() ? "(absent)" : k->default_value);
  }

 private:
  std::vector<ConfigKey> listed_;
  std::vector<std::unique_ptr<toml::table>> holders_;
  std::set<std::string> sections_;
  std::map<std::string, const ConfigKey*> by_key_;
  std::map<std::string, const toml::node*> keys_;
  std::map<std::string, const ConfigKey*> optional_;
};

std::string ReadReference() {
  std::ifstream in(kReferencePath, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class ConfigReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string text = ReadReference();
    ASSERT_FALSE(text.empty()) << kReferencePath << " is missing or empty";
    ref_ = ParseReference(text, kReferenceName);
    for (const DocRow& row : ref_.rows) documented_.emplace(row.key, &row);
  }

  Reference ref_;
  std::multimap<std::string, const DocRow*> documented_;  // key → its rows
  CodeDefaults code_;
};

TEST_F(ConfigReferenceTest, ReferenceTablesParseAndCoverEverySection) {
  for (const std::string& e : ref_.errors) ADD_FAILURE() << e;
  EXPECT_GT(ref_.tables, 0) << kReferenceName << " has no table with the header row " << kHeaderRow;
  for (const std::string& section : code_.sections()) {
    bool any = false;
    for (const DocRow& row : ref_.rows) any = any || row.key.starts_with(section + ".");
    EXPECT_TRUE(any) << kReferenceName << " documents no key of [" << section << "]";
  }
}

TEST_F(ConfigReferenceTest, EveryKeyOfTheCodeIsDocumented) {
  for (const auto& [key, node] : code_.keys()) {
    EXPECT_TRUE(documented_.count(key) > 0)
        << kReferenceName << " lacks " << key << " (its row gives `" << code_.LineOf(key)
        << "`): add a row | `" << key << "` | type | `default` | meaning |";
  }
}

TEST_F(ConfigReferenceTest, EveryKeyWrittenOnlyWhenSetIsDocumentedAsAbsent) {
  EXPECT_FALSE(code_.optional().empty()) << "cluster.link_gbps is written only when set";
  for (const auto& [key, row] : code_.optional()) {
    const auto [first, last] = documented_.equal_range(key);
    ASSERT_EQ(std::distance(first, last), 1) << kReferenceName << " must document " << key << " once";
    EXPECT_TRUE(first->second->optional) << kReferenceName << ":" << first->second->line << ": " << key
                                         << " is off unless given: its default cell is `absent`";
  }
}

TEST_F(ConfigReferenceTest, EveryDocumentedKeyExistsInTheCode) {
  for (const DocRow& row : ref_.rows) {
    if (row.optional) {
      EXPECT_TRUE(code_.optional().count(row.key) > 0)
          << kReferenceName << ":" << row.line << " documents " << row.key
          << " as absent by default, but the code writes it always or never";
      continue;
    }
    EXPECT_TRUE(code_.keys().count(row.key) > 0)
        << kReferenceName << ":" << row.line << " documents " << row.key
        << ", which no row names (common/run_config.h, common/config/*.h)";
  }
}

TEST_F(ConfigReferenceTest, EveryKeyIsDocumentedOnce) {
  for (const auto& [key, node] : code_.keys()) {
    const auto [first, last] = documented_.equal_range(key);
    if (std::distance(first, last) <= 1) continue;
    std::string lines;
    for (auto it = first; it != last; ++it) {
      lines += ' ';
      lines += std::to_string(it->second->line);
    }
    ADD_FAILURE() << key << " is documented more than once, at lines" << lines << " of " << kReferenceName;
  }
}

TEST_F(ConfigReferenceTest, DocumentedDefaultsEqualTheCodeDefaults) {
  for (const DocRow& row : ref_.rows) {
    const auto it = code_.keys().find(row.key);
    if (it == code_.keys().end()) continue;  // EveryDocumentedKeyExistsInTheCode says so
    toml::table holder;
    const toml::node* doc = nullptr;
    std::string why;
    if (!ParseValue(row.default_text, &holder, &doc, &why)) {
      ADD_FAILURE() << kReferenceName << ":" << row.line << ": default of " << row.key << " `" << row.default_text
                    << "` is not a TOML value: " << why;
      continue;
    }
    EXPECT_TRUE(SameValue(*doc, *it->second, &why))
        << kReferenceName << ":" << row.line << ": " << row.key << " is documented with default `"
        << row.default_text << "` but the code's default is `" << code_.LineOf(row.key) << "` (" << why << ")";
  }
}

TEST_F(ConfigReferenceTest, DocumentedTypesNameTheRowsType) {
  for (const DocRow& row : ref_.rows) {
    const ConfigKey* key = code_.Find(row.key);
    if (key == nullptr) continue;
    toml::node_type type{};
    if (!TypeOfCell(row.type, &type)) {
      ADD_FAILURE() << kReferenceName << ":" << row.line << ": type of " << row.key << " '" << row.type
                    << "' does not start with integer, float, string, boolean or array";
      continue;
    }
    EXPECT_EQ(TypeName(type), key->type.substr(0, key->type.find(' ')))
        << kReferenceName << ":" << row.line << ": " << row.key << " is documented as '" << row.type
        << "' but its row reads a " << key->type;
  }
}

// A key with a fixed set of values (an enum, "async" | "sync" | "ssp:<s>") is documented with
// every value it accepts, each as the quoted TOML string.
TEST_F(ConfigReferenceTest, EveryValueAKeyAcceptsIsDocumented) {
  int checked = 0;
  for (const DocRow& row : ref_.rows) {
    const ConfigKey* key = code_.Find(row.key);
    if (key == nullptr || key->choices.empty()) continue;
    ++checked;
    std::istringstream choices(key->choices);
    std::string choice;
    while (choices >> choice) {
      if (choice == "|") continue;
      const std::string bare = choice.substr(1, choice.size() - 2);  // without its quotes
      EXPECT_TRUE(row.meaning.find(choice) != std::string::npos || row.meaning.find("`" + bare) != std::string::npos)
          << kReferenceName << ":" << row.line << ": " << row.key << " accepts " << choice
          << " (its row), which its meaning does not name";
    }
  }
  EXPECT_GE(checked, 10) << "the keys with choices: transport, reply_order, lr_policy, update, mode, algorithm, ...";
}

// Every row carries its one-line doc (ToToml writes it beside the key).
TEST_F(ConfigReferenceTest, EveryRowHasADoc) {
  for (const ConfigKey& key : RunConfigKeys()) {
    EXPECT_FALSE(key.doc.empty()) << key.key << " has no doc in its row";
    EXPECT_EQ(key.doc.find('\n'), std::string::npos) << key.key << ": a row's doc is one line";
  }
}

// The parser and the comparison themselves, on small inputs, so the checks above cannot pass by
// reading nothing.
TEST(ConfigReferenceParserTest, ReadsOnlyReferenceTablesAndUnescapesPipes) {
  const std::string page =
      "# page\n"
      "| field | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n"
      "| `num_output` | integer | `0` | not a run-config key |\n"
      "\n"
      "| key | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n"
      "| `worker.batch_size` | integer | `64` | images per step |\n"
      "| `consistency.mode` | string | `\"async\"` | `\"async\"` \\| `\"sync\"` |\n"
      "after the table\n"
      "| `not.read` | integer | `1` | outside a reference table |\n";
  const Reference ref = ParseReference(page, "page.md");
  EXPECT_TRUE(ref.errors.empty()) << ref.errors.front();
  EXPECT_EQ(ref.tables, 1);
  ASSERT_EQ(ref.rows.size(), 2u);
  EXPECT_EQ(ref.rows[0].key, "worker.batch_size");
  EXPECT_EQ(ref.rows[0].default_text, "64");
  EXPECT_EQ(ref.rows[0].line, 8);
  EXPECT_EQ(ref.rows[1].key, "consistency.mode");
  EXPECT_EQ(ref.rows[1].default_text, "\"async\"");
}

TEST(ConfigReferenceParserTest, MalformedRowsAreErrorsNamingTheLine) {
  const std::string page =
      "| key | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n"
      "| worker.steps | integer | `1000` | key without backticks |\n"
      "| `worker.epochs` | integer | 0 | default without backticks |\n"
      "| `worker.device` | string | `\"cpu\"` | \"cpu\" | \"gpu:N\" unescaped pipe |\n";
  const Reference ref = ParseReference(page, "page.md");
  EXPECT_TRUE(ref.rows.empty());
  ASSERT_EQ(ref.errors.size(), 3u);
  EXPECT_NE(ref.errors[0].find("page.md:3"), std::string::npos) << ref.errors[0];
  EXPECT_NE(ref.errors[1].find("page.md:4"), std::string::npos) << ref.errors[1];
  EXPECT_NE(ref.errors[2].find("page.md:5"), std::string::npos) << ref.errors[2];
}

TEST(ConfigReferenceParserTest, ValuesCompareAsTomlWithFloatsAsFloat32) {
  auto same = [](const std::string& doc_text, const std::string& code_text) {
    toml::table a, b;
    const toml::node *doc = nullptr, *code = nullptr;
    std::string why;
    EXPECT_TRUE(ParseValue(doc_text, &a, &doc, &why)) << doc_text << ": " << why;
    EXPECT_TRUE(ParseValue(code_text, &b, &code, &why)) << code_text << ": " << why;
    return doc != nullptr && code != nullptr && SameValue(*doc, *code, &why);
  };
  EXPECT_TRUE(same("0.01", "0.01"));
  EXPECT_TRUE(same("0.1", "0.10000000149011612"));  // 0.1f written in full
  EXPECT_FALSE(same("0.1", "0.1001"));
  EXPECT_FALSE(same("0", "0.0"));  // an integer is not a float
  EXPECT_FALSE(same("\"1\"", "1"));
  EXPECT_TRUE(same("[]", "[]"));
  EXPECT_TRUE(same("[1, 2]", "[1, 2]"));
  EXPECT_FALSE(same("[1]", "[1, 2]"));
  EXPECT_FALSE(same("true", "false"));
  EXPECT_TRUE(same("\"ssp:3\"", "\"ssp:3\""));
}

}  // namespace
}  // namespace downpour
