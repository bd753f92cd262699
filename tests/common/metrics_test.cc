// Tests for common/metrics.h: the line format, escaping, round trip through the reader,
// non-finite numbers, many threads writing whole lines, and torn lines (a write that stopped
// half-way) kept apart by the writer and skipped by the reader.
#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <thread>

#include "common/env.h"
#include "tests/testing/fault_env.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("downpour_metrics_{}_{}", ::getpid(), name))
      .string();
}

TEST(MetricsTest, LineFormat) {
  EXPECT_EQ(FormatMetricLine(12.5, "worker", 3, "step",
                             {{"step", 10}, {"loss", 0.25}, {"ok", true}, {"phase", "train"}}),
            "{\"t\":12.500000,\"role\":\"worker\",\"id\":3,\"event\":\"step\",\"step\":10,"
            "\"loss\":0.25,\"ok\":true,\"phase\":\"train\"}");
}

TEST(MetricsTest, EscapesStrings) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\te\x01" "f"), "\"a\\\"b\\\\c\\nd\\te\\u0001f\"");
  EXPECT_EQ(JsonQuote("ünï"), "\"ünï\"");
}

TEST(MetricsTest, NonFiniteNumbersAreNull) {
  const std::string line = FormatMetricLine(
      1.0, "server", 0, "update",
      {{"nan", std::numeric_limits<double>::quiet_NaN()}, {"inf", INFINITY}, {"x", 1e-7}});
  EXPECT_THAT(line, HasSubstr("\"nan\":null,\"inf\":null,\"x\":1e-07"));
  MetricRecord r;
  ASSERT_TRUE(ParseMetricLine(line, "line", &r).ok());
  EXPECT_TRUE(r.Get("nan").is_null());
  EXPECT_DOUBLE_EQ(r.Get("x").AsDouble(), 1e-7);
}

TEST(MetricsTest, ParserRoundTripsAndRejectsGarbage) {
  const std::string tricky = "quote\" back\\ nl\n tab\t \x02 ü \xF0\x9F\x98\x80";
  const std::string line = FormatMetricLine(1732312345.25, "worker", 7, "eval",
                                            {{"name", tricky}, {"big", int64_t{1} << 40},
                                             {"neg", -3}, {"acc", 0.875f}, {"done", false}});
  MetricRecord r;
  Status s = ParseMetricLine(line, "line", &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.keys, (std::vector<std::string>{"t", "role", "id", "event", "name", "big", "neg",
                                              "acc", "done"}));
  EXPECT_DOUBLE_EQ(r.Get("t").AsDouble(), 1732312345.25);
  EXPECT_EQ(r.Get("role").AsString(), "worker");
  EXPECT_EQ(r.Get("id").AsInt(), 7);
  EXPECT_EQ(r.Get("name").AsString(), tricky);
  EXPECT_EQ(r.Get("big").AsInt(), int64_t{1} << 40);
  EXPECT_EQ(r.Get("neg").AsInt(), -3);
  EXPECT_EQ(r.Get("acc").AsDouble(), 0.875);
  EXPECT_FALSE(r.Get("done").AsBool());
  EXPECT_TRUE(r.Get("missing").is_null());
  // \u escapes with a surrogate pair, as other JSON writers produce them.
  ASSERT_TRUE(ParseMetricLine(R"({"s":"\u00fc\ud83d\ude00"})", "line", &r).ok());
  EXPECT_EQ(r.Get("s").AsString(), "ü\xF0\x9F\x98\x80");

  for (const char* bad : {"", "{", "{\"a\":}", "{\"a\":1", "{\"a\":1}x", "{\"a\":[1]}",
                          "{\"a\":1,\"a\":2}", "{a:1}", "{\"a\":\"x}", "{\"a\":1.2.3}"}) {
    EXPECT_FALSE(ParseMetricLine(bad, "f.jsonl:3", &r).ok()) << bad;
    EXPECT_THAT(ParseMetricLine(bad, "f.jsonl:3", &r).message(), HasSubstr("f.jsonl:3")) << bad;
  }
}

TEST(MetricsTest, WriterAppendsFlushedLinesWithInjectedClock) {
  const std::string path = TempPath("writer.jsonl");
  fs::remove(path);
  double now = 100.0;
  {
    std::unique_ptr<MetricsWriter> w;
    ASSERT_TRUE(MetricsWriter::Open(path, "server", 1, &w, [&now] { return now; }).ok());
    ASSERT_TRUE(w->Write("update", {{"version", 1}}).ok());
    // Visible before the writer closes: every line is flushed.
    std::vector<MetricRecord> mid;
    ASSERT_TRUE(ReadMetrics(path, &mid).ok());
    ASSERT_EQ(mid.size(), 1u);
    now = 101.5;
    ASSERT_TRUE(w->Write("update", {{"version", 2}}).ok());
  }
  {  // Re-opening appends.
    std::unique_ptr<MetricsWriter> w;
    ASSERT_TRUE(MetricsWriter::Open(path, "server", 1, &w).ok());
    ASSERT_TRUE(w->Write("stop", {}).ok());
  }
  std::vector<MetricRecord> records;
  ASSERT_TRUE(ReadMetrics(path, &records).ok());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].Get("t").AsDouble(), 100.0);
  EXPECT_EQ(records[1].Get("t").AsDouble(), 101.5);
  EXPECT_EQ(records[1].Get("version").AsInt(), 2);
  EXPECT_EQ(records[2].Get("event").AsString(), "stop");
  EXPECT_GT(records[2].Get("t").AsDouble(), 1.5e9) << "default clock is wall time since epoch";
  fs::remove(path);
}

TEST(MetricsTest, ConcurrentWritersProduceWholeLines) {
  const std::string path = TempPath("threads.jsonl");
  fs::remove(path);
  std::unique_ptr<MetricsWriter> w;
  ASSERT_TRUE(MetricsWriter::Open(path, "worker", 0, &w).ok());
  constexpr int kThreads = 8, kLines = 500;
  const std::string payload(300, 'x');  // long lines make interleaving likely if it can happen
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLines; ++i) {
        EXPECT_TRUE(w->Write("step", {{"thread", t}, {"i", i}, {"pad", payload}}).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<MetricRecord> records;
  Status s = ReadMetrics(path, &records);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(records.size(), size_t{kThreads * kLines});
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& r : records) seen.insert({r.Get("thread").AsInt(), r.Get("i").AsInt()});
  EXPECT_EQ(seen.size(), size_t{kThreads * kLines});
  fs::remove(path);
}

TEST(MetricsTest, OpenFailureNamesThePath) {
  std::unique_ptr<MetricsWriter> w;
  Status s = MetricsWriter::Open("/nonexistent-dir/m.jsonl", "worker", 0, &w);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir/m.jsonl"));
  std::vector<MetricRecord> records;
  EXPECT_EQ(ReadMetrics("/nonexistent-dir/m.jsonl", &records).code(), StatusCode::kNotFound);
}

// A full disk stops a line half-way: that write fails naming the file, the next line starts on
// a line of its own, and the reader gives back every whole line and the torn one's number.
TEST(MetricsTest, ATornLineStandsAloneAndTheReaderSkipsIt) {
  const std::string path = TempPath("torn.jsonl");
  fs::remove(path);
  std::unique_ptr<MetricsWriter> w;
  ASSERT_TRUE(MetricsWriter::Open(path, "worker", 0, &w, [] { return 5.0; }).ok());
  ASSERT_TRUE(w->Write("step", {{"step", 1}}).ok());
  test::FaultEnv env;
  {
    ScopedEnv scoped(&env);
    env.FillDiskAfter(20);
    Status s = w->Write("step", {{"step", 2}});
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_THAT(s.message(), HasSubstr(path + ": write failed after 20 of"));
    // Still full: nothing goes down, and the line before stays the torn one.
    env.FillDiskAfter(0);
    EXPECT_FALSE(w->Write("step", {{"step", 3}}).ok());
    env.FillDiskAfter(-1);  // space again
    ASSERT_TRUE(w->Write("step", {{"step", 4}}).ok());
    ASSERT_TRUE(w->Write("step", {{"step", 5}}).ok());
  }
  const std::string whole = [](int step) {
    return FormatMetricLine(5.0, "worker", 0, "step", {{"step", step}}) + "\n";
  }(1);
  EXPECT_EQ(test::ReadFile(path), whole + FormatMetricLine(5.0, "worker", 0, "step", {{"step", 2}}).substr(0, 20) +
                                      "\n" + FormatMetricLine(5.0, "worker", 0, "step", {{"step", 4}}) + "\n" +
                                      FormatMetricLine(5.0, "worker", 0, "step", {{"step", 5}}) + "\n");
  std::vector<MetricRecord> records;
  std::vector<int> torn;
  Status s = ReadMetrics(path, &records, &torn);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].Get("step").AsInt(), 1);
  EXPECT_EQ(records[1].Get("step").AsInt(), 4);
  EXPECT_EQ(records[2].Get("step").AsInt(), 5);
  EXPECT_EQ(torn, std::vector<int>{2});
  fs::remove(path);
}

// A process that died after a torn write (the launcher, a server restarted after its disk
// filled) opens the file again: its first line does not run on from the torn one.
TEST(MetricsTest, AWriterOpeningAFileWithATornLastLineStartsOnANewLine) {
  const std::string path = TempPath("reopen.jsonl");
  const std::string first = FormatMetricLine(1.0, "launcher", 0, "start", {});
  test::WriteFile(path, first + "\n" + first.substr(0, 11));
  {
    std::unique_ptr<MetricsWriter> w;
    ASSERT_TRUE(MetricsWriter::Open(path, "launcher", 0, &w, [] { return 2.0; }).ok());
    ASSERT_TRUE(w->Write("end", {{"code", 0}}).ok());
    ASSERT_TRUE(w->Write("end", {{"code", 1}}).ok());
  }
  std::vector<MetricRecord> records;
  std::vector<int> torn;
  ASSERT_TRUE(ReadMetrics(path, &records, &torn).ok());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[1].Get("code").AsInt(), 0);
  EXPECT_EQ(records[2].Get("code").AsInt(), 1);
  EXPECT_EQ(torn, std::vector<int>{2});
  // A file that ends whole gets no blank line.
  test::WriteFile(path, first + "\n");
  {
    std::unique_ptr<MetricsWriter> w;
    ASSERT_TRUE(MetricsWriter::Open(path, "launcher", 0, &w, [] { return 1.0; }).ok());
    ASSERT_TRUE(w->Write("start", {}).ok());
  }
  EXPECT_EQ(test::ReadFile(path), first + "\n" + first + "\n");
  fs::remove(path);
}

// Only the start of a line is taken for torn: a line that ends in '}' and does not parse, or
// one with a bad character in the middle, is damage, and the read fails naming file and line.
TEST(MetricsTest, DamageThatIsNotATornLineIsAnError) {
  const std::string path = TempPath("damaged.jsonl");
  const std::string good = FormatMetricLine(1.0, "server", 0, "update", {{"version", 1}});
  for (const std::string bad : {"{\"t\":1,\"a\":}", "{\"t\":1,\"role\"=\"server\"}", "{\"t\":1,\"a\":2} {\"t\":2}"}) {
    SCOPED_TRACE(bad);
    test::WriteFile(path, good + "\n" + bad + "\n" + good + "\n");
    std::vector<MetricRecord> records;
    std::vector<int> torn;
    Status s = ReadMetrics(path, &records, &torn);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(path + ":2"));
  }
  fs::remove(path);
}

}  // namespace
}  // namespace downpour
