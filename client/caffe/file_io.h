// file_io.h — whole-file reads and atomic whole-file writes for downpour-caffe's outputs (model
// TOML, .caffemodel, .npy), so a failed command never leaves a partial file behind.
//
// Writes go to a hidden temporary file in the target's directory, are fsynced, renamed over the
// target and the directory fsynced (the same recipe as common/tensor_file.h). A failed write
// removes its temporary and leaves any previous file at the path as it was.
//
// Thread-safety: reentrant functions; concurrent writers to one path each rename a whole file.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace downpour::caffe_io {

// The whole file at `path` into `bytes`. NotFound when it does not exist, IoError otherwise.
// `what` names the file's role in messages ("prototxt", "caffemodel").
Status ReadWholeFile(const std::string& path, std::string_view what, std::string* bytes);

// Writes `bytes` to `path` atomically (see above).
Status WriteFileAtomic(const std::string& path, std::string_view bytes);

// The same in two steps, for several files that must appear together or not at all: WriteTemp
// writes `bytes` to a hidden temporary beside `path` and names it in `tmp`; once every file is
// written, CommitTemp renames each into place; on a failure, DiscardTemp removes the rest.
Status WriteTemp(const std::string& path, std::string_view bytes, std::string* tmp);
Status CommitTemp(const std::string& tmp, const std::string& path);
void DiscardTemp(const std::string& tmp);

}  // namespace downpour::caffe_io
