// shard_fuzzer.cc — libFuzzer target for a live shard's validation: each input is one message
// (tests/fuzz/fuzz_input.h frames) sent by a registered worker to server 0 of a tiny 2-server
// layout over the in-process transport. The shard must answer; an error reply leaves every
// weight and version as it was and is counted once; pushes_received == pushes_applied +
// pushes_rejected + duplicates. A reply other than an error is fine (valid messages are part of
// the input space). Keys are on and the peer has the worker key, so shutdown and checkpoint are
// always refused and the one shard lives for the whole fuzzing process.
//
//   build-fuzz/tests/fuzz/shard_fuzzer -max_total_time=60 corpus/shard   (see header_fuzzer.cc)
#include <chrono>
#include <cstring>
#include <memory>

#include "common/inproc_transport.h"
#include "server/shard.h"
#include "tests/fuzz/fuzz_input.h"

namespace downpour::fuzz {
namespace {

using namespace std::chrono_literals;

struct Fixture {
  Fixture() {
    layout = TinyLayout();
    ShardOptions o;
    o.solver.base_lr = 0.01f;
    o.solver.momentum = 0.9f;
    o.access.keyed = true;
    if (!ShardServer::Create(layout, o, &shard).ok()) Fail("shard");
    std::unique_ptr<ServerEndpoint> ep;
    if (!transport.Bind("fuzz", &ep).ok()) Fail("bind");
    const std::string address = ep->address();
    shard->Start(std::move(ep));
    if (!transport.ConnectAs(address, PeerInfo{"worker", "127.0.0.9"}, &peer).ok()) Fail("connect");
    MessageHeader reg;
    reg.type = MsgType::kRegister;
    reg.layout_hash = layout.hash();
    reg.sender = 0;
    Exchange(One(reg));
    for (int32_t id : layout.ServerChunks(0)) {
      MessageHeader h;
      h.type = MsgType::kPush;
      h.sender = 0;
      h.flags = kFlagInit;
      h.layout_hash = layout.hash();
      const auto n = static_cast<uint64_t>(layout.chunk(id).count);
      h.chunk_ids = {static_cast<uint32_t>(id)};
      h.elem_counts = {n};
      h.byte_lengths = {n * 4};
      std::vector<float> w(n, 0.5f * static_cast<float>(id));
      Frames f = One(h);
      f.push_back(Frame::Copy(w.data(), n * 4));
      Exchange(std::move(f));
    }
  }
  static Frames One(const MessageHeader& h) {
    Frames f(1);
    if (!HeaderFrame(h, &f[0]).ok()) Fail("encode");
    return f;
  }
  MessageHeader Exchange(Frames f) {
    if (!peer->Send(std::move(f)).ok()) Fail("send");
    Frames reply;
    const Status s = peer->Receive(&reply, 10000ms);
    if (!s.ok()) Fail("no reply: " + s.ToString());
    MessageHeader r;
    if (!ParseHeader(reply, &r).ok()) Fail("reply does not decode");
    return r;
  }
  std::vector<std::vector<float>> Snapshot() const {
    std::vector<std::vector<float>> out;
    for (int32_t id : layout.ServerChunks(0)) {
      out.push_back(shard->ChunkWeights(id));
      out.back().push_back(static_cast<float>(shard->ChunkVersion(id)));
    }
    return out;
  }

  ParamLayout layout;
  InprocTransport transport;
  std::unique_ptr<ShardServer> shard;
  std::unique_ptr<ClientEndpoint> peer;
};

bool SameBytes(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  }
  return true;
}

}  // namespace
}  // namespace downpour::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  static fuzz::Fixture* fx = new fuzz::Fixture();  // lives for the process: the shard keeps its state
  Frames frames = fuzz::SplitFrames(data, size);
  if (frames.empty()) return 0;
  const auto before = fx->Snapshot();
  const ShardStatsWire st0 = fx->shard->Stats();
  const MessageHeader r = fx->Exchange(std::move(frames));
  const ShardStatsWire st1 = fx->shard->Stats();
  if (st1.pushes_received != st1.pushes_applied + st1.pushes_rejected + st1.duplicates) fuzz::Fail("push counters");
  uint64_t rej0 = 0, rej1 = 0;
  for (uint64_t v : st0.rejected_by_reason) rej0 += v;
  for (uint64_t v : st1.rejected_by_reason) rej1 += v;
  if (r.type == MsgType::kError) {
    if (rej1 != rej0 + 1) fuzz::Fail("an error reply not counted once");
    if (!fuzz::SameBytes(before, fx->Snapshot())) fuzz::Fail("refused message changed the shard: " + r.error_text);
  } else if (rej1 != rej0) {
    fuzz::Fail("a refusal counted for a message answered " + std::string(MsgTypeName(r.type)));
  }
  if (r.type == MsgType::kRegisterReply && r.assigned_id != 0) {  // keep the peer worker 0
    MessageHeader reg;
    reg.type = MsgType::kRegister;
    reg.layout_hash = fx->layout.hash();
    reg.sender = 0;
    fx->Exchange(fuzz::Fixture::One(reg));
  }
  return 0;
}
