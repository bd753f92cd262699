// progress.cc — see progress.h.
#include "client/worker/progress.h"

#include <unistd.h>

#include <cmath>

#include <fmt/format.h>

namespace downpour::worker {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  if (h > 0) return fmt::format("{}h{:02}m{:02}s", h, m, sec);
  if (m > 0) return fmt::format("{}m{:02}s", m, sec);
  return fmt::format("{}s", sec);
}

std::string FormatProgress(const ProgressState& p) {
  std::string line = fmt::format("w{} epoch {} step {}", p.worker_id, p.epoch, p.step);
  if (p.total_steps > 0) {
    const double frac = static_cast<double>(p.step) / static_cast<double>(p.total_steps);
    line += fmt::format("/{} ({:.0f}%)", p.total_steps, 100.0 * frac);
  }
  line += fmt::format(" {:.0f} img/s loss {:.4f}", p.images_per_s, p.loss);
  if (p.total_steps > 0 && p.step > 0 && p.elapsed_s > 0) {
    const double per_step = p.elapsed_s / static_cast<double>(p.step);
    line += " eta " + FormatDuration(per_step * static_cast<double>(p.total_steps - p.step));
  }
  return line;
}

ProgressReporter::ProgressReporter(std::FILE* out, Mode mode, double interval_s, double log_interval_s)
    : out_(out), quiet_(mode == Mode::kQuiet), tty_(out != nullptr && isatty(fileno(out))) {
  interval_s_ = tty_ ? interval_s : log_interval_s;
}

void ProgressReporter::Update(const ProgressState& p, bool force) {
  if (quiet_ || out_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (!force && shown_ && since < interval_s_) return;
  last_ = now;
  shown_ = true;
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K", FormatProgress(p).c_str());
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", FormatProgress(p).c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::Note(const std::string& line) {
  if (quiet_ || out_ == nullptr) return;
  if (line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressReporter::Finish() {
  if (line_open_ && out_ != nullptr) std::fputc('\n', out_);
  line_open_ = false;
}

}  // namespace downpour::worker
