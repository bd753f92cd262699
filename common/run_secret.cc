// run_secret.cc — see run_secret.h.
#include "common/run_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/file_io.h"

namespace downpour {
namespace {

constexpr size_t kSecretBytes = 32;  // 256 bits, written as 64 hex characters

std::string Errno() { return std::strerror(errno); }

Status RandomHex(size_t bytes, std::string* hex) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("/dev/urandom: cannot open: {}", Errno());
  std::string raw(bytes, '\0');
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::read(fd, raw.data() + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return IoError("/dev/urandom: read failed: {}", n < 0 ? Errno() : "end of file");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  static constexpr char kDigits[] = "0123456789abcdef";
  hex->clear();
  for (unsigned char c : raw) {
    hex->push_back(kDigits[c >> 4]);
    hex->push_back(kDigits[c & 15]);
  }
  return Status::Ok();
}

}  // namespace

std::string RunSecretPath(const std::string& run_dir) { return (std::filesystem::path(run_dir) / "secret").string(); }

Status ReadRunSecret(const std::string& run_dir, std::string* secret) {
  const std::string path = RunSecretPath(run_dir);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("{}: no run secret", path);
    return IoError("{}: cannot stat the run secret: {}", path, Errno());
  }
  if ((st.st_mode & 077) != 0) {
    return FailedPrecondition(
        "permissions {:04o} for '{}' are too open: the run secret must be readable by its owner only (chmod 600 {})",
        st.st_mode & 07777, path, path);
  }
  std::string text;
  DP_RETURN_IF_ERROR(ReadWholeFile(path, "run secret", &text));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const bool hex =
      text.size() == 2 * kSecretBytes && text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (!hex) {
    return FailedPrecondition(
        "{}: not a run secret (expected {} hex characters, found {} characters); remove it and "
        "start the run again",
        path, 2 * kSecretBytes, text.size());
  }
  *secret = std::move(text);
  return Status::Ok();
}

Status EnsureRunSecret(const std::string& run_dir, std::string* secret) {
  const Status existing = ReadRunSecret(run_dir, secret);
  if (existing.code() != StatusCode::kNotFound) return existing;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return IoError("{}: cannot create the run directory for its secret: {}", run_dir, ec.message());
  std::string hex, tmp;
  DP_RETURN_IF_ERROR(RandomHex(kSecretBytes, &hex));
  const std::string path = RunSecretPath(run_dir);
  // Mode 0600 from the first byte (file_io.h), then link(), not rename(): link() fails with
  // EEXIST when another process of the run made the secret first, and everyone uses that one.
  DP_RETURN_IF_ERROR(WriteTemp(path, hex + "\n", &tmp, Durability::kPowerLoss, 0600));
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (rc != 0 && link_errno != EEXIST) {
    return IoError("{}: cannot create the run secret: {}", path, std::strerror(link_errno));
  }
  if (rc == 0) DP_RETURN_IF_ERROR(FsyncDirectory(run_dir, path));
  return ReadRunSecret(run_dir, secret);
}

}  // namespace downpour
