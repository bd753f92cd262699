// file_io.cc — see file_io.h.
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/env.h"

namespace downpour {
namespace {

std::string Errno() { return std::strerror(errno); }

std::string DirOf(const std::string& path) {
  const std::filesystem::path target(path);
  return target.has_parent_path() ? target.parent_path().string() : std::string(".");
}

}  // namespace

Status FsyncDirectory(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("{}: cannot open directory {} to fsync: {}", path, dir, Errno());
  const int rc = CurrentEnv().Fsync(fd);
  const std::string err = rc != 0 ? Errno() : "";
  ::close(fd);
  if (rc != 0) return IoError("{}: fsync of directory {} failed: {}", path, dir, err);
  return Status::Ok();
}

Status FsyncParentDirectory(const std::string& path) { return FsyncDirectory(DirOf(path), path); }

Status ReadWholeFile(const std::string& path, std::string_view what, std::string* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("{}: no such {} file", path, what);
    return IoError("{}: cannot open {} file: {}", path, what, Errno());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError("{}: {} is not a regular file", path, what);
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string err = n < 0 ? Errno() : "unexpected end of file";
      ::close(fd);
      return IoError("{}: reading {} file failed after {} of {} bytes: {}", path, what, done, out.size(), err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  *bytes = std::move(out);
  return Status::Ok();
}

Status CheckReplaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return IoError("{}: cannot check what is there: {}", path, Errno());
  }
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return Status::Ok();
  const char* kind = S_ISCHR(st.st_mode)    ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return InvalidArgument("{}: is {}; refusing to replace it with a written file (give a file path)", path, kind);
}

Status WriteTemp(const std::string& path, std::string_view bytes, std::string* tmp, Durability durability,
                 FileMode mode) {
  const std::filesystem::path target(path);
  if (target.filename().empty()) return InvalidArgument("{}: not a file name", path);
  DP_RETURN_IF_ERROR(CheckReplaceable(path));
  const std::string dir = DirOf(path);
  std::string name = dir + "/." + target.filename().string() + ".tmp.XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return IoError("{}: cannot create a temporary file in {}: {}", path, dir, Errno());
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  // mkstemp makes the file 0600; the permissions it is to have are set once it is complete.
  Status s = WriteFully(fd, bytes.data(), bytes.size(), path);
  if (s.ok()) {
    mode_t final_mode = 0;
    if (mode) {
      final_mode = *mode;
    } else {
      final_mode = ::umask(0);
      ::umask(final_mode);
      final_mode = 0666 & ~final_mode;
    }
    if (::fchmod(fd, final_mode) != 0) s = IoError("{}: chmod {:04o} failed: {}", path, final_mode, Errno());
  }
  if (s.ok() && durability == Durability::kPowerLoss && CurrentEnv().Fsync(fd) != 0) {
    s = IoError("{}: fsync failed: {}", path, Errno());
  }
  if (::close(fd) != 0 && s.ok()) s = IoError("{}: close failed: {}", path, Errno());
  if (!s.ok()) {
    ::unlink(name.c_str());
    return s;
  }
  *tmp = std::move(name);
  return Status::Ok();
}

Status CommitTemp(const std::string& tmp, const std::string& path, Durability durability) {
  if (CurrentEnv().Rename(tmp.c_str(), path.c_str()) != 0) {
    const Status s = IoError("{}: rename from {} failed: {}", path, tmp, Errno());
    ::unlink(tmp.c_str());
    return s;
  }
  return durability == Durability::kPowerLoss ? FsyncParentDirectory(path) : Status::Ok();
}

void DiscardTemp(const std::string& tmp) { ::unlink(tmp.c_str()); }

Status WriteFileAtomic(const std::string& path, std::string_view bytes, Durability durability, FileMode mode) {
  std::string tmp;
  DP_RETURN_IF_ERROR(WriteTemp(path, bytes, &tmp, durability, mode));
  return CommitTemp(tmp, path, durability);
}

}  // namespace downpour
