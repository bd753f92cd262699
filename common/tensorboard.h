// tensorboard.h — TensorBoard event files, so that `tensorboard --logdir runs/` shows a run's
// curves as users of TensorFlow and PyTorch expect.
//
//   * EventFileWriter: one file events.out.tfevents.<seconds>.<host>.<pid> in a directory,
//     TFRecord-framed Event messages (common/tensorboard_event.proto): per record a uint64 length,
//     the masked CRC-32C of the length, the bytes, the masked CRC-32C of the bytes (little-endian;
//     mask: rotate right 15, add 0xa282ead8). The first event carries file_version
//     "brain.Event:2"; each later one the scalars of one step.
//   * TensorBoardObserver: mirrors chosen events of a MetricsWriter into such a file: every
//     numeric field of the record but the step field becomes a scalar tagged "<event>/<field>",
//     at the step the record's step field says (records without it are skipped).
//
// Each process writes its own directory, RUN_DIR/tensorboard/<role>-<id>/ (TensorBoardDir), so
// TensorBoard shows one curve per worker and one for the evaluator.
//
// Thread-safety: EventFileWriter::WriteScalars may be called from any thread; each record is one
// write(2) to an O_APPEND file. The writer owns its file descriptor.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/status.h"

namespace downpour {

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, with its file_version record.
  static Status Open(const std::string& dir, std::unique_ptr<EventFileWriter>* out);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event of `scalars` (tag, value) at `step`; a failed write is returned, never thrown.
  Status WriteScalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, float>>& scalars);

  const std::string& path() const { return path_; }

 private:
  EventFileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status WriteRecord(const std::string& data);

  const int fd_;
  const std::string path_;
  std::mutex mu_;  // one record per write(2), in order
};

// TFRecord's masked CRC-32C of `data`.
uint32_t MaskedCrc32c(const void* data, size_t size);

// RUN_DIR/tensorboard/<role>-<id>.
std::string TensorBoardDir(const std::string& run_dir, std::string_view role, int id);

// Which records become scalars: event name → the field that is their step.
struct TensorBoardEvent {
  std::string event;
  std::string step_field;
};

// An observer for MetricsWriter::SetObserver that writes the `events` into `writer` (shared: the
// observer keeps it open). The first failed write is logged as a warning; later ones are dropped
// quietly, and the JSONL metrics go on.
MetricsWriter::Observer TensorBoardObserver(std::shared_ptr<EventFileWriter> writer,
                                            std::vector<TensorBoardEvent> events);

// Opens the event file of process `role` `id` under TensorBoardDir(run_dir, ...) and sets the
// observer of `metrics` to mirror `events` into it. Errors: the directory or file cannot be made.
Status MirrorToTensorBoard(const std::string& run_dir, std::string_view role, int id,
                           std::vector<TensorBoardEvent> events, MetricsWriter* metrics);

}  // namespace downpour
