// harness.cc — see harness.h.
#include "tests/testing/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include "downpour_config.h"

namespace downpour::test {

using namespace std::chrono_literals;

std::string BuildDir() {
  const char* d = std::getenv("DOWNPOUR_BUILD_DIR");
  return d != nullptr ? d : DOWNPOUR_BINARY_DIR;
}

std::string SourcePath(const std::string& relative) { return (fs::path(DOWNPOUR_SOURCE_DIR) / relative).string(); }

std::string IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& bytes) {
  std::string out;
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  out.append(bytes.begin(), bytes.end());
  return out;
}

bool HaveFashionMnist() { return fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz"); }

void RequireJobBinaries() {
  for (const char* p : {"downpour-worker", "downpour-server", "downpour-coordinator", "downpour-launch"}) {
    ASSERT_TRUE(fs::exists(Binary(p))) << Binary(p) << " not built";
  }
}

std::string Binary(const std::string& name) {
  static const std::pair<const char*, const char*> kWhere[] = {
      {"downpour-worker", "client/worker"}, {"downpour-time", "client/engine"}, {"downpour-test", "client/worker"},
      {"downpour-caffe", "client/caffe"},   {"downpour-data", "data"},
  };
  for (const auto& [program, dir] : kWhere) {
    if (name == program) return (fs::path(BuildDir()) / dir / name).string();
  }
  return (fs::path(BuildDir()) / "server" / name).string();  // launcher, server, coordinator
}

namespace {

// Removes the scratch directories of a test that did not fail once it has ended (its fixture
// and the children it owned are gone by then); a failed test's are kept and named, and so is
// every test's when DOWNPOUR_KEEP_TEST_DIR is set (to read how far a passing run cleared its bars).
// Appended to gtest's listeners, which own it, by the first ScratchDir of the program.
class ScratchSweeper : public ::testing::EmptyTestEventListener {
 public:
  void Add(const fs::path& dir) { dirs_.push_back(dir); }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    static const bool keep_all = [] {  // set and not empty, as tests/cluster reads it
      const char* v = std::getenv("DOWNPOUR_KEEP_TEST_DIR");
      return v != nullptr && *v != '\0';
    }();
    for (const fs::path& dir : dirs_) {
      if (info.result()->Failed() || keep_all) {
        std::fprintf(stderr, "[scratch] kept %s\n", dir.c_str());
        continue;
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    dirs_.clear();
  }

 private:
  std::vector<fs::path> dirs_;
};

ScratchSweeper& Sweeper() {
  static ScratchSweeper* const sweeper = [] {
    auto* s = new ScratchSweeper;
    ::testing::UnitTest::GetInstance()->listeners().Append(s);
    return s;
  }();
  return *sweeper;
}

}  // namespace

fs::path ScratchDir(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? fmt::format("{}_{}", info->test_suite_name(), info->name()) : "none";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("{}_{}_{}", prefix, name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  if (info != nullptr) Sweeper().Add(dir);
  return dir;
}

namespace {

bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int FreePort() { return FreePortRange(1); }

int FreePortRange(int count) {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::random_device{}()));
  std::uniform_int_distribution<int> pick(20000, 60000 - count);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int first = pick(rng);
    bool all = true;
    for (int p = first; p < first + count && all; ++p) all = PortFree(p);
    if (all) return first;
  }
  ADD_FAILURE() << "no " << count << " consecutive free ports on 127.0.0.1";
  return 0;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

std::string WaitForWord(const fs::path& path, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream f(path);
    std::string word;
    if (f >> word && !word.empty()) return word;
    std::this_thread::sleep_for(20ms);
  }
  return "";
}

Child::Child(const std::vector<std::string>& argv, const fs::path& log) {
  pid_ = ::fork();
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

Child::Child(const std::function<int()>& body) {
  pid_ = ::fork();
  if (pid_ == 0) ::_exit(body());
}

Child::~Child() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void Child::Signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Child::WaitExit(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  const auto until = std::chrono::steady_clock::now() + limit;
  do {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(10ms);
  } while (std::chrono::steady_clock::now() < until);
  return -1;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output, std::chrono::seconds limit) {
  char path[] = "/tmp/downpour_test_output_XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return -1;
  ::close(fd);
  int code = -1;
  {
    Child child(argv, path);
    code = child.WaitExit(limit);
  }  // a child past its limit is killed here
  if (output != nullptr) *output = ReadFile(path);
  ::unlink(path);
  return code;
}

int RunShell(const std::string& command, std::string* output, std::chrono::seconds limit) {
  return RunCommand({"/bin/sh", "-c", command}, output, limit);
}

namespace {

// Fields 3 (state) and 4 (ppid) of /proc/<pid>/stat; the name (field 2) may hold spaces.
bool ReadStat(pid_t pid, char* state, pid_t* ppid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  return static_cast<bool>(rest >> *state >> *ppid);
}

}  // namespace

void KillJob(Child& launcher, size_t children, const std::string& what) {
  const std::vector<pid_t> pids = ChildrenOf(launcher.pid());
  EXPECT_EQ(pids.size(), children) << what;
  for (pid_t p : pids) ::kill(p, SIGKILL);
  launcher.Signal(SIGKILL);
  EXPECT_EQ(launcher.WaitExit(std::chrono::seconds(10)), 128 + SIGKILL);
  for (pid_t p : pids) {
    for (int i = 0; i < 100 && Alive(p); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(Alive(p)) << "pid " << p << " survived SIGKILL";
  }
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    char state = 0;
    pid_t ppid = 0;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (ReadStat(pid, &state, &ppid) && ppid == parent) out.push_back(pid);
  }
  return out;
}

bool Alive(pid_t pid) {
  char state = 0;
  pid_t ppid = 0;
  return ReadStat(pid, &state, &ppid) && state != 'Z';
}

std::string CmdLine(pid_t pid) {
  std::string s = ReadFile(fmt::format("/proc/{}/cmdline", pid));
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s;
}

pid_t ChildWith(pid_t parent, const std::vector<std::string>& parts) {
  for (pid_t p : ChildrenOf(parent)) {
    const std::string cmd = CmdLine(p);
    if (std::all_of(parts.begin(), parts.end(), [&](const std::string& x) { return cmd.find(x) != std::string::npos; }))
      return p;
  }
  return -1;
}

bool WaitWorkerSteps(const fs::path& run_dir, int w, int64_t steps, std::chrono::seconds limit) {
  const fs::path file = run_dir / "metrics" / fmt::format("worker-{}.jsonl", w);
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    std::vector<MetricRecord> recs;
    if (fs::exists(file) && ReadMetrics(file.string(), &recs).ok() &&
        std::count_if(recs.begin(), recs.end(), [](const MetricRecord& r) { return r.Get("event").AsString() == "step"; }) >=
            steps) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::vector<MetricRecord> Metrics(const fs::path& run_dir, const std::string& file, const std::string& event) {
  std::vector<MetricRecord> all, out;
  const Status s = ReadMetrics((run_dir / "metrics" / file).string(), &all);
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (auto& r : all) {
    if (r.Get("event").AsString() == event) out.push_back(std::move(r));
  }
  return out;
}

Job::Job(const JobSpec& spec) : spec_(spec) {
  const fs::path logs = spec.run_dir / "logs";
  fs::create_directories(logs);
  const std::string run = spec.run_dir.string();
  coordinator_ = std::make_unique<Child>(
      std::vector<std::string>{Binary("downpour-coordinator"), "--config", spec.config, "--run-dir", run, "--tensors",
                               spec.tensors},
      logs / "coordinator.log");
  for (int s = 0; s < spec.servers; ++s) {
    servers_.push_back(std::make_unique<Child>(
        std::vector<std::string>{Binary("downpour-server"), "--config", spec.config, "--id", std::to_string(s),
                                 "--run-dir", run, "--tensors", spec.tensors},
        logs / fmt::format("server-{}.log", s)));
  }
  for (size_t w = 0; w < spec.workers.size(); ++w) {
    std::vector<std::string> argv{Binary("downpour-worker"), "--quiet", "--id", std::to_string(w), "--config",
                                  spec.config, "--run-dir", run};
    argv.insert(argv.end(), spec.workers[w].begin(), spec.workers[w].end());
    workers_.push_back(std::make_unique<Child>(argv, logs / fmt::format("worker-{}.log", w)));
  }
}

std::string Job::Log(const std::string& role) const { return ReadFile(spec_.run_dir / "logs" / (role + ".log")); }

bool Job::Stop(std::chrono::seconds limit) {
  for (auto& s : servers_) s->Signal(SIGTERM);
  coordinator_->Signal(SIGTERM);
  bool ok = true;
  for (auto& s : servers_) ok = s->WaitExit(limit) == 0 && ok;
  ok = coordinator_->WaitExit(limit) == 0 && ok;
  return ok;
}

}  // namespace downpour::test
