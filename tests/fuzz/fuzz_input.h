// fuzz_input.h — how the libFuzzer targets (tests/fuzz/) read an input as a message, and the
// tiny shard they share. Built only with -DDOWNPOUR_FUZZ=ON (clang).
//
// An input is a sequence of frames, each a 2-byte little-endian length and that many bytes (at
// most 8 frames; a short last frame takes what is left). The first frame is the header.
//
// Thread-safety: the shard fixture is built once per process and used from the fuzzer's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/transport.h"

namespace downpour::fuzz {

inline constexpr size_t kMaxFrames = 8;

inline Frames SplitFrames(const uint8_t* data, size_t size) {
  Frames frames;
  size_t at = 0;
  while (at + 2 <= size && frames.size() < kMaxFrames) {
    size_t len = static_cast<size_t>(data[at]) | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    if (len > size - at) len = size - at;
    frames.push_back(Frame::Copy(data + at, len));
    at += len;
  }
  return frames;
}

inline std::string JoinFrames(const std::vector<std::string>& frames) {
  std::string out;
  for (const std::string& f : frames) {
    out.push_back(static_cast<char>(f.size() & 0xff));
    out.push_back(static_cast<char>((f.size() >> 8) & 0xff));
    out += f;
  }
  return out;
}

// The shard fuzzer's layout: server 0 of 2, chunks of at most 8 floats.
inline ParamLayout TinyLayout() {
  std::vector<TensorSpec> specs = {{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}, {"v", {17}, 1.0f, 1.0f}};
  ParamLayout layout;
  if (!ParamLayout::Build(specs, 2, 8, &layout).ok()) std::abort();
  return layout;
}

// A broken invariant: print and abort, so libFuzzer saves the input as a crash.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace downpour::fuzz
