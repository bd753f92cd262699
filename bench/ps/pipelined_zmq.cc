#include "bench/ps/pipelined_zmq.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/solver/sgd.h"

namespace downpour::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The header frame of every message, both directions (8 bytes, host byte order: one host).
enum class PipeOp : uint32_t { kPush = 1, kPull = 2, kAck = 3, kPullReply = 4 };
struct PipeHeader {
  uint32_t chunk = 0;  // global chunk id (ParamLayout::chunks() index)
  PipeOp op = PipeOp::kPush;
};
static_assert(sizeof(PipeHeader) == 8);

// A recv that gives up after this long aborts the run: a stuck peer is a broken benchmark.
constexpr int kRecvTimeoutMs = 60000;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

PipeHeader ReadHeader(const zmq::message_t& m) {
  DP_CHECK(m.size() == sizeof(PipeHeader));
  PipeHeader h;
  std::memcpy(&h, m.data(), sizeof h);
  return h;
}

zmq::message_t HeaderMessage(uint32_t chunk, PipeOp op) {
  const PipeHeader h{chunk, op};
  return zmq::message_t(&h, sizeof h);
}

// One server's resident state: weights and momentum history of the chunks it owns (local index
// = position in layout.ServerChunks(s)), and its counters for the timed rounds. Owned by
// RunPipelinedZmq and declared before the contexts, so the weights outlive every zero-copy
// pull reply still queued in an I/O thread.
struct ServerState {
  std::vector<int> local_of;                 // global chunk id -> local index, -1 = not ours
  std::vector<std::vector<float>> weights;   // [local][count]
  std::vector<std::vector<float>> history;   // [local][count] (update=sgd only)
  std::vector<int64_t> version;              // [local] updates applied
  std::atomic<bool> ready{false};
  int64_t updates = 0;      // timed rounds only (read after join)
  double sgd_seconds = 0;   // timed rounds only
  double busy_seconds = 0;  // timed rounds only
};

void InitServerState(const ParamLayout& layout, int s, RefUpdate update, ServerState* st) {
  st->local_of.assign(static_cast<size_t>(layout.num_chunks()), -1);
  const auto owned = layout.ServerChunks(s);
  for (size_t l = 0; l < owned.size(); ++l) {
    const Chunk& c = layout.chunk(owned[l]);
    st->local_of[static_cast<size_t>(c.id)] = static_cast<int>(l);
    st->weights.emplace_back(static_cast<size_t>(c.count), 0.01f);
    if (update == RefUpdate::kSgd) st->history.emplace_back(static_cast<size_t>(c.count), 0.0f);
  }
  st->version.assign(owned.size(), 0);
}

// One push chunk, update=sgd: the shards' update rule on the chunk, gradient read in place.
void ApplySgd(const ParamLayout& layout, const SolverConfig& solver, int local, const zmq::message_t& payload,
              const Chunk& c, ServerState* st, std::vector<float>* scratch) {
  const auto n = static_cast<size_t>(c.count);
  DP_CHECK(payload.size() == n * sizeof(float));
  const float* grad = static_cast<const float*>(payload.data());
  if (reinterpret_cast<uintptr_t>(grad) % alignof(float) != 0) {  // as the shards do: copy once
    scratch->resize(n);
    std::memcpy(scratch->data(), payload.data(), payload.size());
    grad = scratch->data();
  }
  const TensorSpec& t = layout.tensors()[static_cast<size_t>(c.tensor)];
  const auto l = static_cast<size_t>(local);
  const UpdateParams p = MakeUpdateParams(solver, st->version[l], t.lr_mult, t.decay_mult, 1.0f);
  SgdUpdate(p, std::span<const float>(grad, n), st->weights[l], st->history[l]);
  ++st->version[l];
}

// One server thread: `total_messages` requests (push and pull chunks of every worker's rounds),
// each answered on its own as it arrives.
void ServePipelined(zmq::context_t& ctx, const ParamLayout& layout, const PipelinedOptions& o, int s,
                    int64_t total_messages, const std::atomic<bool>& timing, ServerState* st) {
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::sndhwm, 0);
  router.set(zmq::sockopt::rcvhwm, 0);
  router.set(zmq::sockopt::rcvtimeo, kRecvTimeoutMs);
  router.bind(o.addresses[static_cast<size_t>(s)]);
  st->ready = true;
  std::vector<float> scratch;
  for (int64_t m = 0; m < total_messages; ++m) {
    zmq::message_t identity, header;
    DP_CHECK(router.recv(identity).has_value());  // a timeout here = a lost peer: abort
    const Clock::time_point t0 = Clock::now();
    DP_CHECK(identity.more());
    DP_CHECK(router.recv(header).has_value());
    const PipeHeader h = ReadHeader(header);
    DP_CHECK(h.chunk < static_cast<uint32_t>(layout.num_chunks()));
    const int local = st->local_of[h.chunk];
    DP_CHECK(local >= 0);
    const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk));
    if (h.op == PipeOp::kPush) {
      DP_CHECK(header.more());
      zmq::message_t payload;
      DP_CHECK(router.recv(payload).has_value());
      if (o.update == RefUpdate::kSgd) {
        const Clock::time_point u0 = Clock::now();
        ApplySgd(layout, o.solver, local, payload, c, st, &scratch);
        if (timing) {
          st->sgd_seconds += Seconds(Clock::now() - u0);
          ++st->updates;
        }
      }
      router.send(identity, zmq::send_flags::sndmore);
      router.send(HeaderMessage(h.chunk, PipeOp::kAck), zmq::send_flags::none);
    } else {
      DP_CHECK(h.op == PipeOp::kPull);
      router.send(identity, zmq::send_flags::sndmore);
      router.send(HeaderMessage(h.chunk, PipeOp::kPullReply), zmq::send_flags::sndmore);
      std::vector<float>& w = st->weights[static_cast<size_t>(local)];
      router.send(zmq::message_t(w.data(), w.size() * sizeof(float), nullptr, nullptr), zmq::send_flags::none);
    }
    if (timing) st->busy_seconds += Seconds(Clock::now() - t0);
  }
}

// Per-worker results, merged after join.
struct WorkerLatencies {
  std::vector<double> push, pull;
};

// One worker's rounds. `started` counts workers past warmup; the first one sets `t0` and turns
// `timing` on for the servers.
void RunWorker(const ParamLayout& layout, const PipelinedOptions& o, std::atomic<int>& started,
               std::atomic<bool>& timing, Clock::time_point& t0, Clock::time_point* done, WorkerLatencies* lat) {
  const int servers = layout.servers();
  zmq::context_t ctx(2);
  std::vector<zmq::socket_t> dealers;
  for (int s = 0; s < servers; ++s) {
    dealers.emplace_back(ctx, zmq::socket_type::dealer);
    dealers.back().set(zmq::sockopt::sndhwm, 0);
    dealers.back().set(zmq::sockopt::rcvhwm, 0);
    dealers.back().connect(o.addresses[static_cast<size_t>(s)]);
  }
  const auto total = static_cast<size_t>(layout.total_elems());
  const std::vector<float> grads(total, 1e-3f);  // zero-copy source of every push: never changes
  std::vector<float> weights(total, 0.01f);
  std::vector<Clock::time_point> push_sent(static_cast<size_t>(layout.num_chunks()));
  std::vector<Clock::time_point> pull_sent(static_cast<size_t>(layout.num_chunks()));
  std::vector<zmq::pollitem_t> items;
  for (auto& d : dealers) items.push_back(zmq::pollitem_t{d.handle(), 0, ZMQ_POLLIN, 0});

  for (int r = 0; r < o.warmup_rounds + o.rounds; ++r) {
    const bool timed = r >= o.warmup_rounds;
    if (r == o.warmup_rounds && started.fetch_add(1) == 0) {
      t0 = Clock::now();
      timing = true;
    }
    // Every push chunk to every server, then every pull request: nothing waits for an answer.
    for (int s = 0; s < servers; ++s) {
      for (int32_t id : layout.ServerChunks(s)) {
        const Chunk& c = layout.chunk(id);
        push_sent[static_cast<size_t>(id)] = Clock::now();
        dealers[static_cast<size_t>(s)].send(HeaderMessage(static_cast<uint32_t>(id), PipeOp::kPush),
                                             zmq::send_flags::sndmore);
        dealers[static_cast<size_t>(s)].send(
            zmq::message_t(const_cast<float*>(grads.data() + c.flat_offset), static_cast<size_t>(c.count) * sizeof(float),
                           nullptr, nullptr),
            zmq::send_flags::none);
      }
    }
    for (int s = 0; s < servers; ++s) {
      for (int32_t id : layout.ServerChunks(s)) {
        pull_sent[static_cast<size_t>(id)] = Clock::now();
        dealers[static_cast<size_t>(s)].send(HeaderMessage(static_cast<uint32_t>(id), PipeOp::kPull),
                                             zmq::send_flags::none);
      }
    }
    // Every ack and every pull reply, from whichever server answers first.
    int outstanding = 2 * layout.num_chunks();
    while (outstanding > 0) {
      const int ready = zmq::poll(items, std::chrono::milliseconds(kRecvTimeoutMs));
      DP_CHECK(ready > 0);  // nothing for a minute: a lost peer, abort
      for (size_t s = 0; s < items.size(); ++s) {
        if ((items[s].revents & ZMQ_POLLIN) == 0) continue;
        for (;;) {
          zmq::message_t header;
          if (!dealers[s].recv(header, zmq::recv_flags::dontwait).has_value()) break;
          const PipeHeader h = ReadHeader(header);
          DP_CHECK(h.chunk < static_cast<uint32_t>(layout.num_chunks()));
          const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk));
          if (h.op == PipeOp::kPullReply) {
            DP_CHECK(header.more());
            zmq::message_t payload;
            DP_CHECK(dealers[s].recv(payload).has_value());
            DP_CHECK(payload.size() == static_cast<size_t>(c.count) * sizeof(float));
            std::memcpy(weights.data() + c.flat_offset, payload.data(), payload.size());  // into the engine buffer
            if (timed) lat->pull.push_back(Seconds(Clock::now() - pull_sent[h.chunk]));
          } else {
            DP_CHECK(h.op == PipeOp::kAck);
            if (timed) lat->push.push_back(Seconds(Clock::now() - push_sent[h.chunk]));
          }
          --outstanding;
        }
      }
    }
  }
  *done = Clock::now();  // before the sockets and the context are torn down
}

}  // namespace

const char* RefUpdateName(RefUpdate u) { return u == RefUpdate::kSgd ? "sgd" : "none"; }

PipelinedResult RunPipelinedZmq(const ParamLayout& layout, int workers, const PipelinedOptions& o) {
  const int servers = layout.servers();
  DP_CHECK(static_cast<int>(o.addresses.size()) == servers);
  // Declared before the server context: destroyed after it, so zero-copy replies stay valid.
  std::vector<ServerState> states(static_cast<size_t>(servers));
  for (int s = 0; s < servers; ++s) InitServerState(layout, s, o.update, &states[static_cast<size_t>(s)]);
  std::atomic<bool> timing{false};
  zmq::context_t server_ctx(2);
  std::vector<std::thread> server_threads;
  for (int s = 0; s < servers; ++s) {
    const int64_t messages = int64_t{2} * workers * (o.warmup_rounds + o.rounds) *
                             static_cast<int64_t>(layout.ServerChunks(s).size());
    server_threads.emplace_back(ServePipelined, std::ref(server_ctx), std::cref(layout), std::cref(o), s, messages,
                                std::cref(timing), &states[static_cast<size_t>(s)]);
  }
  for (auto& st : states)
    while (!st.ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  std::atomic<int> started{0};
  Clock::time_point t0;
  std::vector<WorkerLatencies> lat(static_cast<size_t>(workers));
  std::vector<Clock::time_point> done(static_cast<size_t>(workers));  // each worker's last round end
  std::vector<std::thread> worker_threads;
  for (int w = 0; w < workers; ++w) {
    worker_threads.emplace_back(RunWorker, std::cref(layout), std::cref(o), std::ref(started), std::ref(timing),
                                std::ref(t0), &done[static_cast<size_t>(w)], &lat[static_cast<size_t>(w)]);
  }
  for (auto& t : worker_threads) t.join();
  const Clock::time_point t1 = *std::max_element(done.begin(), done.end());
  for (auto& t : server_threads) t.join();

  PipelinedResult result;
  result.seconds = Seconds(t1 - t0);
  result.rounds = o.rounds;
  result.bytes_moved = 2.0 * static_cast<double>(layout.total_elems()) * sizeof(float) * workers * o.rounds;
  for (const ServerState& st : states) {
    result.updates += st.updates;
    result.sgd_seconds += st.sgd_seconds;
    result.busy_seconds += st.busy_seconds;
  }
  for (const WorkerLatencies& l : lat) {
    result.push_latency.insert(result.push_latency.end(), l.push.begin(), l.push.end());
    result.pull_latency.insert(result.pull_latency.end(), l.pull.begin(), l.pull.end());
  }
  return result;
}

}  // namespace downpour::bench
