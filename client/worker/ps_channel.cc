// ps_channel.cc — see ps_channel.h.
#include "client/worker/ps_channel.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>

namespace downpour::worker {
namespace {

double SteadyS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PsChannel::PsChannel(PsClient* client, std::chrono::milliseconds wait_timeout, std::function<Status(int64_t)> on_clock,
                     std::function<Status()> on_leave)
    : client_(client),
      wait_timeout_(wait_timeout),
      on_clock_(std::move(on_clock)),
      on_leave_(std::move(on_leave)),
      watcher_([this] { WatchLoop(); }) {}

PsChannel::~PsChannel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

// Each round polls the oldest pending request per (server, kind), the first for up to 1 ms, the
// others only if already done; every 10th round polls all (see ps_channel.h). PsClient::Wait
// answers kTimeout both for "not done yet" (the request stays) and for a request that failed by
// timing out (then forgotten): an "unknown request" after a kTimeout therefore means the
// kTimeout was the request's own result.
void PsChannel::WatchLoop() {
  std::map<uint64_t, Status> last_timeout;  // watcher-local: handle → its last kTimeout answer
  std::unique_lock<std::mutex> lock(mu_);
  for (uint64_t round = 0;; ++round) {
    cv_.wait(lock, [&] { return stop_ || watching_ > 0; });
    if (stop_) return;
    std::vector<std::pair<uint64_t, RequestId>> watch;
    std::set<std::pair<int, bool>> polled;  // (server, push) whose oldest pending is in `watch`
    for (const auto& [handle, r] : requests_) {  // handles ascend in issue order
      if (r.done) continue;
      if (round % 10 == 0 || polled.insert({r.server, r.push}).second) watch.emplace_back(handle, r.id);
    }
    lock.unlock();
    bool first = true;
    for (const auto& [handle, id] : watch) {
      std::vector<int64_t> staleness;
      Status s = client_->Wait(id, std::chrono::milliseconds(first ? 1 : 0), &staleness);
      first = false;
      if (s.code() == StatusCode::kTimeout) {
        last_timeout[handle] = s;
        continue;
      }
      if (s.code() == StatusCode::kInvalidArgument && last_timeout.count(handle) != 0) s = last_timeout[handle];
      last_timeout.erase(handle);
      const double now = SteadyS();
      {
        std::lock_guard<std::mutex> guard(mu_);
        Request& r = requests_.at(handle);
        r.done = true;
        r.done_s = now;
        r.status = std::move(s);
        r.staleness = std::move(staleness);
        --watching_;
      }
      cv_.notify_all();
    }
    lock.lock();
  }
}

uint64_t PsChannel::Track(RequestId id, int server, bool push, std::vector<int32_t> chunks, double issued_s) {
  uint64_t handle = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handle = next_handle_++;
    Request& r = requests_[handle];
    r.id = id;
    r.server = server;
    r.push = push;
    r.chunks = std::move(chunks);
    r.issued_s = issued_s;
    ++watching_;
  }
  cv_.notify_all();
  return handle;
}

Status PsChannel::Await(uint64_t handle, std::vector<int32_t>* chunks, std::vector<int64_t>* staleness) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) {
    return InvalidArgument("worker channel: request handle {} is unknown (already waited?)", handle);
  }
  if (!cv_.wait_for(lock, wait_timeout_, [&] { return it->second.done; })) {
    const Request& r = it->second;
    return Timeout("worker channel: {} request {} to {} not done within {} ms (the servers' hold limit plus "
                   "cluster.server_wait_ms)",
                   r.push ? "push" : "pull", r.id, r.server < 0 ? "the servers" : fmt::format("server {}", r.server),
                   wait_timeout_.count());
  }
  Request r = std::move(it->second);
  requests_.erase(it);
  lock.unlock();
  spans_.push_back(WireSpan{r.issued_s, r.done_s});
  if (chunks != nullptr) *chunks = std::move(r.chunks);
  if (staleness != nullptr) *staleness = std::move(r.staleness);
  return r.status;
}

void PsChannel::FillVersions(const std::vector<int32_t>& chunks, PullInfo* info) const {
  *info = PullInfo{};
  if (chunks.empty()) return;
  const auto versions = client_->last_versions();
  info->version_min = std::numeric_limits<int64_t>::max();
  for (int32_t c : chunks) {
    const int64_t v = versions[static_cast<size_t>(c)];
    info->version_min = std::min(info->version_min, v);
    info->version_max = std::max(info->version_max, v);
    info->version_sum += v;
  }
}

Status PsChannel::Pull(int64_t clock, std::span<float> weights, PullInfo* info) {
  const double t0 = SteadyS();
  return AwaitAll(client_->Pull(weights, clock), t0, info);
}

Status PsChannel::Pull16(int64_t clock, std::span<uint16_t> weights, PullInfo* info) {
  const double t0 = SteadyS();
  return AwaitAll(client_->Pull16(weights, clock), t0, info);
}

// A pull of every chunk, issued at `t0`, waited for.
Status PsChannel::AwaitAll(RequestId id, double t0, PullInfo* info) {
  std::vector<int32_t> all(static_cast<size_t>(client_->layout().num_chunks()));
  std::iota(all.begin(), all.end(), 0);
  const uint64_t handle = Track(id, -1, false, std::move(all), t0);
  std::vector<int32_t> chunks;
  DP_RETURN_IF_ERROR(Await(handle, &chunks));
  FillVersions(chunks, info);
  return Status::Ok();
}

Status PsChannel::StartPull(int64_t clock, std::span<const int32_t> chunk_ids, std::span<float> weights,
                            PullHandle* handle) {
  DP_CHECK(!chunk_ids.empty());
  const double t0 = SteadyS();
  *handle = TrackChunks(client_->PullChunks(weights, chunk_ids, clock), chunk_ids, t0);
  return Status::Ok();
}

Status PsChannel::StartPull16(int64_t clock, std::span<const int32_t> chunk_ids, std::span<uint16_t> weights,
                              PullHandle* handle) {
  DP_CHECK(!chunk_ids.empty());
  const double t0 = SteadyS();
  *handle = TrackChunks(client_->PullChunks16(weights, chunk_ids, clock), chunk_ids, t0);
  return Status::Ok();
}

// A pull of `chunk_ids` started at `t0`, tracked (and attributed to their server when it is one).
uint64_t PsChannel::TrackChunks(RequestId id, std::span<const int32_t> chunk_ids, double t0) {
  const auto& layout = client_->layout();
  const int server = layout.chunk(chunk_ids.front()).server;
  const bool one_server = std::all_of(chunk_ids.begin(), chunk_ids.end(),
                                      [&](int32_t c) { return layout.chunk(c).server == server; });
  return Track(id, one_server ? server : -1, false, std::vector<int32_t>(chunk_ids.begin(), chunk_ids.end()), t0);
}

Status PsChannel::WaitPull(PullHandle handle, PullInfo* info) {
  std::vector<int32_t> chunks;
  DP_RETURN_IF_ERROR(Await(handle, &chunks));
  FillVersions(chunks, info);
  return Status::Ok();
}

bool PsChannel::PullDone(PullHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = requests_.find(handle);
  return it != requests_.end() && it->second.done;
}

Status PsChannel::StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads,
                            PushHandle* handle) {
  const double t0 = SteadyS();
  const uint64_t h = Track(client_->PushChunks(grads, group.chunk_ids, clock, factors_, push_versions_, push_cast_),
                           group.server, true, {}, t0);
  pending_pushes_.push_back(h);
  if (handle != nullptr) *handle = h;
  return Status::Ok();
}

int64_t PsChannel::PulledVersion(int32_t chunk) const {
  // Written by the pull's I/O thread before its completion, which the caller has waited for.
  return client_->last_versions()[static_cast<size_t>(chunk)];
}

Status PsChannel::SetPushFactors(std::span<const PushFactor> factors) {
  factors_.clear();
  for (const PushFactor& f : factors) factors_.push_back(FactorTensor{f.tensor, f.batch});
  return Status::Ok();
}

Status PsChannel::AwaitPush(uint64_t handle, PushInfo* info) {
  std::vector<int64_t> staleness;
  Status s = Await(handle, nullptr, &staleness);
  // The servers' own measure, from the acks (the value they count in their stats).
  for (int64_t v : staleness) {
    ++info->chunks;
    info->staleness_sum += v;
    info->staleness_max = std::max(info->staleness_max, v);
    info->staleness_known = true;
  }
  return s;
}

Status PsChannel::WaitPush(PushHandle handle, PushInfo* info) {
  const auto it = std::find(pending_pushes_.begin(), pending_pushes_.end(), handle);
  if (it == pending_pushes_.end())
    return InvalidArgument("worker channel: push handle {} is unknown (already waited?)", handle);
  pending_pushes_.erase(it);
  return AwaitPush(handle, info);
}

Status PsChannel::WaitPushes(PushInfo* info) {
  Status first;
  for (uint64_t handle : pending_pushes_) {
    Status s = AwaitPush(handle, info);
    if (!s.ok() && first.ok()) first = s;
  }
  pending_pushes_.clear();
  return first;
}

Status PsChannel::PushElastic(int64_t clock, std::span<const float> diff, PushInfo* info) {
  pending_pushes_.push_back(Track(client_->PushElastic(diff, clock), -1, true, {}, SteadyS()));
  return WaitPushes(info);
}

Status PsChannel::Clock(int64_t clock) { return on_clock_ ? on_clock_(clock) : Status::Ok(); }

Status PsChannel::Leave() { return on_leave_ ? on_leave_() : Status::Ok(); }

std::vector<WireSpan> PsChannel::TakeWireSpans() {
  std::vector<WireSpan> out;
  out.swap(spans_);
  return out;
}

}  // namespace downpour::worker
