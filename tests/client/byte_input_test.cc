// byte_input_test.cc — training on byte batches (common/byte_batch.h, Net::ForwardBackward on a
// ByteBatch, Backend::NormalizeInput) on the CPU:
//  * on the device stand-in (emulated_copy_backend.h: every copy done later by a copy-engine
//    thread), with each next batch staged during the step before, training equals the float path
//    on the host's normalisation bit for bit; so does a host backend fed bytes, and a device
//    whose batches were not staged ahead;
//  * order: a batch is normalised only after its upload landed, the next batch's upload is queued
//    during this step's forward/backward (before its first backward), and a staged batch is not
//    uploaded again;
//  * bad input: a normalisation that does not fit the net is refused naming the caller's field.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "client/engine/emulated_copy_backend.h"
#include "client/engine/net.h"
#include "client/engine/reference_backend.h"
#include "common/byte_batch.h"
#include "tests/client/test_nets.h"

namespace downpour::engine {
namespace {

constexpr const char* kNet = testing::kTinyConvNet;  // conv1 → fc1 → fc2 on 1×8×8
constexpr int kBatch = 8;
constexpr int kSteps = 5;
constexpr int kRecord = 11;  // records are 1×11×11; the crop is 8×8

// A 1×11×11 mean image and a scale: the loader's normalisation of a mean-file run.
InputNormalization Normalization() {
  InputNormalization n;
  n.channels = 1;
  n.height = n.width = 8;
  n.mean_h = n.mean_w = kRecord;
  for (int p = 0; p < kRecord * kRecord; ++p) n.mean_image.push_back(100.0f + 0.73f * static_cast<float>(p % 17));
  n.scale = 1.0f / 64;
  return n;
}

// One step's batch: random pixels and windows, some mirrored, some reaching past the record
// (padding), labels.
struct StepBatch {
  std::vector<uint8_t> pixels;
  std::vector<CropWindow> windows;
  std::vector<int> labels;
  ByteBatch view() const { return ByteBatch{pixels.data(), windows.data(), kBatch}; }
};
std::vector<StepBatch> Batches() {
  std::vector<StepBatch> batches(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(700 + s));
    StepBatch& b = batches[static_cast<size_t>(s)];
    b.pixels.resize(size_t{kBatch} * 64);
    for (uint8_t& p : b.pixels) p = static_cast<uint8_t>(rng());
    for (int i = 0; i < kBatch; ++i) {
      const int y0 = static_cast<int>(rng() % 6) - 1, x0 = static_cast<int>(rng() % 6) - 1;  // -1..4
      b.windows.push_back(CropWindow{y0, x0, kRecord, kRecord, static_cast<int32_t>(rng() & 1)});
      b.labels.push_back(static_cast<int>(rng() % 10));
    }
  }
  return batches;
}

enum class Feed {
  kHostFloats,      // reference backend, the host's NormalizeByteBatch, float ForwardBackward
  kHostBytes,       // reference backend fed bytes (Backend's default NormalizeInput)
  kDeviceStaged,    // emulated device, each next batch staged during the step before
  kDeviceUnstaged,  // emulated device, every batch uploaded when its step starts
};

struct ByteRun {
  std::vector<float> losses;
  std::vector<float> weights;
  std::vector<CopyEvent> events;
};

void Train(Feed feed, ByteRun* out) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString(kNet, "bytenet", &spec).ok());
  NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  no.reference = true;
  std::unique_ptr<Net> net;
  EmulatedCopyBackend* device = nullptr;
  if (feed == Feed::kDeviceStaged || feed == Feed::kDeviceUnstaged) {
    auto backend = std::make_unique<EmulatedCopyBackend>(MakeReferenceBackend(), std::chrono::microseconds(1500));
    device = backend.get();
    ASSERT_TRUE(Net::CreateWithBackend(spec, no, std::move(backend), &net).ok());
  } else {
    ASSERT_TRUE(Net::Create(spec, no, &net).ok());
  }
  const InputNormalization norm = Normalization();
  if (feed != Feed::kHostFloats) {
    ASSERT_TRUE(net->SetInputNormalization(norm, "test input").ok());
  }
  net->InitParams(5);
  std::vector<float> history(net->params().size(), 0.0f);
  const std::vector<StepBatch> batches = Batches();
  std::vector<float> floats(size_t{kBatch} * 64);
  for (int s = 0; s < kSteps; ++s) {
    const StepBatch& b = batches[static_cast<size_t>(s)];
    if (device != nullptr) device->Note("step");
    if (feed == Feed::kHostFloats) {
      NormalizeByteBatch(norm, b.view(), floats.data());
      out->losses.push_back(net->ForwardBackward(floats.data(), b.labels.data()));
    } else {
      const bool stage = feed == Feed::kDeviceStaged && s + 1 < kSteps;
      const ByteBatch next = stage ? batches[static_cast<size_t>(s + 1)].view() : ByteBatch{};
      out->losses.push_back(net->ForwardBackward(b.view(), b.labels.data(), stage ? &next : nullptr));
    }
    net->SgdUpdate(0.05f, 0.9f, 0.0005f, history);
  }
  out->weights.assign(net->params().begin(), net->params().end());
  if (device != nullptr) out->events = device->events();
}

TEST(ByteInput, EveryFeedTrainsAsTheHostsFloatsBitForBit) {
  ByteRun floats;
  ASSERT_NO_FATAL_FAILURE(Train(Feed::kHostFloats, &floats));
  for (Feed feed : {Feed::kHostBytes, Feed::kDeviceStaged, Feed::kDeviceUnstaged}) {
    ByteRun run;
    ASSERT_NO_FATAL_FAILURE(Train(feed, &run));
    EXPECT_EQ(run.losses, floats.losses) << "feed " << static_cast<int>(feed);
    EXPECT_EQ(run.weights, floats.weights) << "feed " << static_cast<int>(feed);
  }
}

TEST(ByteInput, ABatchUploadsDuringTheStepBeforeAndIsNormalisedOnlyOnceItLanded) {
  ByteRun run;
  ASSERT_NO_FATAL_FAILURE(Train(Feed::kDeviceStaged, &run));
  // Per step (a "step" note starts one): where its batch was normalised, the input copies queued,
  // and the first backward.
  int step = -1, normalised = 0, inputs_queued = 0;
  std::vector<int> queued_before_backward(kSteps, 0);
  bool backward_seen = false;
  std::vector<uint64_t> done;
  for (const CopyEvent& e : run.events) {
    switch (e.kind) {
      case CopyEvent::kNote:
        ++step;
        backward_seen = false;
        break;
      case CopyEvent::kInputQueued:
        ++inputs_queued;
        if (step >= 0 && !backward_seen) ++queued_before_backward[static_cast<size_t>(step)];
        break;
      case CopyEvent::kInputDone:
        done.push_back(e.ticket);
        break;
      case CopyEvent::kInputNormalized:
        ++normalised;
        EXPECT_NE(std::find(done.begin(), done.end(), e.ticket), done.end())
            << "step " << step << ": normalised before its upload (ticket " << e.ticket << ") landed";
        break;
      case CopyEvent::kBackward:
        backward_seen = true;
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(normalised, kSteps);
  // Each batch goes up once (pixels, windows): the first when its step starts, every later one
  // during the step before, ahead of that step's backward.
  EXPECT_EQ(inputs_queued, 2 * kSteps) << "a staged batch was uploaded again";
  EXPECT_EQ(queued_before_backward[0], 4);  // its own and the next batch's
  for (int s = 1; s + 1 < kSteps; ++s) EXPECT_EQ(queued_before_backward[static_cast<size_t>(s)], 2) << "step " << s;
  EXPECT_EQ(queued_before_backward[kSteps - 1], 0);
}

TEST(ByteInput, ANormalisationThatDoesNotFitTheNetIsRefusedNamingTheField) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString(kNet, "bytenet", &spec).ok());
  NetOptions no;
  no.batch = kBatch;
  no.reference = true;
  std::unique_ptr<Net> net;
  ASSERT_TRUE(Net::Create(spec, no, &net).ok());
  InputNormalization n = Normalization();
  n.channels = 3;
  n.mean_image.resize(3 * kRecord * kRecord);
  Status s = net->SetInputNormalization(n, "worker 2: the training data");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker 2: the training data: images of 3x8x8; net 'tinyconv' (bytenet) takes 1x8x8"),
            std::string::npos)
      << s.message();
  n = Normalization();
  n.mean_image.pop_back();
  s = net->SetInputNormalization(n, "worker 2: the training data");
  EXPECT_NE(s.message().find("the mean image has 120 floats; 1x11x11 needs 121"), std::string::npos) << s.message();
  n = Normalization();
  n.mean_image.clear();
  n.mean_values = {1, 2};
  s = net->SetInputNormalization(n, "worker 2: the training data");
  EXPECT_NE(s.message().find("2 mean values for 1 channels"), std::string::npos) << s.message();
  EXPECT_FALSE(net->has_input_normalization());
}

}  // namespace
}  // namespace downpour::engine
