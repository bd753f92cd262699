#include "bench/ps/bare_zmq.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <ctime>
#include <thread>

#include <zmq.hpp>

#include "common/status.h"

namespace downpour::bench {
namespace {

// CPU time of this process, all threads (s).
double ProcessCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace
namespace {

// One server thread: for each request (identity + frames), reply with the same frame sizes
// taken from its own weight buffer (zero-copy send of the resident buffer, as a server does).
// `weights` is owned by the caller and outlives the context: the last zero-copy reply may still
// be in ZeroMQ's I/O thread when this function returns.
void ServeBare(zmq::context_t& ctx, int port, const std::vector<int64_t>& frames, int total_requests,
               std::vector<float>& weights, std::atomic<bool>& ready, const CurveOptions& curve) {
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::sndhwm, 0);
  router.set(zmq::sockopt::rcvhwm, 0);
  if (curve.enabled) {
    router.set(zmq::sockopt::curve_server, 1);
    router.set(zmq::sockopt::curve_secretkey, curve.server_secret);
  }
  router.bind("tcp://127.0.0.1:" + std::to_string(port));
  int64_t total = 0;
  for (int64_t n : frames) total += n;
  weights.assign(static_cast<size_t>(total), 1.0f);
  ready = true;
  for (int r = 0; r < total_requests; ++r) {
    zmq::message_t identity;
    DP_CHECK(router.recv(identity).has_value());
    std::vector<zmq::message_t> payload;
    for (;;) {
      zmq::message_t part;
      DP_CHECK(router.recv(part).has_value());
      bool more = part.more();
      payload.push_back(std::move(part));
      if (!more) break;
    }
    router.send(identity, zmq::send_flags::sndmore);
    int64_t offset = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t out(weights.data() + offset, frames[i] * sizeof(float), nullptr, nullptr);
      offset += frames[i];
      router.send(out, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

}  // namespace

BareResult RunBareZmq(const std::vector<std::vector<int64_t>>& frames_per_server, int workers, int warmup_rounds,
                      int rounds, int base_port, const CurveOptions& server, const CurveOptions& client) {
  const int servers = static_cast<int>(frames_per_server.size());
  // Declared before the context so they are destroyed after it (zero-copy frames in flight).
  std::vector<std::vector<float>> server_weights(static_cast<size_t>(servers));
  zmq::context_t ctx(2);
  std::vector<std::atomic<bool>> ready(servers);
  std::vector<std::thread> server_threads;
  for (int s = 0; s < servers; ++s) {
    ready[s] = false;
    server_threads.emplace_back(ServeBare, std::ref(ctx), base_port + s, std::cref(frames_per_server[s]),
                                workers * (warmup_rounds + rounds), std::ref(server_weights[static_cast<size_t>(s)]),
                                std::ref(ready[s]), std::cref(server));
  }
  for (int s = 0; s < servers; ++s)
    while (!ready[s]) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  int64_t total_floats = 0;
  for (const auto& f : frames_per_server)
    for (int64_t n : f) total_floats += n;

  std::atomic<int> started{0};
  std::chrono::steady_clock::time_point t0;
  // When each worker's last round ended: the timed span stops at the last of them, before the
  // sockets are closed (as the other peers of the load benchmark count it).
  std::vector<std::chrono::steady_clock::time_point> done(static_cast<size_t>(workers));
  std::vector<double> done_cpu(static_cast<size_t>(workers), 0.0);  // the process's CPU then
  double cpu0 = 0;
  auto worker_fn = [&](int w) {
    std::vector<zmq::socket_t> dealers;
    for (int s = 0; s < servers; ++s) {
      dealers.emplace_back(ctx, zmq::socket_type::dealer);
      dealers.back().set(zmq::sockopt::sndhwm, 0);
      dealers.back().set(zmq::sockopt::rcvhwm, 0);
      if (client.enabled) {
        dealers.back().set(zmq::sockopt::curve_serverkey, client.server_public);
        dealers.back().set(zmq::sockopt::curve_publickey, client.client_public);
        dealers.back().set(zmq::sockopt::curve_secretkey, client.client_secret);
      }
      dealers.back().connect("tcp://127.0.0.1:" + std::to_string(base_port + s));
    }
    std::vector<float> grads(static_cast<size_t>(total_floats), 0.5f);
    std::vector<float> pulled(static_cast<size_t>(total_floats));
    for (int r = 0; r < warmup_rounds + rounds; ++r) {
      if (r == warmup_rounds) {
        if (started.fetch_add(1) == 0) {
          t0 = std::chrono::steady_clock::now();
          cpu0 = ProcessCpu();
        }
      }
      // Push to every server first (all in flight at once), then collect every reply.
      int64_t offset = 0;
      for (int s = 0; s < servers; ++s) {
        const auto& frames = frames_per_server[s];
        for (size_t i = 0; i < frames.size(); ++i) {
          zmq::message_t out(grads.data() + offset, frames[i] * sizeof(float), nullptr, nullptr);
          offset += frames[i];
          dealers[s].send(out, i + 1 < frames.size() ? zmq::send_flags::sndmore
                                                     : zmq::send_flags::none);
        }
      }
      offset = 0;
      for (int s = 0; s < servers; ++s) {
        for (size_t i = 0; i < frames_per_server[s].size(); ++i) {
          zmq::message_t in;
          DP_CHECK(dealers[s].recv(in).has_value());
          std::memcpy(pulled.data() + offset, in.data(), in.size());  // into the engine buffer
          offset += frames_per_server[s][i];
        }
      }
    }
    done[static_cast<size_t>(w)] = std::chrono::steady_clock::now();
    done_cpu[static_cast<size_t>(w)] = ProcessCpu();
  };
  std::vector<std::thread> worker_threads;
  for (int w = 0; w < workers; ++w) worker_threads.emplace_back(worker_fn, w);
  for (auto& t : worker_threads) t.join();
  const auto last = std::max_element(done.begin(), done.end());
  const auto t1 = *last;
  const double cpu1 = done_cpu[static_cast<size_t>(last - done.begin())];
  for (auto& t : server_threads) t.join();

  BareResult result;
  result.seconds = std::chrono::duration<double>(t1 - t0).count();
  result.rounds = rounds;
  result.bytes_moved = 2.0 * static_cast<double>(total_floats) * sizeof(float) * workers * rounds;
  result.cpu_seconds = cpu1 - cpu0;
  return result;
}

}  // namespace downpour::bench
