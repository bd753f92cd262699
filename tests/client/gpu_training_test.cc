// Training on the GPU reaches the CPU's accuracy: the Fashion-MNIST small net
// (configs/models/fmnist_small.toml) trained from the same seed on the same batches, on the
// CUDA backend (TF32 on, the default) and on oneDNN, then evaluated on the same test images.
// The two runs differ only by floating-point rounding (TF32, algorithm order), so their test
// accuracies must agree within 2 points and both must show real learning (≥ 80 % on 10 classes
// after 500 steps of 64 images). Skips without a CUDA device; reads the real IDX files
// (DOWNPOUR_FASHION_MNIST_DIR, Debian's dataset-fashion-mnist).
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "client/engine/gpu/cuda_backend.h"
#include "client/engine/net.h"
#include "downpour_config.h"
#include "tests/client/gpu_test_util.h"

namespace downpour::engine {
namespace {

constexpr int kBatch = 64;
constexpr int kSteps = 500;
constexpr int kEvalBatches = 31;  // 1984 test images

// An IDX file (gzip): magic 0x0000080N (N dims, uint8), big-endian dims, then the bytes.
Status ReadIdxGz(const std::string& path, std::vector<int>* dims, std::vector<uint8_t>* bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return NotFound("{}: cannot open (install dataset-fashion-mnist)", path);
  auto read_u32 = [&](uint32_t* v) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) return false;
    *v = (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
    return true;
  };
  uint32_t magic = 0;
  Status s;
  if (!read_u32(&magic) || (magic >> 8) != 0x08 || (magic & 0xff) == 0 || (magic & 0xff) > 4) {
    s = Corrupt("{}: bad IDX magic 0x{:08x} (want 0x0000080N, uint8 data)", path, magic);
  } else {
    size_t total = 1;
    for (uint32_t i = 0; i < (magic & 0xff); ++i) {
      uint32_t d = 0;
      if (!read_u32(&d)) { s = Corrupt("{}: truncated header", path); break; }
      dims->push_back(static_cast<int>(d));
      total *= d;
    }
    if (s.ok()) {
      bytes->resize(total);
      if (gzread(f, bytes->data(), static_cast<unsigned>(total)) != static_cast<int>(total))
        s = Corrupt("{}: truncated data, want {} bytes", path, total);
    }
  }
  gzclose(f);
  return s;
}

struct Dataset {
  std::vector<float> images;  // N×1×28×28, standardised
  std::vector<int> labels;
  int n = 0;
};

Status LoadSplit(const std::string& prefix, Dataset* d) {
  std::vector<int> idims, ldims;
  std::vector<uint8_t> ib, lb;
  const std::string dir = DOWNPOUR_FASHION_MNIST_DIR;
  DP_RETURN_IF_ERROR(ReadIdxGz(dir + "/" + prefix + "-images-idx3-ubyte.gz", &idims, &ib));
  DP_RETURN_IF_ERROR(ReadIdxGz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", &ldims, &lb));
  if (idims.size() != 3 || idims[1] != 28 || idims[2] != 28 || ldims.size() != 1 || ldims[0] != idims[0])
    return Corrupt("{}/{}: unexpected IDX shapes", dir, prefix);
  d->n = idims[0];
  d->images.resize(ib.size());
  for (size_t i = 0; i < ib.size(); ++i) d->images[i] = (ib[i] / 255.0f - 0.2860f) / 0.3530f;
  d->labels.assign(lb.begin(), lb.end());
  return Status::Ok();
}

struct RunResult {
  float final_loss = 0.0f;
  float test_accuracy = 0.0f;
  double seconds = 0.0;
};

RunResult Train(Net& net, const Dataset& train, const Dataset& test) {
  net.InitParams(2024);
  std::vector<float> history(net.params().size(), 0.0f);
  std::vector<int> order(train.n);
  for (int i = 0; i < train.n; ++i) order[i] = i;
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> images(net.input_count());
  std::vector<int> labels(kBatch);
  const int64_t image_size = 28 * 28;
  RunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  float loss_sum = 0.0f;
  for (int step = 0; step < kSteps; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      const int idx = order[(int64_t(step) * kBatch + b) % train.n];
      std::copy_n(train.images.data() + idx * image_size, image_size, images.data() + b * image_size);
      labels[b] = train.labels[idx];
    }
    const float loss = net.ForwardBackward(images.data(), labels.data());
    net.SgdUpdate(0.01f, 0.9f, 5e-4f, history);
    loss_sum += loss;
    if ((step + 1) % 100 == 0) {
      std::printf("  [%s] step %d mean loss %.4f\n", net.backend().name().c_str(), step + 1, loss_sum / 100);
      r.final_loss = loss_sum / 100;
      loss_sum = 0.0f;
    }
  }
  double correct = 0;
  for (int b = 0; b < kEvalBatches; ++b) {
    std::copy_n(test.images.data() + int64_t(b) * kBatch * image_size, kBatch * image_size, images.data());
    std::copy_n(test.labels.data() + b * kBatch, kBatch, labels.data());
    correct += net.Forward(images.data(), labels.data()).top1 * kBatch;
  }
  r.test_accuracy = static_cast<float>(correct / (kEvalBatches * kBatch));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

TEST(GpuTraining, FashionMnistSmallNetMatchesCpuAccuracy) {
  DP_SKIP_WITHOUT_GPU();
  Dataset train, test;
  Status s = LoadSplit("train", &train);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = LoadSplit("t10k", &test);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetSpec spec;
  s = ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_small.toml", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();

  NetOptions gpu_opt, cpu_opt;
  gpu_opt.batch = cpu_opt.batch = kBatch;
  gpu_opt.worker.device = DeviceKind::kGpu;
  std::unique_ptr<Net> gpu, cpu;
  s = Net::Create(spec, gpu_opt, &gpu);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = Net::Create(spec, cpu_opt, &cpu);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(gpu->backend().name(), "cuda");
  std::printf("  %s\n", CudaDeviceDescription(gpu->backend()).c_str());

  const RunResult g = Train(*gpu, train, test);
  const RunResult c = Train(*cpu, train, test);
  std::printf("  gpu: loss %.4f, test accuracy %.4f, %.1f s; cpu (%s): loss %.4f, test accuracy %.4f, %.1f s\n",
              g.final_loss, g.test_accuracy, g.seconds, cpu->backend().name().c_str(), c.final_loss,
              c.test_accuracy, c.seconds);
  EXPECT_GE(g.test_accuracy, 0.80f);
  EXPECT_GE(c.test_accuracy, 0.80f);
  EXPECT_NEAR(g.test_accuracy, c.test_accuracy, 0.02f);
  EXPECT_NEAR(g.final_loss, c.final_loss, 0.05f);
}

}  // namespace
}  // namespace downpour::engine
