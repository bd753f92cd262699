// Tests for common/trace.h: thread spans nest and carry their args, message spans come as b/e
// pairs with one id, the capacity keeps the first events and counts the rest, off records
// nothing and writes nothing, many threads record whole events, and the file is JSON that
// Python's parser reads with every event's fields in place.
#include "common/trace.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = TraceLog::Clock;
using namespace std::chrono_literals;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST(TraceLogTest, ThreadSpansNestAndCarryTheirArgs) {
  TraceLog log("server 3", 100);
  const int loop = log.Thread("loop");
  const Clock::time_point t0 = Clock::now();
  log.Span(loop, "server", "push", t0, t0 + 30ms, {{"worker", 1}, {"chunks", 12}});
  log.Span(loop, "server", "factors", t0 + 5ms, t0 + 25ms);
  ASSERT_EQ(log.size(), 2u);
  const std::string json = log.ToJson();
  EXPECT_THAT(json, HasSubstr("\"name\":\"process_name\""));
  EXPECT_THAT(json, HasSubstr("\"args\":{\"name\":\"server 3\"}"));
  EXPECT_THAT(json, HasSubstr("\"tid\":0,\"args\":{\"name\":\"loop\"}"));
  EXPECT_THAT(json, HasSubstr("\"ph\":\"X\",\"cat\":\"server\",\"name\":\"push\""));
  EXPECT_THAT(json, HasSubstr("\"dur\":30000.000,\"args\":{\"worker\":1,\"chunks\":12}"));
  EXPECT_THAT(json, HasSubstr("\"name\":\"factors\""));
  EXPECT_THAT(json, HasSubstr("\"dur\":20000.000,\"args\":{}"));
}

TEST(TraceLogTest, MessageSpansAreBeginEndPairsWithOneId) {
  TraceLog log("worker 0", 100);
  const int io = log.Thread("to server 0");
  const Clock::time_point t0 = Clock::now();
  log.Async(io, "client", "push part", 7, t0, t0 + 2ms, {{"bytes", 4194304}});
  log.Async(io, "client", "pull part", 0, t0, t0 + 1ms);  // 0: the log picks an id
  const std::string json = log.ToJson();
  EXPECT_EQ(Count(json, "\"ph\":\"b\""), 2u);
  EXPECT_EQ(Count(json, "\"ph\":\"e\""), 2u);
  EXPECT_EQ(Count(json, "\"id\":\"0x7\""), 2u);
  EXPECT_THAT(json, HasSubstr("\"bytes\":4194304"));
}

TEST(TraceLogTest, TheFirstEventsAreKeptAndTheRestCounted) {
  TraceLog log("worker 1", 3);
  const int t = log.Thread("train");
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 10; ++i)
    log.Span(t, "worker", "step", t0 + i * 1ms, t0 + (i + 1) * 1ms, {{"step", static_cast<double>(i)}});
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(log.dropped(), 7u);
  const std::string json = log.ToJson();
  EXPECT_THAT(json, HasSubstr("\"step\":2}"));
  EXPECT_THAT(json, Not(HasSubstr("\"step\":3}")));
  EXPECT_THAT(json, HasSubstr("\"events\":3,\"dropped\":7,\"capacity\":3"));
}

TEST(TraceLogTest, OffRecordsNothingAndWritesNoFile) {
  TraceLog log("worker 0", 0);
  EXPECT_FALSE(log.on());
  const int t = log.Thread("train");
  { TraceSpan s(&log, t, "worker", "step"); }
  log.Async(t, "client", "push part", 1, Clock::now(), Clock::now());
  EXPECT_EQ(log.size(), 0u);
  EXPECT_EQ(log.dropped(), 0u);
  const fs::path dir = test::ScratchDir("trace_off");
  ASSERT_TRUE(log.Write((dir / "t" / "w.json").string()).ok());
  EXPECT_FALSE(fs::exists(dir / "t"));
  fs::remove_all(dir);
  { TraceSpan s(nullptr, 0, "worker", "step"); }  // a null log is off too
}

TEST(TraceLogTest, TraceSpanTimesItsScopeAndKeepsItsArgs) {
  TraceLog log("worker 0", 10);
  const int t = log.Thread("train");
  {
    TraceSpan s(&log, t, "worker", "push wait");
    s.Arg("step", 4);
    s.Arg("step", 5);  // set again: the last value
    std::this_thread::sleep_for(2ms);
  }
  TraceSpan ended(&log, t, "worker", "compute");
  ended.End();
  ended.End();  // once
  ASSERT_EQ(log.size(), 2u);
  const std::string json = log.ToJson();
  EXPECT_THAT(json, HasSubstr("\"args\":{\"step\":5}"));
  EXPECT_THAT(json, Not(HasSubstr("\"dur\":0.000,\"args\":{\"step\"")));
}

TEST(TraceLogTest, ManyThreadsRecordWholeEvents) {
  TraceLog log("server 0", 100000);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&log, k] {
      const int t = log.Thread(fmt::format("t{}", k));
      for (int i = 0; i < 5000; ++i) {
        TraceSpan s(&log, t, "server", "pull");
        s.Arg("i", i);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(log.size(), 20000u);
  EXPECT_EQ(Count(log.ToJson(), "\"name\":\"pull\""), 20000u);
}

// The file is JSON: Python's parser reads it, and every event has the fields its phase needs.
TEST(TraceLogTest, TheFileIsJsonThatParsesWithEveryField) {
  ASSERT_EQ(std::system("python3 -c pass >/dev/null 2>&1"), 0) << "python3 not found (scripts/bootstrap installs it)";
  TraceLog log("server \"1\"\n", 100);  // a name that needs escaping
  const int t = log.Thread("loop");
  const Clock::time_point t0 = Clock::now();
  log.Span(t, "server", "push", t0, t0 + 1ms, {{"worker", 0}, {"ratio", 0.25}});
  log.Async(t, "link", "egress", 0, t0, t0 + 3ms, {{"bytes", 100}});
  const fs::path dir = test::ScratchDir("trace_json");
  const fs::path path = dir / "trace" / "server-1.json";
  ASSERT_TRUE(log.Write(path.string()).ok());
  const fs::path check = dir / "check.py";
  test::WriteFile(check, R"(import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
assert d["otherData"]["events"] == 2, d["otherData"]
assert [e["ph"] for e in ev] == ["M", "M", "X", "b", "e"], ev
assert ev[0]["args"]["name"] == 'server "1"\n'
x, b, e = ev[2], ev[3], ev[4]
assert abs(x["dur"] - 1000.0) < 1e-3 and x["args"] == {"worker": 0, "ratio": 0.25}, x
assert b["id"] == e["id"] and abs(e["ts"] - b["ts"] - 3000.0) < 1e-2, (b, e)
assert abs(b["ts"] - x["ts"]) < 1e-2
)");
  const int rc = std::system(fmt::format("python3 {} {}", check.string(), path.string()).c_str());
  EXPECT_EQ(rc, 0) << test::ReadFile(path);
  if (rc == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour
