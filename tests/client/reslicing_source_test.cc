// reslicing_source_test.cc — the data slice of a worker is dealt again at epoch boundaries
// (client/worker/reslicing_source.h): nothing changes while the membership does not; a new deal
// switches slices at the first batch of the next epoch, epochs keep counting, and a deal that
// is absent or invalid keeps the slice.
#include "client/worker/reslicing_source.h"

#include <gtest/gtest.h>

#include <vector>

namespace downpour::worker {
namespace {

// Batches of one image whose label says (slice index * 1000 + position in its epoch); an epoch
// of slice i of n has 12 / n batches.
class FakeSlice : public TrainSource {
 public:
  explicit FakeSlice(DataSlice s) : s_(s) {}
  Status Next(BatchView* b) override {
    const int per_epoch = 12 / s_.count;
    label_ = s_.index * 1000 + pos_ % per_epoch;
    b->data = &pixel_;
    b->labels = &label_;
    b->n = b->c = b->h = b->w = 1;
    b->epoch = pos_ / per_epoch;
    ++pos_;
    return Status::Ok();
  }
  int64_t shard_size() const override { return 12 / s_.count; }
  Status SeekToStep(int64_t step) override {
    pos_ = static_cast<int>(step);
    return Status::Ok();
  }

 private:
  DataSlice s_;
  int pos_ = 0;
  int label_ = 0;
  float pixel_ = 0;
};

struct Reader {
  DataSlice dealt{0, 2};
  bool have = true;
  std::vector<std::pair<DataSlice, DataSlice>> changes;
  std::unique_ptr<ReslicingSource> source;

  Reader() {
    source = std::make_unique<ReslicingSource>(
        std::make_unique<FakeSlice>(DataSlice{0, 2}), DataSlice{0, 2},
        [](const DataSlice& s, std::unique_ptr<TrainSource>* out) {
          *out = std::make_unique<FakeSlice>(s);
          return Status::Ok();
        },
        [this](DataSlice* s) {
          if (have) *s = dealt;
          return have;
        },
        [this](const DataSlice& from, const DataSlice& to, int) { changes.emplace_back(from, to); });
  }
  std::pair<int, int> Next() {  // (label, epoch)
    BatchView b;
    EXPECT_TRUE(source->Next(&b).ok());
    return {b.labels[0], b.epoch};
  }
};

TEST(ReslicingSource, AStableMembershipReadsExactlyTheSameStream) {
  Reader r;
  FakeSlice plain(DataSlice{0, 2});
  for (int i = 0; i < 30; ++i) {
    BatchView b;
    ASSERT_TRUE(plain.Next(&b).ok());
    const auto [label, epoch] = r.Next();
    EXPECT_EQ(label, b.labels[0]) << "batch " << i;
    EXPECT_EQ(epoch, b.epoch) << "batch " << i;
  }
  EXPECT_TRUE(r.changes.empty());
}

TEST(ReslicingSource, ANewDealTakesEffectAtTheNextEpochAndEpochsKeepCounting) {
  Reader r;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.Next(), std::make_pair(i, 0));  // slice 0 of 2: 6 batches an epoch
  r.dealt = DataSlice{2, 3};  // a joiner came: this worker is now rank 2 of 3
  for (int i = 3; i < 6; ++i) EXPECT_EQ(r.Next(), std::make_pair(i, 0)) << "the epoch is not over yet";
  // Epoch 1 starts on the new slice (4 batches an epoch), from its first batch.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.Next(), std::make_pair(2000 + i, 1));
  EXPECT_EQ(r.Next(), std::make_pair(2000, 2));
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_EQ(r.changes[0].first, (DataSlice{0, 2}));
  EXPECT_EQ(r.changes[0].second, (DataSlice{2, 3}));
  EXPECT_EQ(r.source->slice(), (DataSlice{2, 3}));
}

TEST(ReslicingSource, NoDealOrAnInvalidOneKeepsTheSlice) {
  Reader r;
  r.have = false;  // no coordinator reply yet
  for (int i = 0; i < 7; ++i) r.Next();
  r.have = true;
  r.dealt = DataSlice{3, 3};  // index out of range
  for (int i = 0; i < 6; ++i) r.Next();
  r.dealt = DataSlice{0, 0};
  for (int i = 0; i < 6; ++i) r.Next();
  EXPECT_TRUE(r.changes.empty());
  EXPECT_EQ(r.source->slice(), (DataSlice{0, 2}));
}

}  // namespace
}  // namespace downpour::worker
