// push_planner.cc — see push_planner.h.
#include "client/worker/push_planner.h"

#include <algorithm>

#include "common/status.h"

namespace downpour::worker {

PushPlanner::PushPlanner(const ParamLayout& layout, int64_t min_push_elems)
    : layout_(layout), min_push_elems_(min_push_elems) {
  tensor_chunks_.resize(layout_.tensors().size());
  server_total_chunks_.assign(static_cast<size_t>(layout_.servers()), 0);
  for (const Chunk& c : layout_.chunks()) {
    tensor_chunks_[static_cast<size_t>(c.tensor)].push_back(c.id);
    ++server_total_chunks_[static_cast<size_t>(c.server)];
  }
  Reset();
}

void PushPlanner::Reset() {
  tensor_ready_.assign(tensor_chunks_.size(), false);
  server_ready_chunks_.assign(server_total_chunks_.size(), 0);
  pending_.assign(server_total_chunks_.size(), PushGroup{});
  for (size_t s = 0; s < pending_.size(); ++s) pending_[s].server = static_cast<int>(s);
  released_chunks_ = 0;
}

void PushPlanner::MaybeRelease(int server, bool force, std::vector<PushGroup>* out) {
  PushGroup& group = pending_[static_cast<size_t>(server)];
  if (group.chunk_ids.empty()) return;
  const bool server_done =
      server_ready_chunks_[static_cast<size_t>(server)] == server_total_chunks_[static_cast<size_t>(server)];
  if (!force && !server_done && group.elems < min_push_elems_) return;
  std::sort(group.chunk_ids.begin(), group.chunk_ids.end());
  released_chunks_ += static_cast<int>(group.chunk_ids.size());
  out->push_back(std::move(group));
  group = PushGroup{};
  group.server = server;
}

std::vector<PushGroup> PushPlanner::OnTensorReady(int tensor) {
  DP_CHECK_GE(tensor, 0);
  DP_CHECK_LT(tensor, static_cast<int>(tensor_chunks_.size()));
  DP_CHECK(!tensor_ready_[static_cast<size_t>(tensor)]);
  tensor_ready_[static_cast<size_t>(tensor)] = true;

  std::vector<int> touched;
  for (int32_t id : tensor_chunks_[static_cast<size_t>(tensor)]) {
    const Chunk& c = layout_.chunk(id);
    PushGroup& group = pending_[static_cast<size_t>(c.server)];
    group.chunk_ids.push_back(id);
    group.elems += c.count;
    ++server_ready_chunks_[static_cast<size_t>(c.server)];
    if (std::find(touched.begin(), touched.end(), c.server) == touched.end()) touched.push_back(c.server);
  }
  std::vector<PushGroup> out;
  const bool release_each_tensor = min_push_elems_ <= 0;
  for (int s : touched) MaybeRelease(s, release_each_tensor, &out);
  return out;
}

std::vector<PushGroup> PushPlanner::Flush() {
  std::vector<PushGroup> out;
  for (int s = 0; s < static_cast<int>(pending_.size()); ++s) MaybeRelease(s, true, &out);
  return out;
}

}  // namespace downpour::worker
