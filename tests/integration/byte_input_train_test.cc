// byte_input_train_test.cc — the worker's byte input end to end on the CPU: the LMDB loader's
// training source (loader_sources.h) with crops, padding, mirrors and a mean, the trainer, and a
// net on the device stand-in (client/engine/emulated_copy_backend.h), which normalises its input
// as a GPU does. The run takes byte batches, stages each next one during the step before, and
// ends with the weights of the same run on floats on a host backend, bit for bit. The loader's
// test source likewise: evaluation on bytes gives the floats' loss and accuracy, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
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

// The tiny conv net at kBatch (seed 3) on the reference backend, or with `device` on the device
// stand-in over it (`copies`; null otherwise).
void MakeNet(bool device, std::unique_ptr<engine::Net>* net, engine::EmulatedCopyBackend** copies) {
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecString(engine::testing::kTinyConvNet, "tinyconv", &spec).ok());
  engine::NetOptions no;
  no.batch = kBatch;
  no.worker.threads = 1;
  no.reference = true;
  *copies = nullptr;
  if (device) {
    auto b =
        std::make_unique<engine::EmulatedCopyBackend>(engine::MakeReferenceBackend(), std::chrono::microseconds(800));
    *copies = b.get();
    ASSERT_TRUE(engine::Net::CreateWithBackend(spec, no, std::move(b), net).ok());
  } else {
    ASSERT_TRUE(engine::Net::Create(spec, no, net).ok());
  }
  (*net)->InitParams(3);
}

struct Outcome {
  std::vector<float> weights;
  int normalised_on_device = 0;
  int inputs_queued = 0;
};

void Train(const RunConfig& c, bool device, Outcome* out) {
  std::unique_ptr<engine::Net> net;
  engine::EmulatedCopyBackend* copies = nullptr;
  ASSERT_NO_FATAL_FAILURE(MakeNet(device, &net, &copies));
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

// The test source, noting each Next() in the device's event log.
class NotingTestSource : public TestSource {
 public:
  NotingTestSource(std::unique_ptr<TestSource> inner, engine::EmulatedCopyBackend* device)
      : inner_(std::move(inner)), device_(device) {}
  Status Rewind() override { return inner_->Rewind(); }
  Status Next(BatchView* batch, bool* has_batch) override {
    if (device_ != nullptr) device_->Note("next");
    return inner_->Next(batch, has_batch);
  }
  Status UseBytes(bool* used, InputNormalization* norm) override { return inner_->UseBytes(used, norm); }

 private:
  std::unique_ptr<TestSource> inner_;
  engine::EmulatedCopyBackend* device_;
};

struct EvalOutcome {
  std::vector<EvalRecord> records;
  int normalised = 0, queued = 0;
  int staged = 0;  // input copies queued after a forward and before the next Next(): staged ahead
};

// Three evaluations of the same weights: the whole test set, again (after the short last batch
// the net is shaped back up), and its first two batches.
void Evaluate(const RunConfig& c, bool device, EvalOutcome* out) {
  std::unique_ptr<engine::Net> net;
  engine::EmulatedCopyBackend* copies = nullptr;
  ASSERT_NO_FATAL_FAILURE(MakeNet(device, &net, &copies));
  std::unique_ptr<TestSource> loader;
  const Status so = OpenLoaderTestSource(c, kBatch, 10, &loader);
  ASSERT_TRUE(so.ok()) << so.ToString();
  NotingTestSource test(std::move(loader), copies);
  for (int max_batches : {0, 0, 2}) {
    EvalRecord r;
    const Status s = EvaluateNet(net.get(), &test, max_batches, &r);
    ASSERT_TRUE(s.ok()) << s.ToString();
    out->records.push_back(r);
  }
  if (copies == nullptr) return;
  bool after_forward = false;
  std::vector<uint64_t> done;
  for (const engine::CopyEvent& e : copies->events()) {
    switch (e.kind) {
      case engine::CopyEvent::kForward:
        after_forward = true;
        break;
      case engine::CopyEvent::kNote:
        after_forward = false;
        break;
      case engine::CopyEvent::kInputQueued:
        ++out->queued;
        out->staged += after_forward;
        break;
      case engine::CopyEvent::kInputDone:
        done.push_back(e.ticket);
        break;
      case engine::CopyEvent::kInputNormalized:
        ++out->normalised;
        EXPECT_NE(std::find(done.begin(), done.end(), e.ticket), done.end()) << "normalised before its upload landed";
        break;
      default:
        break;
    }
  }
}

// The test set as bytes (TestSource::UseBytes) on the device stand-in evaluates as its floats on
// the host, bit for bit: 30 records in batches of 8 (the last of 6), twice, then two batches. Each
// batch goes up once, and every batch but a pass's first is staged while the one before runs.
TEST(ByteInputTraining, TheLoadersTestBytesOnADeviceEvaluateAsItsFloatsOnTheHost) {
  data::testing::TempDir dir;
  WriteDb(dir / "test");
  RunConfig c;
  c.data.test = dir / "test";
  c.data.crop = 8;
  c.data.mean_values = {90};
  c.data.scale = 1.0f / 64;
  EvalOutcome floats, bytes;
  ASSERT_NO_FATAL_FAILURE(Evaluate(c, false, &floats));
  ASSERT_NO_FATAL_FAILURE(Evaluate(c, true, &bytes));
  ASSERT_EQ(bytes.records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(bytes.records[i].images, i < 2 ? 30 : 16) << "evaluation " << i;
    EXPECT_EQ(bytes.records[i].images, floats.records[i].images) << "evaluation " << i;
    EXPECT_EQ(bytes.records[i].loss, floats.records[i].loss) << "evaluation " << i;
    EXPECT_EQ(bytes.records[i].top1, floats.records[i].top1) << "evaluation " << i;
    EXPECT_EQ(bytes.records[i].top5, floats.records[i].top5) << "evaluation " << i;
    EXPECT_TRUE(bytes.records[i].byte_input) << "evaluation " << i;
    EXPECT_FALSE(floats.records[i].byte_input) << "evaluation " << i;
  }
  EXPECT_EQ(bytes.normalised, 4 + 4 + 2) << "the device did not take byte batches";
  EXPECT_EQ(bytes.queued, 2 * (4 + 4 + 2)) << "each batch goes up once: its pixels and its windows";
  EXPECT_EQ(bytes.staged, 2 * (3 + 3 + 1)) << "a batch was not staged while the one before ran";
}

}  // namespace
}  // namespace downpour::worker
