// process_group.cc — fork/exec children into their own process groups, forward their output
// line by line, and stop them all (SIGTERM, grace, SIGKILL) when the job ends.
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
constexpr int kTickMs = 50;             // reap / deadline check interval
using Clock = std::chrono::steady_clock;
}  // namespace

struct ProcessGroup::Child {
  std::string name;
  pid_t pid = -1;
  bool primary = false;
  int out_fd = -1;  // read end of the child's stdout+stderr pipe; -1 after EOF
  int log_fd = -1;  // raw log, or -1
  std::string partial;  // output received after the last newline

  ~Child() {
    if (out_fd >= 0) ::close(out_fd);
    if (log_fd >= 0) ::close(log_fd);
  }
};

ProcessGroup::ProcessGroup(ProcessGroupOptions options) : options_(std::move(options)) {
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

Status ProcessGroup::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("child \"{}\": empty command line", spec.name);
  auto child = std::make_unique<Child>();
  child->name = spec.name;
  child->primary = spec.primary;
  if (!spec.log_path.empty()) {
    child->log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (child->log_fd < 0) {
      return IoError("child \"{}\": cannot open log file {}: {}", spec.name, spec.log_path,
                     std::strerror(errno));
    }
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return IoError("pipe: {}", std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return IoError("pipe: {}", std::strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    return IoError("child \"{}\": fork failed: {}", spec.name, std::strerror(errno));
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
    return NotFound("child \"{}\": cannot run {}: {}", spec.name, spec.argv[0],
                    std::strerror(exec_errno));
  }
  ::fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  child->out_fd = out_pipe[0];
  child->pid = pid;
  ChildResult r;
  r.name = spec.name;
  r.pid = pid;
  results_.push_back(r);
  children_.push_back(std::move(child));
  return Status::Ok();
}

void ProcessGroup::Emit(const std::string& name, std::string_view line) {
  options_.output(fmt::format("[{}] {}", name, line));
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
        Emit(c.name, c.partial);
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
      Emit(c.name, std::string_view(c.partial).substr(start, nl - start));
      start = nl + 1;
    }
    c.partial.erase(0, start);
    while (c.partial.size() >= kMaxLine) {
      Emit(c.name, std::string_view(c.partial).substr(0, kMaxLine));
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
    // Whatever the child left running in its group goes with it.
    ::killpg(children_[i]->pid, SIGKILL);
    if (r.Code() != 0 && !r.stopped_by_us) {
      const std::string what = r.term_signal
                                   ? fmt::format("{} was killed by signal {} ({})", r.name,
                                                 r.term_signal, strsignal(r.term_signal))
                                   : fmt::format("{} exited with code {}", r.name, r.exit_code);
      Emit("launch", what + (stopping_ ? "" : "; stopping all"));
      BeginStop(what, r.Code());
    }
  }
}

bool ProcessGroup::AllReaped() const {
  return std::all_of(results_.begin(), results_.end(), [](const ChildResult& r) { return r.exited; });
}

int ProcessGroup::Run() {
  const auto deadline = options_.timeout.count() > 0 ? Clock::now() + options_.timeout
                                                     : Clock::time_point::max();
  const bool has_primary = std::any_of(children_.begin(), children_.end(),
                                       [](const auto& c) { return c->primary; });
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
    if (!stopping_) {
      bool done = true;
      for (size_t i = 0; i < children_.size(); ++i) {
        if (has_primary && !children_[i]->primary) continue;
        done = done && results_[i].exited && results_[i].Code() == 0;
      }
      if (done && !children_.empty()) {
        BeginStop(has_primary ? "all primaries exited 0" : "all children exited 0", 0);
      } else if (Clock::now() >= deadline) {
        Emit("launch", fmt::format("timeout after {} ms; stopping all", options_.timeout.count()));
        BeginStop(fmt::format("timeout after {} ms", options_.timeout.count()), 124);
      }
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
