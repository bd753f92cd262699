// chunk_store.cc — see chunk_store.h.
#include "server/chunk_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/grad_codec.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"
#include "server/elapsed.h"

namespace downpour {

// A chunk's weights plus the number of pull-reply frames the transport still reads from them.
// `readers` is decremented with release by the frame's keepalive when the transport is done, and
// read with acquire before an update, so an update never races a reply (copy-on-write).
struct ChunkStore::WeightBuffer {
  explicit WeightBuffer(std::vector<float> d) : data(std::move(d)) {}
  std::vector<float> data;
  std::atomic<int> readers{0};
};

ChunkStore::ChunkStore(const ParamLayout& layout, ChunkStoreOptions options)
    : layout_(layout), o_(std::move(options)), share_(layout, o_.server_id) {
  local_of_.assign(static_cast<size_t>(layout_.num_chunks()), -1);
  std::vector<int64_t> elems;
  int64_t largest = 0;
  for (int32_t id : layout_.ServerChunks(o_.server_id)) {
    local_of_[static_cast<size_t>(id)] = static_cast<int>(owned_.size());
    owned_.push_back(id);
    const int64_t n = layout_.chunk(id).count;
    elems.push_back(n);
    largest = std::max(largest, n);
    Chunk c;
    c.weights = std::make_shared<WeightBuffer>(std::vector<float>(static_cast<size_t>(n), 0.0f));
    c.state.assign(static_cast<size_t>(n), o_.rule->initial_state());
    chunks_.push_back(std::move(c));
  }
  lanes_ = std::make_unique<ApplyLanes>(std::max(1, o_.lanes), elems);
  // Each lane converts f16 / bf16 pull replies into buffers of its own pool (a pool is one
  // thread's): its share of two messages' worth (share_.floats: the shard's floats), and room
  // for its largest chunk.
  for (int i = 0; i < lanes_->lanes(); ++i) {
    pull_scratch_.push_back(std::make_unique<BufferPool<uint16_t>>(static_cast<size_t>(
        2 * share_.floats / static_cast<uint64_t>(lanes_->lanes()) + static_cast<uint64_t>(largest))));
  }
}

ChunkStore::~ChunkStore() { lanes_.reset(); }  // runs what was posted while the chunks are still here

int ChunkStore::local_of(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < local_of_.size() ? local_of_[static_cast<size_t>(id)] : -1;
}

int64_t ChunkStore::count(int local) const { return layout_.chunk(id(local)).count; }

const std::vector<float>& ChunkStore::weights(int local) const {
  return chunks_[static_cast<size_t>(local)].weights->data;
}

void ChunkStore::OnLane(int local, std::shared_ptr<const void> keep, std::function<void()> work) {
  if (keep == nullptr) {  // the data lives only during this call: the lane's earlier work, then this, now
    lanes_->DrainLane(lanes_->LaneOf(local));
    work();  // the lane is idle, and only this thread posts to it
    return;
  }
  const auto bytes = static_cast<size_t>(count(local)) * sizeof(float);
  lanes_->Post(local, bytes, [work = std::move(work), keep = std::move(keep)] { work(); });
}

std::vector<float>& ChunkStore::MutableWeights(int local) {
  Chunk& st = chunks_[static_cast<size_t>(local)];
  auto& w = st.weights;
  if (w->readers.load(std::memory_order_acquire) != 0) {
    // An in-flight pull reply still reads this buffer: the update goes to a copy; the old buffer
    // lives on in the reply's keepalive until the transport lets go of it, and is then the next
    // copy's home (st.spare), so a chunk pulled every step is not a fresh allocation and its
    // page faults every step.
    std::shared_ptr<WeightBuffer> next;
    if (st.spare != nullptr && st.spare.use_count() == 1 && st.spare->readers.load(std::memory_order_acquire) == 0) {
      next = std::move(st.spare);  // the acquire above orders the transport's last read before the writes
      std::memcpy(next->data.data(), w->data.data(), w->data.size() * sizeof(float));
    } else {
      next = std::make_shared<WeightBuffer>(w->data);
    }
    st.spare = std::move(w);
    w = std::move(next);
  }
  return w->data;
}

void ChunkStore::Apply(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
                       std::shared_ptr<const void> keep) {
  Chunk& st = chunks_[static_cast<size_t>(local)];
  const TensorSpec& t = layout_.tensors()[static_cast<size_t>(layout_.chunk(id(local)).tensor)];
  // The step is fixed here, at the chunk's place in message order; the lane only does the floats.
  UpdateParams p = MakeUpdateParams(o_.solver, st.iter, t.lr_mult, t.decay_mult, grad_scale);
  p.lr *= lr_scale;
  OnLane(local, std::move(keep), [this, local, grad, p, n = static_cast<size_t>(count(local))] {
    const auto t0 = std::chrono::steady_clock::now();
    float* weights = MutableWeights(local).data();
    float* state = chunks_[static_cast<size_t>(local)].state.data();
    o_.rule->Apply(p, std::span<const float>(grad, n), std::span<float>(weights, n), std::span<float>(state, n));
    apply_ns_.fetch_add(NanosSince(t0), std::memory_order_relaxed);
  });
  ++st.version;
  st.iter += ScheduleIterations(gradients, o_.push_every);
  ++updates_;
}

void ChunkStore::Add(int local, const float* delta, int64_t iters, std::shared_ptr<const void> keep) {
  OnLane(local, std::move(keep), [this, local, delta, n = static_cast<size_t>(count(local))] {
    static const AddRule kAdd;
    kAdd.Apply(UpdateParams{}, std::span<const float>(delta, n), std::span<float>(MutableWeights(local).data(), n), {});
  });
  Chunk& st = chunks_[static_cast<size_t>(local)];
  ++st.version;
  st.iter += iters;
  ++updates_;
}

bool ChunkStore::Init(int local, const float* w, std::shared_ptr<const void> keep) {
  Chunk& st = chunks_[static_cast<size_t>(local)];
  if (st.initialized) return false;
  OnLane(local, std::move(keep), [this, local, w, n = static_cast<size_t>(count(local))] {
    std::memcpy(MutableWeights(local).data(), w, n * sizeof(float));
  });
  st.initialized = true;
  return true;
}

void ChunkStore::ReadOne(int local, DType dtype, SharedRegion* region, Frame* out) {
  const std::shared_ptr<WeightBuffer>& buf = chunks_[static_cast<size_t>(local)].weights;
  if (region != nullptr) {  // the pull area follows the push area
    auto* area = reinterpret_cast<float*>(region->payload()) + share_.floats;
    std::memcpy(area + share_.offset[static_cast<size_t>(id(local))], buf->data.data(),
                buf->data.size() * sizeof(float));
    return;
  }
  if (dtype != DType::kF32) {  // the masters stay f32; the reply holds its pool buffer until sent
    BufferPool<uint16_t>* pool = pull_scratch_[static_cast<size_t>(lanes_->LaneOf(local))].get();
    std::shared_ptr<uint16_t[]> half = pool->Take(buf->data.size());
    if (dtype == DType::kF16) {
      FloatsToHalf(buf->data, half.get());
    } else {
      FloatsToBf16(buf->data, half.get());
    }
    *out = Frame::Borrow(half.get(), buf->data.size() * sizeof(uint16_t), half);
    return;
  }
  buf->readers.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const void> keep(buf->data.data(),
                                   [buf](const void*) { buf->readers.fetch_sub(1, std::memory_order_release); });
  *out = Frame::Borrow(buf->data.data(), buf->data.size() * sizeof(float), std::move(keep));  // zero-copy, COW
}

bool ChunkStore::Read(const std::vector<int>& locals, DType dtype, std::shared_ptr<SharedRegion> region,
                      Frames* payload, std::function<void()> done) {
  if (region == nullptr) payload->resize(locals.size());
  // Lanes with nothing to do: the loop reads the chunks itself, without a hand-off and a wake (a
  // pull between pushes, an evaluator's snapshot).
  if (std::all_of(locals.begin(), locals.end(), [&](int l) { return lanes_->Idle(lanes_->LaneOf(l)); })) {
    for (size_t i = 0; i < locals.size(); ++i) {
      ReadOne(locals[i], dtype, region.get(), region == nullptr ? &(*payload)[i] : nullptr);
    }
    return true;
  }
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(locals.size()));
  auto finish = std::make_shared<std::function<void()>>(std::move(done));
  for (size_t i = 0; i < locals.size(); ++i) {
    const int l = locals[i];
    Frame* out = region == nullptr ? &(*payload)[i] : nullptr;
    lanes_->Post(l, 0, [this, l, dtype, region, out, remaining, finish] {
      ReadOne(l, dtype, region.get(), out);
      if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1) (*finish)();
    });
  }
  return false;
}

void ChunkStore::Snapshot(std::vector<ShardCheckpoint::Chunk>* out) const {
  Drain();  // the weights and state with every taken update in them
  out->resize(chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    ShardCheckpoint::Chunk& c = (*out)[i];
    c.id = owned_[i];
    c.version = chunks_[i].version;
    c.iter = chunks_[i].iter;
    c.initialized = chunks_[i].initialized;
    c.weights = chunks_[i].weights->data;
    c.history = chunks_[i].state;
  }
}

void ChunkStore::Restore(std::vector<ShardCheckpoint::Chunk>* chunks) {
  Drain();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    ShardCheckpoint::Chunk& c = (*chunks)[i];
    chunks_[i].weights = std::make_shared<WeightBuffer>(std::move(c.weights));
    chunks_[i].spare = nullptr;
    chunks_[i].state = std::move(c.history);
    chunks_[i].version = c.version;
    chunks_[i].iter = c.iter;
    chunks_[i].initialized = c.initialized;
  }
}

void ChunkStore::Expect(ShardCheckpointExpect* expect) const {
  expect->update_rule = std::string(o_.rule->name());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    expect->chunk_ids.push_back(owned_[i]);
    expect->chunk_elems.push_back(chunks_[i].state.size());
  }
}

}  // namespace downpour
