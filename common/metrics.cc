// metrics.cc — JSONL metrics writer and its tiny reader.
#include "common/metrics.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/env.h"

namespace downpour {
namespace {

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{}", v);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Recursive-descent parser for one flat JSON object.
class LineParser {
 public:
  LineParser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  Status Parse(MetricRecord* out) {
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    SkipSpace();
    if (Eat('}')) return End();
    while (true) {
      SkipSpace();
      std::string key;
      DP_RETURN_IF_ERROR(String(&key));
      SkipSpace();
      if (!Eat(':')) return Error("expected ':' after key \"" + key + "\"");
      SkipSpace();
      MetricValue v;
      DP_RETURN_IF_ERROR(Value(&v));
      if (out->fields.count(key)) return Error("duplicate key \"" + key + "\"");
      out->fields[key] = std::move(v);
      out->keys.push_back(key);
      SkipSpace();
      if (Eat('}')) return End();
      if (!Eat(',')) return Error("expected ',' or '}'");
    }
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("{}: column {}: {}", where_, pos_ + 1, what);
  }
  Status End() {
    SkipSpace();
    return pos_ == s_.size() ? Status::Ok() : Error("trailing characters after '}'");
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }

  Status Hex4(uint32_t* cp) {
    if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
    *cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      *cp <<= 4;
      if (c >= '0' && c <= '9') *cp |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') *cp |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') *cp |= static_cast<uint32_t>(c - 'A' + 10);
      else return Error("bad hex digit in \\u escape");
    }
    return Status::Ok();
  }

  Status String(std::string* out) {
    if (!Eat('"')) return Error("expected '\"'");
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return Status::Ok();
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          DP_RETURN_IF_ERROR(Hex4(&cp));
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            uint32_t lo = 0;
            if (!EatWord("\\u")) return Error("unpaired surrogate in \\u escape");
            DP_RETURN_IF_ERROR(Hex4(&lo));
            if (lo < 0xDC00 || lo >= 0xE000) return Error("bad low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return Error(fmt::format("bad escape '\\{}'", e));
      }
    }
    return Error("unterminated string");
  }

  Status Value(MetricValue* v) {
    if (pos_ >= s_.size()) return Error("expected a value");
    const char c = s_[pos_];
    if (c == '"') {
      std::string str;
      DP_RETURN_IF_ERROR(String(&str));
      *v = MetricValue(std::move(str));
      return Status::Ok();
    }
    if (EatWord("true")) return *v = MetricValue(true), Status::Ok();
    if (EatWord("false")) return *v = MetricValue(false), Status::Ok();
    if (EatWord("null")) return *v = MetricValue(), Status::Ok();
    if (c == '-' || (c >= '0' && c <= '9')) return Number(v);
    if (c == '{' || c == '[') return Error("nested objects and arrays are not supported");
    return Error(fmt::format("unexpected character '{}'", c));
  }

  Status Number(MetricValue* v) {
    const size_t start = pos_;
    bool is_int = true;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '.' || c == 'e' || c == 'E') is_int = false;
      if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')) break;
      ++pos_;
    }
    const std::string text(s_.substr(start, pos_ - start));
    char* end = nullptr;
    errno = 0;
    if (is_int) {
      const long long i = std::strtoll(text.c_str(), &end, 10);
      if (errno == 0 && end == text.c_str() + text.size()) return *v = MetricValue(i), Status::Ok();
    }
    const double d = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || text.empty()) return Error("bad number '" + text + "'");
    *v = MetricValue(d);
    return Status::Ok();
  }

  std::string_view s_;
  const std::string& where_;
  size_t pos_ = 0;
};

}  // namespace

double MetricValue::AsDouble() const {
  if (kind_ == Kind::kInt) return static_cast<double>(int_);
  if (kind_ == Kind::kDouble) return double_;
  return std::numeric_limits<double>::quiet_NaN();
}

std::string MetricValue::ToJson() const {
  switch (kind_) {
    case Kind::kNull: return "null";
    case Kind::kBool: return int_ ? "true" : "false";
    case Kind::kInt: return fmt::format("{}", int_);
    case Kind::kDouble: return JsonNumber(double_);
    case Kind::kString: return JsonQuote(string_);
  }
  return "null";
}

std::string JsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
  return out;
}

std::string FormatMetricLine(double t, std::string_view role, int id, std::string_view event,
                             std::initializer_list<MetricField> fields) {
  // Microsecond resolution for "t": enough to order events, short enough to read.
  std::string line = std::isfinite(t) ? fmt::format("{{\"t\":{:.6f}", t) : "{\"t\":null";
  line += fmt::format(",\"role\":{},\"id\":{},\"event\":{}", JsonQuote(role), id, JsonQuote(event));
  for (const MetricField& f : fields) {
    line += ',';
    line += JsonQuote(f.key);
    line += ':';
    line += f.value.ToJson();
  }
  line += '}';
  return line;
}

MetricsWriter::MetricsWriter(int fd, std::string path, std::string role, int id, Clock clock, bool torn)
    : fd_(fd), path_(std::move(path)), role_(std::move(role)), id_(id), clock_(std::move(clock)), torn_(torn) {}

MetricsWriter::~MetricsWriter() { ::close(fd_); }

Status MetricsWriter::Open(const std::string& path, std::string role, int id,
                           std::unique_ptr<MetricsWriter>* out, Clock clock) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // read: the last byte
  if (fd < 0) return IoError("{}: cannot open metrics file: {}", path, std::strerror(errno));
  // A file whose last line is torn (its writer stopped half-way, e.g. on a full disk): the
  // first line written here starts on a line of its own.
  struct stat st {};
  char last = '\n';
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
  if (!clock) clock = WallSeconds;
  out->reset(new MetricsWriter(fd, path, std::move(role), id, std::move(clock), last != '\n'));
  return Status::Ok();
}

Status MetricsWriter::Write(std::string_view event, std::initializer_list<MetricField> fields) {
  const double t = clock_();
  std::string line = FormatMetricLine(t, role_, id_, event, fields);
  line += '\n';
  Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (torn_) line.insert(line.begin(), '\n');  // the torn line before stands alone
    size_t written = 0;
    s = WriteFully(fd_, line.data(), line.size(), path_, &written);
    if (written > 0) torn_ = line[written - 1] != '\n';
  }
  if (observer_) observer_(event, t, fields);
  return s;
}

const MetricValue& MetricRecord::Get(const std::string& key) const {
  static const MetricValue kNull;  // immutable
  auto it = fields.find(key);
  return it == fields.end() ? kNull : it->second;
}

Status ParseMetricLine(std::string_view line, const std::string& where, MetricRecord* out) {
  *out = MetricRecord();
  return LineParser(line, where).Parse(out);
}

Status ReadMetrics(const std::string& path, std::vector<MetricRecord>* out, std::vector<int>* torn_lines) {
  std::ifstream in(path);
  if (!in) return NotFound("{}: cannot open metrics file: {}", path, std::strerror(errno));
  out->clear();
  if (torn_lines != nullptr) torn_lines->clear();
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t end = line.find_last_not_of(" \t\r");
    if (end == std::string::npos) continue;
    MetricRecord r;
    Status s = ParseMetricLine(line, fmt::format("{}:{}", path, n), &r);
    if (!s.ok() && line[end] != '}') {  // torn: the start of a line whose write stopped
      if (torn_lines != nullptr) torn_lines->push_back(n);
      continue;
    }
    DP_RETURN_IF_ERROR(s);
    out->push_back(std::move(r));
  }
  return Status::Ok();
}

}  // namespace downpour
