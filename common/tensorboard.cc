// tensorboard.cc — see tensorboard.h.
#include "common/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/codec.h"
#include "common/env.h"
#include "common/tensorboard_event.pb.h"

namespace downpour {
namespace {

void PutLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TensorBoardDir(const std::string& run_dir, std::string_view role, int id) {
  return (std::filesystem::path(run_dir) / "tensorboard" / fmt::format("{}-{}", role, id)).string();
}

Status EventFileWriter::Open(const std::string& dir, std::unique_ptr<EventFileWriter>* out) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("{}: cannot create the TensorBoard directory: {}", dir, ec.message());
  // TensorBoard reads every events.out.tfevents.* file of a directory in name order; the
  // seconds first, as TensorFlow names them, then host and pid so two processes never share one.
  const std::string path = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}", std::time(nullptr),
                                                                     HostName(), ::getpid()))
                               .string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("{}: cannot open TensorBoard event file: {}", path, std::strerror(errno));
  std::unique_ptr<EventFileWriter> w(new EventFileWriter(fd, path));
  tensorboard::Event version;
  version.set_wall_time(static_cast<double>(std::time(nullptr)));
  version.set_step(0);
  version.set_file_version("brain.Event:2");
  DP_RETURN_IF_ERROR(w->WriteRecord(version.SerializeAsString()));
  *out = std::move(w);
  return Status::Ok();
}

EventFileWriter::~EventFileWriter() { ::close(fd_); }

Status EventFileWriter::WriteRecord(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  PutLittleEndian(data.size(), 8, &record);
  PutLittleEndian(MaskedCrc32c(record.data(), 8), 4, &record);
  record += data;
  PutLittleEndian(MaskedCrc32c(data.data(), data.size()), 4, &record);
  std::lock_guard<std::mutex> lock(mu_);
  return WriteFully(fd_, record.data(), record.size(), path_);
}

Status EventFileWriter::WriteScalars(int64_t step, double wall_time,
                                     const std::vector<std::pair<std::string, float>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  return WriteRecord(event.SerializeAsString());
}

MetricsWriter::Observer TensorBoardObserver(std::shared_ptr<EventFileWriter> writer,
                                            std::vector<TensorBoardEvent> events) {
  auto warned = std::make_shared<std::atomic<bool>>(false);
  return [writer = std::move(writer), events = std::move(events), warned](
             std::string_view event, double t, std::initializer_list<MetricField> fields) {
    const auto chosen = std::find_if(events.begin(), events.end(), [&](const TensorBoardEvent& e) { return e.event == event; });
    if (chosen == events.end()) return;
    const MetricValue* step = nullptr;
    std::vector<std::pair<std::string, float>> scalars;
    for (const MetricField& f : fields) {
      if (f.key == chosen->step_field) {
        step = &f.value;
      } else if (f.value.is_number() && std::isfinite(f.value.AsDouble())) {
        scalars.emplace_back(fmt::format("{}/{}", event, f.key), static_cast<float>(f.value.AsDouble()));
      }
    }
    if (step == nullptr || !step->is_number() || scalars.empty()) return;
    const Status s = writer->WriteScalars(step->AsInt(), t, scalars);
    if (!s.ok() && !warned->exchange(true)) {
      spdlog::warn("TensorBoard: {} (the JSONL metrics go on; later failures are not reported)", s.ToString());
    }
  };
}

Status MirrorToTensorBoard(const std::string& run_dir, std::string_view role, int id,
                           std::vector<TensorBoardEvent> events, MetricsWriter* metrics) {
  std::unique_ptr<EventFileWriter> writer;
  DP_RETURN_IF_ERROR(EventFileWriter::Open(TensorBoardDir(run_dir, role, id), &writer));
  metrics->SetObserver(TensorBoardObserver(std::shared_ptr<EventFileWriter>(std::move(writer)), std::move(events)));
  return Status::Ok();
}

}  // namespace downpour
