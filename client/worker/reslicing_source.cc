// reslicing_source.cc — see reslicing_source.h.
#include "client/worker/reslicing_source.h"

namespace downpour::worker {

ReslicingSource::ReslicingSource(std::unique_ptr<TrainSource> first, DataSlice slice, Opener open,
                                 std::function<bool(DataSlice*)> deal,
                                 std::function<void(const DataSlice&, const DataSlice&, int)> on_change)
    : inner_(std::move(first)),
      slice_(slice),
      open_(std::move(open)),
      deal_(std::move(deal)),
      on_change_(std::move(on_change)) {}

Status ReslicingSource::Next(BatchView* batch) {
  DP_RETURN_IF_ERROR(inner_->Next(batch));
  batch->epoch += epoch_offset_;
  if (batch->epoch > last_epoch_) {  // the first batch of a new epoch: the moment to re-deal
    DataSlice dealt;
    if (deal_ && deal_(&dealt) && dealt.count >= 1 && dealt.index >= 0 && dealt.index < dealt.count &&
        !(dealt == slice_)) {
      std::unique_ptr<TrainSource> next;
      DP_RETURN_IF_ERROR(open_(dealt, &next));
      if (on_change_) on_change_(slice_, dealt, batch->epoch);
      inner_ = std::move(next);
      slice_ = dealt;
      epoch_offset_ = batch->epoch;  // the new slice's epoch 0 continues the count
      DP_RETURN_IF_ERROR(inner_->Next(batch));
      batch->epoch += epoch_offset_;
    }
  }
  last_epoch_ = batch->epoch;
  return Status::Ok();
}

}  // namespace downpour::worker
