// metrics.h — JSONL metrics: one flat JSON object per line, written and flushed per event,
//   {"t":1732312345.123456,"role":"worker","id":0,"event":"step","step":10,"loss":0.53}
// "t" is wall-clock seconds since the Unix epoch (so lines of different processes of a run
// can be merged on one time axis), then role, id and event, then the caller's fields in
// order. Non-finite numbers are written as null (JSON has no NaN/inf).
//
// Also a tiny reader for such files (flat objects of strings, numbers, booleans and null),
// used by tests and tools; it is not a general JSON parser.
//
// A torn line: a write that stopped half-way (a full disk, an I/O error) leaves the start of a
// line without its end. The writer then begins its next line with a newline, and so does a
// writer that opens a file whose last line is torn, so the torn line stands alone and the lines
// after it are whole. The reader skips such a line (one that does not parse and does not end in
// '}', as every written line does) and says which; any other damage is an error.
//
// Thread-safety: MetricsWriter::Write may be called from any number of threads; each line is
// one write(2) to an O_APPEND file, so lines never interleave, even across processes sharing
// the file. The writer owns its file descriptor.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace downpour {

// One JSON scalar. Implicit constructors so fields read {"loss", 0.5}, {"step", step}.
class MetricValue {
 public:
  enum class Kind { kNull, kBool, kInt, kDouble, kString };

  MetricValue() = default;  // null
  MetricValue(bool v) : kind_(Kind::kBool), int_(v) {}
  MetricValue(int v) : kind_(Kind::kInt), int_(v) {}
  MetricValue(long v) : kind_(Kind::kInt), int_(v) {}
  MetricValue(long long v) : kind_(Kind::kInt), int_(v) {}
  MetricValue(unsigned v) : kind_(Kind::kInt), int_(v) {}
  MetricValue(unsigned long v) : kind_(Kind::kInt), int_(static_cast<int64_t>(v)) {}
  MetricValue(unsigned long long v) : kind_(Kind::kInt), int_(static_cast<int64_t>(v)) {}
  MetricValue(float v) : kind_(Kind::kDouble), double_(v) {}
  MetricValue(double v) : kind_(Kind::kDouble), double_(v) {}
  MetricValue(const char* v) : kind_(Kind::kString), string_(v) {}
  MetricValue(std::string_view v) : kind_(Kind::kString), string_(v) {}
  MetricValue(std::string v) : kind_(Kind::kString), string_(std::move(v)) {}

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kDouble; }
  // Numbers (ints widened); NaN for non-numbers.
  double AsDouble() const;
  int64_t AsInt() const { return kind_ == Kind::kDouble ? static_cast<int64_t>(double_) : int_; }
  bool AsBool() const { return int_ != 0; }
  const std::string& AsString() const { return string_; }
  // This value as JSON text.
  std::string ToJson() const;

  bool operator==(const MetricValue&) const = default;

 private:
  Kind kind_ = Kind::kNull;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
};

struct MetricField {
  std::string key;
  MetricValue value;
};

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(std::string_view s);

// The line (without '\n') for one event; pure, so tests can check the format.
std::string FormatMetricLine(double t, std::string_view role, int id, std::string_view event,
                             std::initializer_list<MetricField> fields);

class MetricsWriter {
 public:
  // Wall-clock seconds since the epoch; tests inject a fake clock.
  using Clock = std::function<double()>;

  // Opens `path` for appending (created if missing; its directory must exist).
  static Status Open(const std::string& path, std::string role, int id,
                     std::unique_ptr<MetricsWriter>* out, Clock clock = nullptr);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends one line. A failed write is returned (and counted), never thrown.
  Status Write(std::string_view event, std::initializer_list<MetricField> fields);

  // Called with every record written (its event, "t" and fields), after the line, on the writing
  // thread; it must be thread-safe as Write is. Set once, before the first Write (e.g. the
  // TensorBoard mirror, common/tensorboard.h).
  using Observer = std::function<void(std::string_view event, double t, std::initializer_list<MetricField> fields)>;
  void SetObserver(Observer observer) { observer_ = std::move(observer); }

  const std::string& path() const { return path_; }

 private:
  MetricsWriter(int fd, std::string path, std::string role, int id, Clock clock, bool torn);

  const int fd_;
  const std::string path_;
  const std::string role_;
  const int id_;
  const Clock clock_;
  Observer observer_;
  std::mutex mu_;  // serialises write(2) calls so a partial write cannot interleave
  bool torn_;      // guarded by mu_: the file's last line is torn
};

// One parsed line: key → value, plus the key order as written.
struct MetricRecord {
  std::map<std::string, MetricValue> fields;
  std::vector<std::string> keys;

  bool Has(const std::string& key) const { return fields.count(key) != 0; }
  // The value of `key`, or null if absent.
  const MetricValue& Get(const std::string& key) const;
};

// Parses one line of the format above. Errors name `where` (e.g. "file:line").
Status ParseMetricLine(std::string_view line, const std::string& where, MetricRecord* out);

// Reads every non-empty line of a JSONL file. A torn line (above) is skipped, its number put in
// `torn_lines` (if given); a line that is damaged otherwise is an error naming "file:line".
Status ReadMetrics(const std::string& path, std::vector<MetricRecord>* out, std::vector<int>* torn_lines = nullptr);

}  // namespace downpour
