// fuzz_corpus.cc — writes seed inputs for the libFuzzer targets: DIR/header/<type> (a valid header
// of every message type) and DIR/shard/<n> (valid messages to the shard fuzzer's server 0, in
// fuzz_input.h frames: register, pull, clock, stats, heartbeat, checkpoint, shutdown, init and
// gradient pushes with real payloads and checksums). Usage: fuzz_corpus DIR
#include <filesystem>
#include <fstream>

#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace downpour;

void Write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Bytes(const MessageHeader& h) {
  std::string b;
  if (!EncodeHeader(h, &b).ok()) fuzz::Fail("encode");
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_corpus DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "header");
  std::filesystem::create_directories(dir / "shard");
  const ParamLayout layout = fuzz::TinyLayout();
  for (uint16_t t = 1; t <= kMaxMsgType; ++t) {
    MessageHeader h;
    h.type = static_cast<MsgType>(t);
    h.sender = 1;
    h.layout_hash = layout.hash();
    h.chunk_ids = {0, 2};
    h.versions = {3, 4};
    h.elem_counts = {8, 8};
    h.byte_lengths = {32, 32};
    h.text = "text";
    h.token = "token";
    h.server_addresses = {"tcp://127.0.0.1:5600"};
    h.dead_workers = {2};
    if (h.type == MsgType::kStatsReply) h.stats.rejected_by_reason.assign(static_cast<size_t>(RejectReason::kCount), 1);
    Write(dir / "header" / MsgTypeName(h.type), Bytes(h));
  }
  int n = 0;
  auto base = [&](MsgType type) {
    MessageHeader h;
    h.type = type;
    h.sender = 0;
    h.request_id = 7;
    h.layout_hash = layout.hash();
    h.role = Role::kWorker;
    return h;
  };
  for (MsgType t : {MsgType::kRegister, MsgType::kPull, MsgType::kClock, MsgType::kStats, MsgType::kHeartbeat,
                    MsgType::kCheckpoint, MsgType::kShutdown}) {
    Write(dir / "shard" / std::to_string(n++), fuzz::JoinFrames({Bytes(base(t))}));
  }
  const auto owned = layout.ServerChunks(0);
  for (int variant = 0; variant < 3; ++variant) {  // init push; gradient push; with checksums
    MessageHeader h = base(MsgType::kPush);
    std::vector<std::string> frames(1);
    for (size_t k = 0; k < owned.size() && k < 2; ++k) {
      const auto count = static_cast<uint64_t>(layout.chunk(owned[k]).count);
      std::vector<float> g(count, 0.125f * static_cast<float>(k + 1));
      std::string payload(reinterpret_cast<const char*>(g.data()), count * 4);
      h.chunk_ids.push_back(static_cast<uint32_t>(owned[k]));
      h.elem_counts.push_back(count);
      h.byte_lengths.push_back(count * 4);
      if (variant > 0) h.versions.push_back(0);
      if (variant == 2) h.checksums.push_back(Crc32c(payload.data(), payload.size()));
      frames.push_back(payload);
    }
    if (variant == 0) h.flags = kFlagInit;
    frames[0] = Bytes(h);
    Write(dir / "shard" / std::to_string(n++), fuzz::JoinFrames(frames));
  }
  std::printf("fuzz_corpus: %d header seeds in %s, %d shard seeds in %s\n", kMaxMsgType,
              (dir / "header").c_str(), n, (dir / "shard").c_str());
  return 0;
}
