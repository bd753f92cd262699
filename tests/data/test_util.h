// test_util.h — helpers shared by the data tests: a per-test temporary directory, small
// file writers (IDX, raw bytes) and a hand protobuf encoder. Test-only; not thread-safe.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace downpour::data::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("downpour_data_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void PutBigEndian32(std::vector<uint8_t>* b, uint32_t v) {
  b->push_back(static_cast<uint8_t>(v >> 24));
  b->push_back(static_cast<uint8_t>(v >> 16));
  b->push_back(static_cast<uint8_t>(v >> 8));
  b->push_back(static_cast<uint8_t>(v));
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes,
                       bool gzip = false) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
  }
}

// IDX image file bytes: magic 0x803, [count, rows, cols], then pixels.
inline std::vector<uint8_t> IdxImageBytes(uint32_t count, uint32_t rows, uint32_t cols,
                                          const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> b;
  PutBigEndian32(&b, 0x803);
  PutBigEndian32(&b, count);
  PutBigEndian32(&b, rows);
  PutBigEndian32(&b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

inline std::vector<uint8_t> IdxLabelBytes(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> b;
  PutBigEndian32(&b, 0x801);
  PutBigEndian32(&b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Protobuf wire format written by hand, so tests check the project's readers against bytes that
// neither the project's writers nor the generated classes made. Tag = (field << 3) | wire type:
// 0 varint, 2 length-delimited, 5 32-bit.
inline void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
inline void PutTag(std::string* out, int field, int wire_type) {
  PutVarint(out, (uint64_t(field) << 3) | uint64_t(wire_type));
}
inline void PutVarintField(std::string* out, int field, uint64_t v) {
  PutTag(out, field, 0);
  PutVarint(out, v);
}
inline void PutBytesField(std::string* out, int field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

}  // namespace downpour::data::testing
