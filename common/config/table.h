// config/table.h — the rows a run-config section describes its keys with. A section struct
// (common/run_config.h) holds its members, each default as the member's initializer, and one
// static `Rows(self, visitor)` that lists every key once:
//
//   v.Key("every_updates", s.every_updates, AtLeast<int64_t>(0, "0 = off"), "checkpoint every n ...");
//
// name, member, rule, one-line doc. Reading a table (and so `--set`), the per-key checks, ToToml,
// the key listing and the docs/config.md test walk these rows with visitors of their own
// (common/run_config.cc); nothing else names a key. Rules that join two keys stay in
// ValidateRunConfig.
//
// The row kinds a visitor takes:
//   Key(name, member, [rule,] doc)            int, int64_t, float, double, bool, string, or a list
//                                             of int64_t / float
//   Named(name, member, names, doc)           an enum written as names[index], index = the enum's value
//   Text(name, self, format, parse, expected, doc)
//                                             a string key that sets more than one member ("ssp:4")
//   Optional(name, member, rule, doc)         a double that is off (0) when absent; a value given
//                                             must pass the rule, and ToToml writes it only when set
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace downpour::config {

// A check of one value: ok(value), else the error says `why` ("must be >= 1").
template <typename T>
struct Rule {
  std::function<bool(const T&)> ok;
  std::string why;
};

// A predicate and what the error says.
template <typename T, typename Pred>
Rule<T> Must(Pred pred, std::string why) {
  return {std::function<bool(const T&)>(std::move(pred)), std::move(why)};
}

// "must be >= min", with "(note)" when given.
template <typename T>
Rule<T> AtLeast(T min, std::string_view note = "") {
  std::string why = fmt::format("must be >= {}", min);
  if (!note.empty()) why += fmt::format(" ({})", note);
  return {[min](const T& x) { return x >= min; }, std::move(why)};
}

// "must be in lo..hi", with "(note)" when given.
template <typename T>
Rule<T> InRange(T lo, T hi, std::string_view note = "") {
  std::string why = fmt::format("must be in {}..{}", lo, hi);
  if (!note.empty()) why += fmt::format(" ({})", note);
  return {[lo, hi](const T& x) { return x >= lo && x <= hi; }, std::move(why)};
}

// A finite number > 0: "must be finite and > 0".
template <typename T>
Rule<T> FinitePositive(std::string_view note = "") {
  std::string why = "must be finite and > 0";
  if (!note.empty()) why += fmt::format(" ({})", note);
  return {[](const T& x) { return std::isfinite(x) && x > 0; }, std::move(why)};
}

// A finite number >= 0: "must be finite and >= 0".
template <typename T>
Rule<T> FiniteNonNegative(std::string_view note = "") {
  std::string why = "must be finite and >= 0";
  if (!note.empty()) why += fmt::format(" ({})", note);
  return {[](const T& x) { return std::isfinite(x) && x >= 0; }, std::move(why)};
}

// A non-empty string.
inline Rule<std::string> NonEmpty(std::string why = "must be non-empty") {
  return {[](const std::string& s) { return !s.empty(); }, std::move(why)};
}

// The names of an enum's values in its order, and how many of the first are accepted when read
// (compression.pull takes only the dense codecs, which come first).
struct Names {
  std::span<const std::string_view> all;
  size_t accepted = all.size();
};

// An enum's name: its value is its name's index in `names`.
template <typename Enum>
const char* NameOf(std::span<const std::string_view> names, Enum value) {
  return names[static_cast<size_t>(value)].data();
}

// The enum value whose name `text` is; false if none.
template <typename Enum>
bool ParseName(std::span<const std::string_view> names, std::string_view text, Enum* out) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) {
      *out = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

}  // namespace downpour::config
