// trace.cc — see trace.h.
#include "common/trace.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "common/file_io.h"
#include "common/metrics.h"

namespace downpour {

namespace {

int64_t SteadyNanos(TraceLog::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void AppendArgs(std::string* out, const TraceArg* args, size_t n) {
  out->append(",\"args\":{");
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{}:{}", JsonQuote(args[i].key), MetricValue(args[i].value).ToJson());
  }
  out->push_back('}');
}

}  // namespace

TraceLog::TraceLog(std::string process, size_t capacity)
    : process_(std::move(process)),
      capacity_(capacity),
      pid_(static_cast<int>(::getpid())),
      steady0_ns_(SteadyNanos(Clock::now())),
      wall0_us_(1e-3 * static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count())) {}

void TraceLog::SetProcess(std::string process) {
  std::lock_guard<std::mutex> lock(mu_);
  process_ = std::move(process);
}

std::string TraceLog::process() const {
  std::lock_guard<std::mutex> lock(mu_);
  return process_;
}

int TraceLog::Thread(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_.push_back(std::move(name));
  return static_cast<int>(threads_.size()) - 1;
}

void TraceLog::Span(int tid, const char* cat, const char* name, Clock::time_point begin, Clock::time_point end,
                    std::initializer_list<TraceArg> args) {
  if (on()) Record(tid, cat, name, 0, begin, end, args.begin(), args.size());
}

void TraceLog::Async(int tid, const char* cat, const char* name, uint64_t id, Clock::time_point begin,
                     Clock::time_point end, std::initializer_list<TraceArg> args) {
  if (on()) Record(tid, cat, name, id == 0 ? NextId() : id, begin, end, args.begin(), args.size());
}

void TraceLog::Record(int tid, const char* cat, const char* name, uint64_t id, Clock::time_point begin,
                      Clock::time_point end, const TraceArg* args, size_t nargs) {
  Event e{cat,
          name,
          SteadyNanos(begin),
          std::max(SteadyNanos(begin), SteadyNanos(end)),
          id,
          tid,
          static_cast<uint8_t>(std::min(nargs, kMaxArgs)),
          {}};
  std::copy(args, args + e.nargs, e.args.begin());
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

size_t TraceLog::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

uint64_t TraceLog::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

double TraceLog::WallMicros(int64_t steady_ns) const {
  return wall0_us_ + 1e-3 * static_cast<double>(steady_ns - steady0_ns_);
}

std::string TraceLog::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out.reserve(200 + events_.size() * 160);
  out.append("{\"traceEvents\":[\n");
  fmt::format_to(std::back_inserter(out),
                 "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":{}}}}}", pid_,
                 JsonQuote(process_));
  for (size_t t = 0; t < threads_.size(); ++t) {
    fmt::format_to(std::back_inserter(out),
                   ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}", pid_,
                   t, JsonQuote(threads_[t]));
  }
  for (const Event& e : events_) {
    const std::string cat = JsonQuote(e.cat);
    const std::string name = JsonQuote(e.name);
    if (e.id == 0) {
      fmt::format_to(std::back_inserter(out),
                     ",\n{{\"ph\":\"X\",\"cat\":{},\"name\":{},\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}", cat,
                     name, pid_, e.tid, WallMicros(e.begin_ns), 1e-3 * static_cast<double>(e.end_ns - e.begin_ns));
      AppendArgs(&out, e.args.data(), e.nargs);
      out.push_back('}');
      continue;
    }
    fmt::format_to(std::back_inserter(out),
                   ",\n{{\"ph\":\"b\",\"cat\":{},\"name\":{},\"id\":\"{:#x}\",\"pid\":{},\"tid\":{},\"ts\":{:.3f}", cat,
                   name, e.id, pid_, e.tid, WallMicros(e.begin_ns));
    AppendArgs(&out, e.args.data(), e.nargs);
    fmt::format_to(std::back_inserter(out),
                   "}},\n{{\"ph\":\"e\",\"cat\":{},\"name\":{},\"id\":\"{:#x}\",\"pid\":{},\"tid\":{},\"ts\":{:.3f}}}",
                   cat, name, e.id, pid_, e.tid, WallMicros(e.end_ns));
  }
  fmt::format_to(
      std::back_inserter(out),
      "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"process\":{},\"pid\":{},\"events\":{},\"dropped\":{},"
      "\"capacity\":{}}}}}\n",
      JsonQuote(process_), pid_, events_.size(), dropped_, capacity_);
  return out;
}

Status TraceLog::Write(const std::string& path) const {
  if (!on()) return Status::Ok();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("trace {}: cannot create directory {}: {}", path, dir.string(), ec.message());
  return WriteFileAtomic(path, ToJson(), Durability::kProcessCrash);
}

std::string TracePath(const std::string& run_dir, const std::string& name) {
  return (std::filesystem::path(run_dir) / "trace" / (name + ".json")).string();
}

void WriteTraceFile(const TraceLog& trace, const std::string& run_dir, const std::string& name) {
  if (!trace.on()) return;
  const std::string path = TracePath(run_dir, name);
  const Status s = trace.Write(path);
  if (!s.ok()) {
    spdlog::error("{}: timeline not written: {}", trace.process(), s.ToString());
    return;
  }
  const uint64_t dropped = trace.dropped();
  spdlog::info("{}: timeline {} ({} events{})", trace.process(), path, trace.size(),
               dropped > 0 ? fmt::format(", {} more dropped past cluster.trace_events", dropped) : std::string());
}

void TraceSpan::Arg(const char* key, double value) {
  if (log_ == nullptr) return;
  for (size_t i = 0; i < nargs_; ++i) {
    if (args_[i].key == key) {
      args_[i].value = value;
      return;
    }
  }
  if (nargs_ < args_.size()) args_[nargs_++] = TraceArg{key, value};
}

void TraceSpan::End() {
  if (log_ == nullptr) return;
  log_->Record(tid_, cat_, name_, 0, begin_, TraceLog::Clock::now(), args_.data(), nargs_);
  log_ = nullptr;
}

}  // namespace downpour
