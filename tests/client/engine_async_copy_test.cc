// engine_async_copy_test.cc — the net's asynchronous transfer path (net.h: downloads started
// without waiting, gradients handed over as they land, layers waiting only for their own
// uploads) on a device stand-in that completes every copy later on another thread
// (emulated_copy_backend.h), against the plain CPU path:
//  * training is the same bit for bit (losses, every handed-over gradient, the final weights),
//    with the weights uploaded at once and layer by layer;
//  * a gradient is handed over only after its download landed;
//  * a layer runs only after every upload queued before it landed;
//  * the backward of the layers below is queued while a download is still out;
//  * sufficient factors, read from two blobs without waiting, are handed over once both landed,
//    and δ packed in row blocks on the device is the host's packing bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/engine/emulated_copy_backend.h"
#include "client/engine/net.h"
#include "client/engine/reference_backend.h"
#include "common/grad_codec.h"
#include "tests/client/test_nets.h"

namespace downpour::engine {
namespace {

constexpr const char* kNet = testing::kTinyConvNet;  // conv1 → fc1 → fc2 on 1×8×8
constexpr int kBatch = 8;
constexpr int kSteps = 4;
constexpr int kFc1Weight = 2;  // conv1.weight, conv1.bias, fc1.weight, ...

struct TrainRun {
  std::vector<float> losses;
  std::vector<std::vector<std::vector<float>>> grads;  // per step, per tensor: at its hand-over
  std::vector<float> final_weights;
  std::vector<CopyEvent> events;  // the emulated backend's log
};

// kSteps of local SGD. `emulated`: on the copy-engine stand-in (each copy 2 ms after the last);
// `per_layer`: weights uploaded layer by layer before each layer (as a pulling worker does);
// `factors`: fc1's weight handed over as sufficient factors (δ, a) read from its blobs, and no
// update (the span then holds factors, not a gradient).
// `cast`: gradients downloaded in 16 bits (Net::SetGradDType); the hand-over records grads16()
// widened back to floats, and there is no update (grads() is not written), as with factors.
// `blocks`: with factors, δ packed in these row blocks (Net::SetFactoredParams).
void Train(bool emulated, bool per_layer, TrainRun* out, bool factors = false, DType cast = DType::kF32,
           const std::vector<RowSpan>& blocks = {}) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString(kNet, "copynet", &spec).ok());
  NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  no.reference = true;
  EmulatedCopyBackend* copies = nullptr;
  std::unique_ptr<Net> net;
  if (emulated) {
    auto backend = std::make_unique<EmulatedCopyBackend>(MakeReferenceBackend(), std::chrono::milliseconds(2));
    copies = backend.get();
    ASSERT_TRUE(Net::CreateWithBackend(spec, no, std::move(backend), &net).ok());
  } else {
    ASSERT_TRUE(Net::Create(spec, no, &net).ok());
  }
  net->InitParams(11);
  if (per_layer) net->SetBeforeLayerCallback([](int) {});
  if (factors) {
    const std::vector<std::vector<RowSpan>> packing =
        blocks.empty() ? std::vector<std::vector<RowSpan>>{} : std::vector<std::vector<RowSpan>>{blocks};
    ASSERT_TRUE(net->SetFactoredParams({kFc1Weight}, packing).ok());
  }
  if (cast != DType::kF32) {
    ASSERT_TRUE(net->SetGradDType(cast).ok());
  }
  const int tensors = static_cast<int>(net->param_specs().size());
  net->SetGradReadyCallback([&](int t) {
    if (copies != nullptr) copies->Note("grad " + std::to_string(t));
    std::vector<float>& seen = out->grads.back()[static_cast<size_t>(t)];
    if (cast == DType::kF32) {
      const auto g = net->grad(t);
      seen.assign(g.begin(), g.end());
    } else {  // the 16-bit values, as floats
      const auto g16 = net->grads16().subspan(static_cast<size_t>(net->param_offset(t)), net->grad(t).size());
      seen.resize(g16.size());
      if (cast == DType::kF16) {
        HalfToFloats(g16.data(), seen);
      } else {
        Bf16ToFloats(g16.data(), seen);
      }
    }
  });
  std::vector<float> history(net->params().size(), 0.0f);
  std::vector<float> images(size_t{kBatch} * 64);
  std::vector<int> labels(kBatch);
  for (int step = 0; step < kSteps; ++step) {
    std::mt19937 rng(static_cast<uint32_t>(100 + step));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : images) x = d(rng);
    for (int& l : labels) l = static_cast<int>(rng() % 10);
    out->grads.emplace_back(static_cast<size_t>(tensors));
    out->losses.push_back(net->ForwardBackward(images.data(), labels.data()));
    if (factors) {
      EXPECT_TRUE(net->grad_is_factored(kFc1Weight));
    } else if (cast != DType::kF32) {
      // No update: grads() was not written.
    } else {
      net->SgdUpdate(0.05f, 0.9f, 0.0005f, history);
    }
  }
  out->final_weights.assign(net->params().begin(), net->params().end());
  if (copies != nullptr) out->events = copies->events();
}

class EmulatedCopies : public ::testing::TestWithParam<bool> {};

TEST_P(EmulatedCopies, TrainingEqualsTheBlockingPathBitForBit) {
  TrainRun plain, emulated;
  ASSERT_NO_FATAL_FAILURE(Train(false, GetParam(), &plain));
  ASSERT_NO_FATAL_FAILURE(Train(true, GetParam(), &emulated));
  EXPECT_EQ(emulated.losses, plain.losses);
  ASSERT_EQ(emulated.grads.size(), plain.grads.size());
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    for (size_t t = 0; t < plain.grads[s].size(); ++t) {
      ASSERT_FALSE(plain.grads[s][t].empty());
      EXPECT_EQ(emulated.grads[s][t], plain.grads[s][t]) << "step " << s << " tensor " << t
                                                         << ": handed over before its download landed";
    }
  }
  EXPECT_EQ(emulated.final_weights, plain.final_weights);
}

TEST_P(EmulatedCopies, CopiesAndLayersComeInTheContractsOrder) {
  TrainRun run;
  ASSERT_NO_FATAL_FAILURE(Train(true, GetParam(), &run));
  int downloads_done = 0, handed = 0, uploads_queued = 0, uploads_done = 0, forwards = 0;
  int backward_while_out = 0;  // a layer's backward queued while a download was still out
  int downloads_out = 0;
  for (const CopyEvent& e : run.events) {
    switch (e.kind) {
      case CopyEvent::kDownloadQueued: ++downloads_out; break;
      case CopyEvent::kDownloadDone:
        ++downloads_done;
        --downloads_out;
        break;
      case CopyEvent::kNote:
        ++handed;
        // Every tensor is one download, handed over in the order they were queued.
        EXPECT_LE(handed, downloads_done) << "gradient " << e.note << " handed over before its download landed";
        break;
      case CopyEvent::kUploadQueued: ++uploads_queued; break;
      case CopyEvent::kUploadDone: ++uploads_done; break;
      case CopyEvent::kForward:
        ++forwards;
        EXPECT_EQ(uploads_done, uploads_queued) << "layer " << e.layer << " ran before an upload queued before it landed";
        break;
      case CopyEvent::kBackward: backward_while_out += downloads_out > 0; break;
      default:
        break;  // byte input: byte_input_test.cc
    }
  }
  EXPECT_EQ(handed, kSteps * 6);  // six tensors a step
  EXPECT_EQ(downloads_done, handed);
  EXPECT_GT(forwards, 0);
  EXPECT_GT(uploads_queued, 0);
  // Layers below are not held back by a download (2 ms each): every step has some.
  EXPECT_GE(backward_while_out, kSteps);
}

// Each step: 5 dense downloads and fc1's two reads; every hand-over after its reads.
void ExpectFactorsHandedOverAfterTheirReads(const std::vector<CopyEvent>& events) {
  int downloads_done = 0, handed = 0, factors_handed = 0;
  for (const CopyEvent& e : events) {
    if (e.kind == CopyEvent::kDownloadDone) ++downloads_done;
    if (e.kind != CopyEvent::kNote) continue;
    ++handed;
    if (e.note == "grad " + std::to_string(kFc1Weight)) ++factors_handed;
    EXPECT_LE(handed + factors_handed, downloads_done) << e.note << " handed over before its reads landed";
  }
  EXPECT_EQ(factors_handed, kSteps);
  EXPECT_EQ(downloads_done, kSteps * 7);
}

// Sufficient factors are read from two blobs without waiting: fc1's [δ | a] is handed over only
// once both reads landed, the same floats as on the plain path.
TEST_P(EmulatedCopies, FactorsAreHandedOverOnceBothReadsLanded) {
  TrainRun plain, emulated;
  ASSERT_NO_FATAL_FAILURE(Train(false, GetParam(), &plain, /*factors=*/true));
  ASSERT_NO_FATAL_FAILURE(Train(true, GetParam(), &emulated, /*factors=*/true));
  EXPECT_EQ(emulated.losses, plain.losses);
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    for (size_t t = 0; t < plain.grads[s].size(); ++t) {
      EXPECT_EQ(emulated.grads[s][t], plain.grads[s][t]) << "step " << s << " tensor " << t;
    }
  }
  ExpectFactorsHandedOverAfterTheirReads(emulated.events);
}

// δ packed in row blocks that cut rows (a push's per-chunk blocks, common/layout.h) by the device on
// the way down: the packed span is the plain path's [δ | a] with δ packed by the host's
// PackRowBlocks, bit for bit, and it is handed over only once its reads landed.
TEST_P(EmulatedCopies, FactorsPackedOnTheDeviceAreTheHostsPackingOfThePlainFactors) {
  constexpr int64_t kOut = 16, kIn = 256;                                  // fc1: 16 × (4·8·8)
  const std::vector<RowSpan> blocks = {{0, 6}, {5, 6}, {10, 5}, {15, 1}};  // 18 rows, three cut
  TrainRun plain, host, emulated;
  ASSERT_NO_FATAL_FAILURE(Train(false, GetParam(), &plain, /*factors=*/true));
  ASSERT_NO_FATAL_FAILURE(Train(false, GetParam(), &host, true, DType::kF32, blocks));
  ASSERT_NO_FATAL_FAILURE(Train(true, GetParam(), &emulated, true, DType::kF32, blocks));
  EXPECT_EQ(host.losses, plain.losses);
  EXPECT_EQ(emulated.losses, plain.losses);
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    const std::vector<float>& unpacked = plain.grads[s][kFc1Weight];
    std::vector<float> expected(unpacked.size(), 0.0f);
    PackRowBlocks(unpacked.data(), kBatch, kOut, blocks, expected.data());
    std::copy(unpacked.begin() + kBatch * kOut, unpacked.begin() + kBatch * (kOut + kIn),
              expected.begin() + kBatch * PackedRows(blocks));
    const size_t used = static_cast<size_t>(kBatch * (PackedRows(blocks) + kIn));
    ASSERT_EQ(host.grads[s][kFc1Weight].size(), expected.size());
    EXPECT_TRUE(std::equal(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(used),
                           host.grads[s][kFc1Weight].begin()))
        << "step " << s << ": the host backend's packing";
    EXPECT_EQ(emulated.grads[s][kFc1Weight], host.grads[s][kFc1Weight]) << "step " << s << ": the device's packing";
    for (size_t t = 0; t < plain.grads[s].size(); ++t) {
      if (t != kFc1Weight) {
        EXPECT_EQ(emulated.grads[s][t], plain.grads[s][t]) << "step " << s << " tensor " << t;
      }
    }
  }
  ExpectFactorsHandedOverAfterTheirReads(emulated.events);
}

// Gradients cast on the device (Net::SetGradDType): each handed-over 16-bit gradient is the host's
// cast of the plain path's f32 gradient (common/grad_codec.h), and none is handed over before its
// download landed. A host backend refuses, naming the net and the backend (16-bit weights too).
TEST_P(EmulatedCopies, GradientsCastOnTheDeviceAreTheHostsCastOfThePlainGradients) {
  for (DType cast : {DType::kF16, DType::kBf16}) {
    TrainRun plain, emulated;
    ASSERT_NO_FATAL_FAILURE(Train(false, GetParam(), &plain, false));
    ASSERT_NO_FATAL_FAILURE(Train(true, GetParam(), &emulated, false, cast));
    // The plain run updates; the cast one cannot (no f32 gradients): compare the first step only.
    for (size_t t = 0; t < plain.grads[0].size(); ++t) {
      std::vector<uint16_t> expected(plain.grads[0][t].size());
      CastFloats(plain.grads[0][t], cast, expected.data());
      std::vector<float> widened(expected.size());
      if (cast == DType::kF16) {
        HalfToFloats(expected.data(), widened);
      } else {
        Bf16ToFloats(expected.data(), widened);
      }
      EXPECT_EQ(emulated.grads[0][t], widened) << "tensor " << t << ": not the host's cast, or read before it landed";
    }
    int downloads_done = 0, handed = 0;
    for (const CopyEvent& e : emulated.events) {
      downloads_done += e.kind == CopyEvent::kDownloadDone;
      if (e.kind == CopyEvent::kNote) {
        EXPECT_LE(++handed, downloads_done) << e.note << " handed over before it landed";
      }
    }
  }
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecString(kNet, "copynet", &spec).ok());
  NetOptions no;
  no.batch = kBatch;
  no.reference = true;
  std::unique_ptr<Net> host;
  ASSERT_TRUE(Net::Create(spec, no, &host).ok());
  const Status s = host->SetGradDType(DType::kF16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("net 'tinyconv': 16-bit gradient downloads need a device backend; reference keeps"),
            std::string::npos)
      << s.message();
  const Status w = host->SetWeightDType(DType::kBf16);
  EXPECT_NE(w.message().find("net 'tinyconv': 16-bit weight uploads need a device backend"), std::string::npos)
      << w.message();
}

INSTANTIATE_TEST_SUITE_P(Uploads, EmulatedCopies, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "LayerByLayer" : "AllAtOnce"; });

}  // namespace
}  // namespace downpour::engine
