// loader_bench — images/s through the full Loader (LMDB read, Datum parse, decode, random
// 227x227 crop, mirror, mean-image subtraction, uint8 -> float, batch ring) for synthetic
// 256x256x3 records stored raw and as JPEG, at each requested thread count. The consumer
// takes each batch and releases it at once, so the number is the loader's capacity; compare
// it with the rate a worker's engine consumes images (printed from --consumer-rate). Each
// configuration runs twice: batches of floats (a CPU worker's) and byte batches (a GPU worker's,
// common/byte_batch.h: the crop's bytes only, the mean, mirror and scale left to the device).
//
//   downpour-bench-data [--records 512] [--seconds 5] [--threads 1,2] [--dir /tmp]
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "common/cli.h"
#include "data/datum.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/loader.h"
#include "data/mean_file.h"

namespace {

using namespace downpour::data;
using downpour::Status;

constexpr int kSide = 256, kCrop = 227, kChannels = 3;

void Check(const Status& s) {
  if (!s.ok()) {
    fmt::print(stderr, "loader_bench: {}\n", s.ToString());
    std::exit(1);
  }
}

// A photo-like image: smooth gradients plus noise (pure noise would make JPEGs unrealistically
// large, flat colour unrealistically small).
Image SyntheticImage(int i, std::mt19937* rng) {
  Image img;
  img.c = kChannels;
  img.h = img.w = kSide;
  img.layout = Layout::kChw;
  img.pixels.resize(size_t(kChannels) * kSide * kSide);
  std::uniform_int_distribution<int> noise(-12, 12);
  for (int c = 0; c < kChannels; ++c)
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x) {
        const int v = (x * (c + 1) + y * (3 - c) + 37 * i) / 3 % 200 + 28 + noise(*rng);
        img.pixels[(size_t(c) * kSide + y) * kSide + x] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
  return img;
}

void BuildDbs(const std::string& raw_db, const std::string& jpeg_db, const std::string& mean_path,
              int records, double* jpeg_kb) {
  std::unique_ptr<LmdbWriter> raw, jpg;
  Check(LmdbWriter::Create(raw_db, &raw));
  Check(LmdbWriter::Create(jpeg_db, &jpg));
  std::mt19937 rng(1);
  MeanImage mean;
  mean.c = kChannels;
  mean.h = mean.w = kSide;
  mean.values.assign(size_t(kChannels) * kSide * kSide, 0.f);
  size_t jpeg_bytes = 0;
  for (int i = 0; i < records; ++i) {
    const Image img = SyntheticImage(i, &rng);
    Check(raw->Put(RecordKey(i, "img"), MakeRawDatum(kChannels, kSide, kSide, img.pixels.data(), i % 1000)));
    std::string jpeg;
    Check(EncodeJpeg(img, 90, &jpeg));
    jpeg_bytes += jpeg.size();
    Check(jpg->Put(RecordKey(i, "img.jpg"), MakeEncodedDatum(jpeg, kChannels, kSide, kSide, i % 1000)));
    for (size_t p = 0; p < img.pixels.size(); ++p) mean.values[p] += img.pixels[p] / float(records);
  }
  Check(raw->Finish());
  Check(jpg->Finish());
  Check(WriteMeanFile(mean, mean_path));
  *jpeg_kb = jpeg_bytes / 1024.0 / records;
}

// CPU seconds used by this process (all threads): load-independent cost per image, which on
// a shared machine says more than wall-clock rate.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Result {
  double images_per_s = 0;
  double consumer_wait_s = 0;
  double images_per_cpu_s = 0;
  int64_t images = 0;
};

Result Measure(const std::string& db, const std::string& mean_path, int threads, double seconds, bool bytes) {
  LoaderOptions o;
  o.byte_batches = bytes;
  o.db_path = db;
  o.batch_size = 64;
  o.crop = kCrop;
  o.mirror = true;
  o.mean_file = mean_path;
  o.shuffle_buffer = 256;
  o.threads = threads;
  o.queue_depth = std::max(4, 2 * threads);
  Loader loader(o);
  Check(loader.Open());
  // Warm-up: fill the ring and fault in the map once.
  for (int k = 0; k < o.queue_depth; ++k) {
    const Batch* b = loader.Next();
    if (!b) Check(loader.status());
    loader.Release(b);
  }
  const auto before = loader.stats();
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t images = 0;
  volatile float sink = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    const Batch* b = loader.Next();
    if (!b) Check(loader.status());
    sink = sink + (bytes ? b->bytes[0] : b->data[0]);  // touch the batch as a trainer would
    images += b->n;
    loader.Release(b);
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = ProcessCpuSeconds() - cpu0;
  Result r;
  r.images = images;
  r.images_per_cpu_s = images / cpu;
  r.images_per_s = images / dt;
  r.consumer_wait_s = loader.stats().consumer_wait_s - before.consumer_wait_s;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader_bench: downpour data loader throughput"};
  downpour::cli::AddStandardFlags(&app, "downpour-bench-data");
  int records = 512;
  double seconds = 5;
  std::vector<int> thread_counts = {1, 2};
  std::string dir = std::filesystem::temp_directory_path().string();
  double consumer_rate = 0;
  app.add_option("--records", records, "synthetic records per LMDB");
  app.add_option("--seconds", seconds, "measuring time per configuration");
  app.add_option("--threads", thread_counts, "loader thread counts")->delimiter(',');
  app.add_option("--dir", dir, "where the temporary LMDBs go");
  app.add_option("--consumer-rate", consumer_rate, "images/s a worker's engine consumes (for the table)");
  if (const auto code = downpour::cli::Parse(app, argc, argv)) return *code;

  const auto root = std::filesystem::path(dir) / fmt::format("downpour_loader_bench_{}", ::getpid());
  std::filesystem::create_directories(root);
  double jpeg_kb = 0;
  const auto t_build = std::chrono::steady_clock::now();
  BuildDbs((root / "raw").string(), (root / "jpeg").string(), (root / "mean.tensor").string(),
           records, &jpeg_kb);
  fmt::print("built {} raw (192 KiB) and {} JPEG ({:.1f} KiB avg, q90 4:2:0) 256x256x3 records in {:.1f} s; "
             "hardware threads: {}\n", records, records, jpeg_kb,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count(),
             std::thread::hardware_concurrency());
  fmt::print(
      "| records | batch | loader threads | images/s (wall) | images/s per thread | images per CPU-second | "
      "consumer waited |\n");
  fmt::print("|---|---|---|---|---|---|---|\n");
  for (const char* kind : {"raw", "jpeg"}) {
    for (int t : thread_counts) {
      for (bool bytes : {false, true}) {
        const Result r = Measure((root / kind).string(), (root / "mean.tensor").string(), t, seconds, bytes);
        fmt::print("| {} 256x256 -> 227x227 crop+mirror+mean | {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f}% |\n", kind,
                   bytes ? "bytes (mean, mirror on the device)" : "floats", t, r.images_per_s, r.images_per_s / t,
                   r.images_per_cpu_s, 100.0 * r.consumer_wait_s / seconds);
      }
    }
  }
  if (consumer_rate > 0) fmt::print("worker consumes {:.0f} images/s\n", consumer_rate);
  std::filesystem::remove_all(root);
  return 0;
}
