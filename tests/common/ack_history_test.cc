// Tests for common/ack_history.h: lines written by several threads read back whole and in full,
// a partial last line (a worker killed inside a write) skipped and counted, a malformed line
// before it an error naming the file and the line, a missing file kNotFound.
#include "common/ack_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class AckHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("downpour_acks_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<AckRecord> ReadAll(const std::string& path, uint64_t* partial, Status* s) {
    std::vector<AckRecord> out;
    *s = ReadAckHistory(path, [&](const AckRecord& r) { out.push_back(r); }, partial);
    return out;
  }
  fs::path dir_;
};

TEST_F(AckHistoryTest, PathIsInTheRunsHistoryDirectory) {
  EXPECT_EQ(AckHistoryPath("/runs/a", 3), "/runs/a/history/worker-3.acks");
}

TEST_F(AckHistoryTest, LinesFromManyThreadsComeBackWholeAndAppendAcrossOpens) {
  const std::string path = AckHistoryPath(dir_.string(), 1);
  {
    std::unique_ptr<AckHistoryWriter> w;
    ASSERT_TRUE(AckHistoryWriter::Open(path, &w).ok());  // makes history/
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&w, t] {
        for (uint64_t i = 0; i < 500; ++i) w->Add(AckRecord{t, 0xFFFFFFFFFFFFFFF0ull + static_cast<uint64_t>(t), i});
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(w->failed(), 0u);
  }
  {
    std::unique_ptr<AckHistoryWriter> w;  // a restarted process appends
    ASSERT_TRUE(AckHistoryWriter::Open(path, &w).ok());
    w->Add(AckRecord{7, 42, 43});
  }
  uint64_t partial = 9;
  Status s;
  const std::vector<AckRecord> got = ReadAll(path, &partial, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(partial, 0u);
  ASSERT_EQ(got.size(), 4u * 500 + 1);
  std::set<std::tuple<int, uint64_t, uint64_t>> seen;
  for (const AckRecord& r : got) seen.emplace(r.server, r.session, r.request_id);
  EXPECT_EQ(seen.size(), got.size());
  EXPECT_TRUE(seen.count({3, 0xFFFFFFFFFFFFFFF3ull, 499}));
  EXPECT_EQ(got.back().server, 7);
  EXPECT_EQ(got.back().request_id, 43u);
}

TEST_F(AckHistoryTest, APartialLastLineIsSkippedAndCounted) {
  fs::create_directories(dir_);
  const std::string path = (dir_ / "w.acks").string();
  std::ofstream(path) << "0 5 6\n1 5 7\n0 5";
  uint64_t partial = 0;
  Status s;
  const std::vector<AckRecord> got = ReadAll(path, &partial, &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(partial, 1u);
}

TEST_F(AckHistoryTest, AMalformedLineIsAnErrorNamingFileAndLine) {
  fs::create_directories(dir_);
  const std::string path = (dir_ / "w.acks").string();
  for (const char* bad : {"0 5 6\n0 x 7\n0 5 8\n", "0 5 6\n0 5\n", "0 5 6\n-1 5 7\n", "0 5 6\n0 5 7 8\n"}) {
    std::ofstream(path, std::ios::trunc) << bad;
    Status s;
    ReadAll(path, nullptr, &s);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << bad;
    EXPECT_THAT(s.message(), HasSubstr(path + ": line 2: expected \"<server> <session> <request id>\"")) << bad;
  }
}

TEST_F(AckHistoryTest, AMissingFileIsNotFound) {
  Status s;
  ReadAll((dir_ / "none.acks").string(), nullptr, &s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace downpour
