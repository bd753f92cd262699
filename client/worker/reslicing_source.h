// reslicing_source.h — a TrainSource whose slice of a shared training set is dealt again at
// epoch boundaries, so that when workers join or leave a running job the living ones still
// cover the whole set between them (slice i of W: docs/config.md `data.sharding`;
// docs/operations.md "A worker that joins a running job").
//
// It wraps the source of the slice it reads now. When a batch of a new epoch comes out, it asks
// `deal()` for the slice this worker should read (its rank among the live workers and their
// number, from the coordinator's heartbeats: common/rendezvous.h data_slice); when that differs
// from the current one, the batch is dropped, the new slice's source is opened with `open` and
// reading goes on from its first batch. Epoch numbers keep counting across slices. Nothing
// changes while the membership does not, so a job whose workers all live reads exactly what it
// read before.
//
// SeekToStep (a resumed worker) replays the stream of the slice open at the time, which after a
// re-deal is not the stream the worker read before: a resume after a membership change reads
// data in another order (documented in docs/operations.md).
//
// Thread-safety: one thread, like every TrainSource. Owns the wrapped source.
#pragma once

#include <functional>
#include <memory>

#include "client/worker/sources.h"

namespace downpour::worker {

struct DataSlice {
  int index = 0;  // 0-based rank
  int count = 1;  // slices in all
  bool operator==(const DataSlice&) const = default;
};

class ReslicingSource : public TrainSource {
 public:
  using Opener = std::function<Status(const DataSlice&, std::unique_ptr<TrainSource>*)>;
  // `deal` returns false when it has no opinion (no coordinator reply yet): the slice stays.
  // `on_change(from, to, epoch)` hears of every re-deal (a log line).
  ReslicingSource(std::unique_ptr<TrainSource> first, DataSlice slice, Opener open,
                  std::function<bool(DataSlice*)> deal,
                  std::function<void(const DataSlice&, const DataSlice&, int)> on_change = {});

  Status Next(BatchView* batch) override;
  int64_t shard_size() const override { return inner_->shard_size(); }
  Status SeekToStep(int64_t step) override { return inner_->SeekToStep(step); }

  const DataSlice& slice() const { return slice_; }

 private:
  std::unique_ptr<TrainSource> inner_;
  DataSlice slice_;
  Opener open_;
  std::function<bool(DataSlice*)> deal_;
  std::function<void(const DataSlice&, const DataSlice&, int)> on_change_;
  int epoch_offset_ = 0;  // epochs completed on earlier slices
  int last_epoch_ = 0;    // epoch of the last batch handed out (inner numbering + offset)
};

}  // namespace downpour::worker
