#include "common/ack_history.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

namespace downpour {

std::string AckHistoryPath(const std::string& run_dir, int worker) {
  return (std::filesystem::path(run_dir) / "history" / fmt::format("worker-{}.acks", worker)).string();
}

Status AckHistoryWriter::Open(const std::string& path, std::unique_ptr<AckHistoryWriter>* out) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("{}: cannot create its directory: {}", path, ec.message());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("{}: cannot open the acknowledgement history: {}", path, std::strerror(errno));
  out->reset(new AckHistoryWriter(path, fd));
  return Status::Ok();
}

AckHistoryWriter::~AckHistoryWriter() { close(fd_); }

void AckHistoryWriter::Add(const AckRecord& r) {
  const std::string line = fmt::format("{} {} {}\n", r.server, r.session, r.request_id);
  std::lock_guard<std::mutex> lock(mu_);
  const ssize_t n = write(fd_, line.data(), line.size());
  if (n == static_cast<ssize_t>(line.size())) return;
  if (failed_++ == 0) {
    spdlog::error("{}: cannot append an acknowledgement ({}); the run's history will lack it", path_,
                  n < 0 ? std::strerror(errno) : "short write");
  }
}

uint64_t AckHistoryWriter::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

namespace {
template <typename T>
bool Field(std::string_view* rest, T* out) {
  const size_t space = rest->find(' ');
  const std::string_view word = rest->substr(0, space);
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), *out);
  if (ec != std::errc() || end != word.data() + word.size() || word.empty()) return false;
  *rest = space == std::string_view::npos ? std::string_view() : rest->substr(space + 1);
  return true;
}
}  // namespace

Status ReadAckHistory(const std::string& path, const std::function<void(const AckRecord&)>& visit,
                      uint64_t* partial) {
  if (partial != nullptr) *partial = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return NotFound("{}: no such file", path);
    return IoError("{}: cannot read: {}", path, std::strerror(errno));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  for (uint64_t line_no = 1; pos < text.size(); ++line_no) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {  // a worker killed inside its last write
      if (partial != nullptr) ++*partial;
      break;
    }
    std::string_view rest(text.data() + pos, nl - pos);
    AckRecord r;
    if (!Field(&rest, &r.server) || !Field(&rest, &r.session) || !Field(&rest, &r.request_id) || !rest.empty() ||
        r.server < 0) {
      return Corrupt("{}: line {}: expected \"<server> <session> <request id>\", got \"{}\"", path, line_no,
                     text.substr(pos, std::min<size_t>(nl - pos, 80)));
    }
    visit(r);
    pos = nl + 1;
  }
  return Status::Ok();
}

}  // namespace downpour
