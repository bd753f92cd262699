// byte_input_train_test.cc — the worker's byte input end to end on the CPU: the LMDB loader's
// training source (loader_sources.h) with crops, padding, mirrors and a mean, the trainer, and a
// net on the device stand-in (client/engine/emulated_copy_backend.h), which normalises its input
// as a GPU does. The run takes byte batches, stages each next one during the step before, and
// ends with the weights of the same run on floats on a host backend, bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "client/engine/emulated_copy_backend.h"
#include "client/engine/net.h"
#include "client/engine/reference_backend.h"
#include "client/worker/loader_sources.h"
#include "client/worker/trainer.h"
#include "common/layout.h"
#include "data/datum.h"
#include "data/lmdb_io.h"
#include "data/shard.h"
#include "tests/client/test_nets.h"
#include "tests/data/test_util.h"

namespace downpour::worker {
namespace {

constexpr int kBatch = 8;
constexpr int kSteps = 7;

// 30 raw 1×10×10 records with varied pixels; labels 0..9.
void WriteDb(const std::string& path) {
  std::unique_ptr<data::LmdbWriter> writer;
  ASSERT_TRUE(data::LmdbWriter::Create(path, &writer).ok());
  std::vector<uint8_t> px(100);
  for (int i = 0; i < 30; ++i) {
    for (size_t p = 0; p < px.size(); ++p) px[p] = static_cast<uint8_t>((i * 37 + p * 11 + p * p) & 0xff);
    ASSERT_TRUE(writer->Put(data::RecordKey(i, "r"), data::MakeRawDatum(1, 10, 10, px.data(), i % 10)).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
}

struct Outcome {
  std::vector<float> weights;
  int normalised_on_device = 0;
  int inputs_queued = 0;
};

void Train(const RunConfig& c, bool device, Outcome* out) {
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecString(engine::testing::kTinyConvNet, "tinyconv", &spec).ok());
  engine::NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  no.reference = true;
  std::unique_ptr<engine::Net> net;
  engine::EmulatedCopyBackend* copies = nullptr;
  if (device) {
    auto b =
        std::make_unique<engine::EmulatedCopyBackend>(engine::MakeReferenceBackend(), std::chrono::microseconds(800));
    copies = b.get();
    ASSERT_TRUE(engine::Net::CreateWithBackend(spec, no, std::move(b), &net).ok());
  } else {
    ASSERT_TRUE(engine::Net::Create(spec, no, &net).ok());
  }
  net->InitParams(3);
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(net->param_specs(), 1, 64, &layout).ok());
  std::unique_ptr<TrainSource> source;
  const Status so = OpenLoaderTrainSource(c, 0, /*shuffle=*/true, 10, &source);
  ASSERT_TRUE(so.ok()) << so.ToString();
  TrainerOptions to;
  to.worker = c.worker;
  to.solver = c.solver;
  Trainer trainer(to, net.get(), nullptr, &layout, nullptr, source.get(), nullptr, nullptr, nullptr);
  TrainResult r;
  const Status s = trainer.Run(&r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(r.steps, kSteps);
  out->weights.assign(net->params().begin(), net->params().end());
  if (copies != nullptr) {
    for (const engine::CopyEvent& e : copies->events()) {
      out->normalised_on_device += e.kind == engine::CopyEvent::kInputNormalized;
      out->inputs_queued += e.kind == engine::CopyEvent::kInputQueued;
    }
  }
}

TEST(ByteInputTraining, TheLoadersBytesOnADeviceTrainAsItsFloatsOnTheHost) {
  data::testing::TempDir dir;
  WriteDb(dir / "train");
  RunConfig c;
  c.data.train = dir / "train";
  c.data.crop = 8;
  c.data.pad = 1;
  c.data.mirror = true;
  c.data.mean_values = {90};
  c.data.scale = 1.0f / 64;
  c.worker.batch_size = kBatch;
  c.worker.steps = kSteps;
  c.solver.base_lr = 0.05f;
  Outcome floats, bytes;
  ASSERT_NO_FATAL_FAILURE(Train(c, false, &floats));
  ASSERT_NO_FATAL_FAILURE(Train(c, true, &bytes));
  EXPECT_EQ(bytes.normalised_on_device, kSteps) << "the device did not take byte batches";
  EXPECT_EQ(bytes.inputs_queued, 2 * kSteps) << "each batch goes up once: its pixels and its windows";
  ASSERT_EQ(bytes.weights.size(), floats.weights.size());
  EXPECT_EQ(bytes.weights, floats.weights);
}

}  // namespace
}  // namespace downpour::worker
