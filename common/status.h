// status.h — the two kinds of error (STYLE.md §6).
//
//  * Recoverable errors (peer, I/O, bad input) are a Status, or a downpour::Error exception
//    where a constructor or deep call chain makes a Status awkward. Both carry a message that
//    names the file / flag / field and the offending values.
//  * Broken invariants are DP_CHECK*, which abort with file, line and values.
//
// Thread-safety: Status and Error are values; no shared state.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace downpour {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input: file, flag, config field, message field
  kNotFound,          // missing file, key, chunk
  kIoError,           // read/write/fsync failed
  kCorrupt,           // checksum, magic, version, truncated record
  kTimeout,           // wait ran out
  kUnavailable,       // peer gone, socket closed
  kFailedPrecondition,// wrong state (e.g. layout hash mismatch)
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // One factory per code below (InvalidArgument(...), NotFound(...), ...), fmt-formatted.
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status IoError(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kIoError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Corrupt(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kCorrupt, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Timeout(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kTimeout, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status FailedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}

// Typed exception for recoverable errors that must unwind (constructors, config loading).
class Error : public std::runtime_error {
 public:
  explicit Error(Status status) : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Throws downpour::Error if `s` is not ok.
inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw Error(s);
}

}  // namespace downpour

// Early-return helper for functions returning Status.
#define DP_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::downpour::Status dp_status_ = (expr);      \
    if (!dp_status_.ok()) return dp_status_;     \
  } while (0)

// Broken invariant: abort with file, line and the failed condition (and values for the
// comparison forms). Never used for bad input.
#define DP_CHECK(cond)                                                                      \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#define DP_CHECK_OP_(a, b, op)                                                              \
  do {                                                                                      \
    const auto& dp_a_ = (a);                                                                \
    const auto& dp_b_ = (b);                                                                \
    if (!(dp_a_ op dp_b_)) {                                                                \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s %s %s (%s vs %s)\n", __FILE__, __LINE__, \
                   #a, #op, #b, fmt::to_string(dp_a_).c_str(), fmt::to_string(dp_b_).c_str()); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
#define DP_CHECK_EQ(a, b) DP_CHECK_OP_(a, b, ==)
#define DP_CHECK_NE(a, b) DP_CHECK_OP_(a, b, !=)
#define DP_CHECK_LT(a, b) DP_CHECK_OP_(a, b, <)
#define DP_CHECK_LE(a, b) DP_CHECK_OP_(a, b, <=)
#define DP_CHECK_GT(a, b) DP_CHECK_OP_(a, b, >)
#define DP_CHECK_GE(a, b) DP_CHECK_OP_(a, b, >=)
