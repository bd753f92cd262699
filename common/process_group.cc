// process_group.cc — fork/exec children into their own process groups, forward their output
// line by line, restart or give up children that die (their ChildSpec's policy), and stop them
// all (SIGTERM, grace, SIGKILL) when the job ends.
#include "common/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace downpour {

namespace {
constexpr size_t kMaxLine = 64 * 1024;  // longer lines are forwarded in pieces
constexpr int kTickMs = 50;             // reap / deadline / restart check interval
using Clock = std::chrono::steady_clock;

// Before restart n (1-based): 200 ms, 400 ms, 800 ms, then 1 s. Long enough that a child that
// dies at once does not spin, short next to what a job loses while a server is down.
std::chrono::milliseconds Backoff(int n) {
  return std::chrono::milliseconds(std::min(1000, 200 << std::min(n - 1, 3)));
}

// 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st.
std::string Ordinal(int n) {
  const int tens = n % 100, ones = n % 10;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th" : ones == 1 ? "st" : ones == 2 ? "nd" : ones == 3 ? "rd" : "th";
  return fmt::format("{}{}", n, suffix);
}

// "server 1 was killed by signal 9 (Killed)" or "worker 1 exited with code 3".
std::string HowItEnded(const std::string& name, int exit_code, int term_signal) {
  if (term_signal != 0) return fmt::format("{} was killed by signal {} ({})", name, term_signal, strsignal(term_signal));
  return fmt::format("{} exited with code {}", name, exit_code);
}
}  // namespace

struct ProcessGroup::Child {
  ChildSpec spec;
  pid_t pid = -1;
  int out_fd = -1;  // read end of the child's stdout+stderr pipe; -1 after EOF
  int log_fd = -1;  // raw log, or -1
  std::string partial;  // output received after the last newline
  std::string last_error;  // its latest "[error]" / "[critical]" line's message: why it died, most often
  Clock::time_point started{};    // of the running (or last) incarnation
  Clock::time_point died_at{};    // of the last death
  bool restart_pending = false;   // dead, to be started again at restart_at
  Clock::time_point restart_at{};

  ~Child() {
    if (out_fd >= 0) ::close(out_fd);
    if (log_fd >= 0) ::close(log_fd);
  }
};

ProcessGroup::ProcessGroup(ProcessGroupOptions options) : options_(std::move(options)), created_(Clock::now()) {
  if (!options_.output) {
    options_.output = [](std::string_view line) {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    };
  }
  if (options_.handle_signals) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &mask, &old_mask_);
    signal_fd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  }
}

ProcessGroup::~ProcessGroup() {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!results_[i].exited) {
      ::killpg(children_[i]->pid, SIGKILL);
      int status = 0;
      ::waitpid(children_[i]->pid, &status, 0);
    }
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (options_.handle_signals) pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

double ProcessGroup::Since(Clock::time_point t) const {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Status ProcessGroup::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("child \"{}\": empty command line", spec.name);
  if (spec.max_restarts < 0) {
    return InvalidArgument("child \"{}\": max_restarts = {}; must be >= 0", spec.name, spec.max_restarts);
  }
  auto child = std::make_unique<Child>();
  child->spec = spec;
  if (child->spec.restart_argv.empty()) child->spec.restart_argv = spec.argv;
  if (!spec.log_path.empty()) {
    child->log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (child->log_fd < 0) {
      return IoError("child \"{}\": cannot open log file {}: {}", spec.name, spec.log_path,
                     std::strerror(errno));
    }
  }
  DP_RETURN_IF_ERROR(Spawn(spec.name, spec.argv, &child->pid, &child->out_fd));
  child->started = Clock::now();
  ChildResult r;
  r.name = spec.name;
  r.pid = child->pid;
  results_.push_back(r);
  children_.push_back(std::move(child));
  return Status::Ok();
}

// fork + exec of one incarnation; *out_fd is the (non-blocking) read end of its output pipe.
Status ProcessGroup::Spawn(const std::string& name, const std::vector<std::string>& args, pid_t* pid_out,
                           int* out_fd) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return IoError("pipe: {}", std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return IoError("pipe: {}", std::strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    return IoError("child \"{}\": fork failed: {}", name, std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(out_pipe[1], 2);
    ::execvp(argv[0], argv.data());
    const int e = errno;
    [[maybe_unused]] ssize_t ignored = ::write(err_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n > 0) {  // exec failed: the child wrote errno and exits 127
    ::close(out_pipe[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return NotFound("child \"{}\": cannot run {}: {}", name, args[0], std::strerror(exec_errno));
  }
  ::fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  *out_fd = out_pipe[0];
  *pid_out = pid;
  return Status::Ok();
}

void ProcessGroup::Emit(const std::string& name, std::string_view line) {
  options_.output(fmt::format("[{}] {}", name, line));
}

void ProcessGroup::EmitFrom(Child& c, std::string_view line) {
  Emit(c.spec.name, line);
  // spdlog's pattern, "[time] [level] message", or a program's last words, "program: CODE:
  // message" (common/cli.h). The last such line names the cause in the line that reports the
  // job's end (a full disk, a port taken, a bad config).
  for (std::string_view marker : {std::string_view("] [error] "), std::string_view("] [critical] ")}) {
    if (const size_t at = line.find(marker); at != std::string_view::npos) {
      c.last_error.assign(line.substr(at + marker.size(), 400));
      return;
    }
  }
  if (line.rfind("downpour-", 0) != 0) return;
  for (int k = static_cast<int>(StatusCode::kInvalidArgument); k <= static_cast<int>(StatusCode::kInternal); ++k) {
    const std::string code = std::string(StatusCodeName(static_cast<StatusCode>(k))) + ": ";
    if (line.find(code) != std::string_view::npos) {
      c.last_error.assign(line.substr(0, 400));
      return;
    }
  }
}

// An event about child i as it stands now (its latest run): name, pid, how it ended, when,
// and its restarts so far; the caller fills in what is particular to the event.
ChildEvent ProcessGroup::NewEvent(ChildEvent::Kind kind, size_t i) const {
  const ChildResult& r = results_[i];
  ChildEvent e;
  e.kind = kind;
  e.child = r.name;
  e.pid = r.pid;
  e.exit_code = r.exit_code;
  e.term_signal = r.term_signal;
  e.seconds = Since(created_);
  e.restart = r.restarts;
  e.max_restarts = children_[i]->spec.max_restarts;
  return e;
}

void ProcessGroup::Report(ChildEvent event) {
  if (!event.line.empty()) Emit("launch", event.line);
  if (options_.on_event) options_.on_event(event);
}

void ProcessGroup::DrainOutput(Child& c, bool eof_expected) {
  if (c.out_fd < 0) return;
  char buf[16384];
  while (true) {
    const ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !eof_expected) return;
    if (n <= 0) {  // EOF, an error, or (eof_expected) nothing left from a dead group
      if (!c.partial.empty()) {
        EmitFrom(c, c.partial);
        if (c.log_fd >= 0) {  // its bytes are logged already; end the line
          [[maybe_unused]] ssize_t w = ::write(c.log_fd, "\n", 1);
        }
        c.partial.clear();
      }
      ::close(c.out_fd);
      c.out_fd = -1;
      return;
    }
    if (c.log_fd >= 0) {
      [[maybe_unused]] ssize_t w = ::write(c.log_fd, buf, static_cast<size_t>(n));
    }
    c.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = c.partial.find('\n', start)) != std::string::npos) {
      EmitFrom(c, std::string_view(c.partial).substr(start, nl - start));
      start = nl + 1;
    }
    c.partial.erase(0, start);
    while (c.partial.size() >= kMaxLine) {
      EmitFrom(c, std::string_view(c.partial).substr(0, kMaxLine));
      c.partial.erase(0, kMaxLine);
    }
  }
}

void ProcessGroup::SignalLive(int sig) {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!results_[i].exited) ::killpg(children_[i]->pid, sig);
  }
}

void ProcessGroup::BeginStop(std::string reason, int code) {
  if (stopping_) return;
  stopping_ = true;
  reason_ = std::move(reason);
  exit_code_ = code;
  for (size_t i = 0; i < children_.size(); ++i) {
    children_[i]->restart_pending = false;  // stopping never restarts anything
    if (!results_[i].exited) results_[i].stopped_by_us = true;
  }
  SignalLive(SIGTERM);
  kill_at_ = Clock::now() + options_.grace_period;
}

void ProcessGroup::ReapExited() {
  for (size_t i = 0; i < children_.size(); ++i) {
    ChildResult& r = results_[i];
    if (r.exited) continue;
    int status = 0;
    const pid_t got = ::waitpid(children_[i]->pid, &status, WNOHANG);
    if (got != children_[i]->pid) continue;
    r.exited = true;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
    // Whatever the child left running in its group goes with it; then its last output is
    // forwarded, before any line about its death.
    ::killpg(children_[i]->pid, SIGKILL);
    DrainOutput(*children_[i], true);
    if (r.Code() != 0 && !r.stopped_by_us && !stopping_) HandleDeath(i);
  }
}

// Child i died while the job ran: restart it, give it up, or stop the job (its ChildSpec).
void ProcessGroup::HandleDeath(size_t i) {
  Child& c = *children_[i];
  ChildResult& r = results_[i];
  const ChildSpec& spec = c.spec;
  c.died_at = Clock::now();
  ChildEvent died = NewEvent(ChildEvent::Kind::kDied, i);
  died.uptime_s = std::chrono::duration<double>(c.died_at - c.started).count();
  const std::string how_it_ended = HowItEnded(spec.name, r.exit_code, r.term_signal);
  const std::string how = fmt::format("{} after {:.1f} s", how_it_ended, died.uptime_s);
  // A setup error (the code options_.setup_error_code) comes back on every restart: none is made.
  const bool setup_error = options_.setup_error_code > 0 && r.term_signal == 0 &&
                           r.exit_code == options_.setup_error_code;
  if (r.restarts < spec.max_restarts && !setup_error) {
    const int n = r.restarts + 1;
    died.action = ChildEvent::Action::kRestart;
    died.line = fmt::format("{}; restarting it{}{} (restart {} of {})", how, spec.restart_note.empty() ? "" : " ",
                            spec.restart_note, n, spec.max_restarts);
    c.restart_pending = true;
    c.restart_at = c.died_at + Backoff(n);
    Report(std::move(died));
    return;
  }
  // No restart left: say which death this is and the limit, or the setting that allows none.
  const std::string limit = spec.limit.empty() ? fmt::format("{} restarts", spec.max_restarts) : spec.limit;
  const std::string limit_part =
      setup_error            ? std::string("; a setup error, which a restart would repeat")
      : spec.max_restarts > 0 ? fmt::format("; it died a {} time (limit {})", Ordinal(r.restarts + 1), limit)
                              : "";
  const std::string setting_part =
      spec.max_restarts == 0 && !spec.limit.empty() && !setup_error ? fmt::format(" ({})", spec.limit) : "";
  if (spec.on_death == OnDeath::kContinue) {
    died.action = ChildEvent::Action::kContinue;
    died.line = fmt::format("{}{}; the job goes on without it{}", how, limit_part, setting_part);
    GiveUp(i, std::move(died), limit_part);
    return;
  }
  died.action = ChildEvent::Action::kStop;
  died.line = fmt::format("{}{}; stopping all{}", how, limit_part, setting_part);
  Report(std::move(died));
  BeginStop(how_it_ended + limit_part + (c.last_error.empty() ? "" : ": " + c.last_error), r.Code());
}

// Reports `died` (may be a default event: nothing to report) and gives child i up.
void ProcessGroup::GiveUp(size_t i, ChildEvent died, const std::string& why) {
  ChildResult& r = results_[i];
  if (!died.child.empty()) Report(std::move(died));
  r.given_up = true;
  last_given_up_code_ = r.Code();
  if (!children_[i]->last_error.empty()) last_given_up_error_ = children_[i]->last_error;
  ChildEvent gone = NewEvent(ChildEvent::Kind::kGivenUp, i);
  gone.action = ChildEvent::Action::kContinue;
  gone.line = why;  // empty after a death line, which said it already
  Report(std::move(gone));
}

void ProcessGroup::RestartDue() {
  const auto now = Clock::now();
  for (size_t i = 0; i < children_.size() && !stopping_; ++i) {
    Child& c = *children_[i];
    if (!c.restart_pending || now < c.restart_at) continue;
    c.restart_pending = false;
    c.last_error.clear();  // the new incarnation's errors only
    ChildResult& r = results_[i];
    const int n = ++r.restarts;
    pid_t pid = -1;
    int out_fd = -1;
    const Status s = Spawn(c.spec.name, c.spec.restart_argv, &pid, &out_fd);
    if (!s.ok()) {  // as a death with no restart left
      if (c.spec.on_death == OnDeath::kContinue) {
        GiveUp(i, ChildEvent{}, fmt::format("{} cannot be restarted ({}); the job goes on without it", c.spec.name,
                                            s.message()));
      } else {
        Emit("launch", fmt::format("{} cannot be restarted ({}); stopping all", c.spec.name, s.message()));
        BeginStop(fmt::format("{} cannot be restarted", c.spec.name), r.Code());
      }
      continue;
    }
    if (c.out_fd >= 0) ::close(c.out_fd);  // drained at its death; never left open
    c.out_fd = out_fd;
    c.pid = pid;
    c.started = Clock::now();
    r.pid = pid;
    r.exited = false;
    r.exit_code = -1;
    r.term_signal = 0;
    ChildEvent ev = NewEvent(ChildEvent::Kind::kRestarted, i);
    ev.down_s = std::chrono::duration<double>(c.started - c.died_at).count();
    ev.restart = n;
    ev.action = ChildEvent::Action::kRestart;
    ev.argv = c.spec.restart_argv;
    ev.line = fmt::format("{} restarted (restart {} of {}, pid {})", c.spec.name, n, c.spec.max_restarts, pid);
    Report(std::move(ev));
  }
}

// Ends the job (BeginStop) when no primary runs or waits for a restart; true if it did.
bool ProcessGroup::CheckDone() {
  if (children_.empty()) return false;
  if (CannotFinish()) return true;
  const bool has_primary = std::any_of(children_.begin(), children_.end(), [](const auto& c) { return c->spec.primary; });
  int succeeded = 0;
  std::vector<std::string> given_up;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (has_primary && !children_[i]->spec.primary) continue;
    const ChildResult& r = results_[i];
    if (!r.exited || children_[i]->restart_pending) return false;
    if (r.given_up) {
      given_up.push_back(r.name);
    } else if (r.Code() == 0) {
      ++succeeded;
    } else {
      return false;  // a death not handled yet (it is restarted, given up or stops the job)
    }
  }
  const char* who = has_primary ? "primaries" : "children";
  if (given_up.empty()) {
    BeginStop(fmt::format("all {} exited 0", who), 0);
  } else if (succeeded >= options_.min_succeeded) {
    BeginStop(fmt::format("all {} done: {} exited 0, {} given up ({})", who, succeeded, given_up.size(),
                          fmt::join(given_up, ", ")),
              0);
  } else {
    BeginStop(fmt::format("{} of the {} exited 0 (at least {} must); given up: {}{}", succeeded, who,
                          options_.min_succeeded, fmt::join(given_up, ", "),
                          last_given_up_error_.empty() ? "" : " (" + last_given_up_error_ + ")"),
              last_given_up_code_);
  }
  return true;
}

bool ProcessGroup::CannotFinish() {
  std::vector<std::string> given_up;
  bool followers_running = false;
  for (size_t i = 0; i < children_.size(); ++i) {
    const ChildSpec& spec = children_[i]->spec;
    if (!spec.primary) continue;
    const ChildResult& r = results_[i];
    if (spec.follower) {
      followers_running |= !r.exited || children_[i]->restart_pending;
      continue;
    }
    if (!r.exited || children_[i]->restart_pending || !r.given_up) return false;  // running, or it succeeded
    given_up.push_back(r.name);
  }
  if (given_up.empty() || !followers_running) return false;
  BeginStop(fmt::format("{} given up and none finished: the job cannot finish{}", fmt::join(given_up, ", "),
                        last_given_up_error_.empty() ? "" : " (" + last_given_up_error_ + ")"),
            last_given_up_code_);
  return true;
}

void ProcessGroup::CheckRunOver() {
  if (run_over_at_ == Clock::time_point{}) {
    for (size_t i = 0; i < children_.size(); ++i) {
      if (!children_[i]->spec.ends_run || !results_[i].exited || results_[i].Code() != 0) continue;
      run_over_at_ = Clock::now();
      Emit("launch", fmt::format("{} ended the run; the others have {:.0f} s to exit", results_[i].name,
                                 std::chrono::duration<double>(options_.run_over_grace).count()));
      break;
    }
    if (run_over_at_ == Clock::time_point{}) return;
  }
  if (Clock::now() < run_over_at_ + options_.run_over_grace) return;
  int succeeded = 0;
  std::vector<std::string> left;
  for (size_t i = 0; i < children_.size(); ++i) {
    const ChildResult& r = results_[i];
    if (children_[i]->spec.primary && r.exited && !r.given_up && r.Code() == 0) ++succeeded;
    if (!r.exited) left.push_back(r.name);
  }
  const std::string why = fmt::format("the run ended, and {} did not exit within {:.0f} s", fmt::join(left, ", "),
                                      std::chrono::duration<double>(options_.run_over_grace).count());
  Emit("launch", why + "; stopping it");
  BeginStop(why, succeeded >= options_.min_succeeded ? 0 : 1);
}

bool ProcessGroup::AllReaped() const {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (!results_[i].exited || children_[i]->restart_pending) return false;
  }
  return true;
}

int ProcessGroup::Run() {
  const auto deadline = options_.timeout.count() > 0 ? Clock::now() + options_.timeout
                                                     : Clock::time_point::max();
  std::vector<pollfd> fds;
  std::vector<Child*> polled;
  while (true) {
    fds.clear();
    polled.clear();
    for (auto& c : children_) {
      if (c->out_fd >= 0) {
        fds.push_back({c->out_fd, POLLIN, 0});
        polled.push_back(c.get());
      }
    }
    if (signal_fd_ >= 0) fds.push_back({signal_fd_, POLLIN, 0});
    ::poll(fds.data(), fds.size(), kTickMs);
    for (size_t i = 0; i < polled.size(); ++i) {
      if (fds[i].revents) DrainOutput(*polled[i], false);
    }
    if (signal_fd_ >= 0) {
      signalfd_siginfo info{};
      if (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        Emit("launch", fmt::format("received signal {} ({}); stopping all", sig, strsignal(sig)));
        BeginStop(fmt::format("received signal {}", sig), 128 + sig);
      }
    }
    ReapExited();
    if (!stopping_) RestartDue();
    if (!stopping_ && !CheckDone()) CheckRunOver();
    if (!stopping_ && Clock::now() >= deadline) {
      Emit("launch", fmt::format("timeout after {} ms; stopping all", options_.timeout.count()));
      BeginStop(fmt::format("timeout after {} ms", options_.timeout.count()), 124);
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_at_ && !AllReaped()) {
      Emit("launch", "grace period over; sending SIGKILL");
      SignalLive(SIGKILL);
      killed_ = true;
    }
    if (children_.empty()) return 0;
    if (AllReaped()) break;
  }
  // Every child is reaped and its group killed: collect what is left in the pipes.
  for (auto& c : children_) DrainOutput(*c, true);
  return exit_code_;
}

}  // namespace downpour
