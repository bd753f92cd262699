// file_io.h — whole-file reads and atomic whole-file writes: every file the project writes for
// others to read (checkpoints' tensor files, .addr files, mean files, downpour-caffe's outputs,
// worker progress) appears whole or not at all.
//
// Writes go to a hidden temporary file in the target's directory, are fsynced, renamed over the
// target and the directory fsynced (common/tensor_file.h streams its own data with the same
// recipe). A failed write removes its temporary and leaves any previous file at the path as it
// was. Durability::kProcessCrash skips the fsyncs: the file survives the writer being killed
// (rename is atomic) but not the machine losing power — for files rewritten every step.
//
// Thread-safety: reentrant functions; concurrent writers to one path each rename a whole file.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace downpour {

// The whole file at `path` into `bytes`. NotFound when it does not exist, IoError otherwise.
// `what` names the file's role in messages ("prototxt", "caffemodel").
Status ReadWholeFile(const std::string& path, std::string_view what, std::string* bytes);

enum class Durability {
  kPowerLoss,     // fsync the file and its directory (the default)
  kProcessCrash,  // rename only: atomic against a killed writer, cheap enough for every step
};

// The permissions of a written file: an ordinary new file's (0666 less the umask), or exactly
// `mode` (umask ignored). The temporary is 0600 until the file is complete, so a secret written
// with 0600 is never readable by anyone else, not even for a moment.
using FileMode = std::optional<mode_t>;

// Writes `bytes` to `path` atomically (see above).
Status WriteFileAtomic(const std::string& path, std::string_view bytes, Durability durability = Durability::kPowerLoss,
                       FileMode mode = std::nullopt);

// Ok when an atomic write may rename a new file onto `path`: nothing is there, or a regular file
// (or a symbolic link, which the rename replaces, not its target). Anything else, a device such as
// /dev/null, a FIFO, a socket or a directory, is an InvalidArgument naming it: renaming over
// /dev/null as root would replace the system's device with a regular file. Every writer here
// checks before it creates its temporary.
Status CheckReplaceable(const std::string& path);

// fsync of a directory, after a rename into it; errors name `path` (the file renamed).
Status FsyncDirectory(const std::string& dir, const std::string& path);
// FsyncDirectory of the directory that holds `path` ("." for a bare name), after a rename to it
// or an unlink of it.
Status FsyncParentDirectory(const std::string& path);

// The same in two steps, for several files that must appear together or not at all: WriteTemp
// writes `bytes` to a hidden temporary beside `path` and names it in `tmp`; once every file is
// written, CommitTemp renames each into place; on a failure, DiscardTemp removes the rest.
Status WriteTemp(const std::string& path, std::string_view bytes, std::string* tmp,
                 Durability durability = Durability::kPowerLoss, FileMode mode = std::nullopt);
Status CommitTemp(const std::string& tmp, const std::string& path, Durability durability = Durability::kPowerLoss);
void DiscardTemp(const std::string& tmp);

}  // namespace downpour
