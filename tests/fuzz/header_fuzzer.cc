// header_fuzzer.cc — libFuzzer target for DecodeHeader: any bytes decode to an error or to a header
// that re-encodes and decodes to itself (stats travel only in a statsReply). Never crashes,
// never throws, never reads out of bounds (built with ASan + UBSan).
//
//   cmake -S . -B build-fuzz -G Ninja -DDOWNPOUR_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 \
//         -DCMAKE_C_COMPILER=clang-14 -DDOWNPOUR_ENABLE_CUDA=OFF
//   cmake --build build-fuzz --target header_fuzzer fuzz_corpus
//   build-fuzz/tests/fuzz/fuzz_corpus corpus/        # valid seeds of every message type
//   build-fuzz/tests/fuzz/header_fuzzer -max_total_time=60 corpus/header
#include "common/codec.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  MessageHeader h;
  if (!DecodeHeader(data, size, &h).ok()) return 0;
  std::string again;
  Status s = EncodeHeader(h, &again);
  if (!s.ok()) fuzz::Fail("decoded header does not re-encode: " + s.ToString());
  MessageHeader back;
  s = DecodeHeader(again.data(), again.size(), &back);
  if (!s.ok()) fuzz::Fail("re-encoded header does not decode: " + s.ToString());
  if (h.type != MsgType::kStatsReply) h.stats = ShardStatsWire{};
  if (!(back == h)) fuzz::Fail(std::string("header changed on re-encoding, type ") + MsgTypeName(h.type));
  return 0;
}
