// lmdb_io_test.cc — LmdbEnv::OpenReadOnly on damaged copies of a real LMDB: an empty,
// short or truncated data.mdb (a copy cut off by a full disk or an interrupted transfer) is
// one kCorrupt error naming the directory and the sizes, from the env and from the loader,
// never a SIGBUS at the first read; an intact copy still opens and reads.
#include "data/lmdb_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/datum.h"
#include "data/loader.h"
#include "tests/data/test_util.h"

namespace downpour::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// 300 raw 3x16x16 records: ~230 KB of pages, so "half the file" cuts through record pages.
void WriteDb(const std::string& path) {
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(path, &writer).ok());
  std::vector<uint8_t> px(3 * 16 * 16);
  for (int i = 0; i < 300; ++i) {
    for (size_t p = 0; p < px.size(); ++p) px[p] = static_cast<uint8_t>(i + p);
    ASSERT_TRUE(writer->Put(RecordKey(i, "r"), MakeRawDatum(3, 16, 16, px.data(), i % 10)).ok());
  }
  ASSERT_TRUE(writer->Finish().ok());
}

// A copy of `src` whose data.mdb is cut to `bytes`.
std::string TruncatedCopy(const std::string& src, const std::string& dst, uintmax_t bytes) {
  fs::create_directories(dst);
  fs::copy_file(fs::path(src) / "data.mdb", fs::path(dst) / "data.mdb");
  fs::resize_file(fs::path(dst) / "data.mdb", bytes);
  return dst;
}

TEST(LmdbEnv, IntactCopyOpensAndReads) {
  TempDir dir;
  WriteDb(dir / "db");
  std::unique_ptr<LmdbEnv> env;
  ASSERT_TRUE(LmdbEnv::OpenReadOnly(dir / "db", &env).ok());
  EXPECT_EQ(env->entries(), 300);
  std::unique_ptr<ReadTxn> txn;
  ASSERT_TRUE(ReadTxn::Begin(env.get(), &txn).ok());
  int records = 0;
  bool found = false;
  ASSERT_TRUE(txn->First(&found).ok());
  while (found) {
    ++records;
    ASSERT_TRUE(txn->Next(&found).ok());
  }
  EXPECT_EQ(records, 300);
}

// LMDB forbids opening one database twice in a process (its lock file's locks are per process,
// so a second MDB_env takes the file for unused and re-initialises the reader table under the
// first one's readers). Every open of a path shares one environment: two loaders of the same
// LMDB, or a loader and an entry count, read side by side. Before, the second open crashed a
// reader thread about once in 750 runs of MeanFile.LoaderSubtractsABinaryprotoMean.
TEST(LmdbEnv, OpensOfOneDatabaseShareOneEnvironmentWhateverThePathSaysAndCloseWithTheLast) {
  TempDir dir;
  WriteDb(dir / "db");
  fs::create_directory_symlink(dir / "db", dir / "link");
  std::unique_ptr<LmdbEnv> a, b, c;
  ASSERT_TRUE(LmdbEnv::OpenReadOnly(dir / "db", &a).ok());
  ASSERT_TRUE(LmdbEnv::OpenReadOnly(dir / "link", &b).ok());
  ASSERT_TRUE(LmdbEnv::OpenReadOnly(dir / "db/", &c).ok());
  EXPECT_EQ(a->env(), b->env());
  EXPECT_EQ(a->env(), c->env());
  EXPECT_EQ(b->path(), dir / "link");  // each keeps the path it was given, for its messages
  std::unique_ptr<ReadTxn> ta, tb;
  ASSERT_TRUE(ReadTxn::Begin(a.get(), &ta).ok());
  ASSERT_TRUE(ReadTxn::Begin(b.get(), &tb).ok());  // on the same thread: MDB_NOTLS
  a.reset();
  ta.reset();
  c.reset();
  std::string_view v;
  EXPECT_TRUE(tb->Get(RecordKey(7, "r"), &v).ok());  // the environment outlives a and c
  tb.reset();
  b.reset();
  // All closed: a copy written at the same path later is a new database, opened afresh.
  fs::remove_all(dir / "db");
  {
    std::unique_ptr<LmdbWriter> writer;
    ASSERT_TRUE(LmdbWriter::Create(dir / "db", &writer).ok());
    std::vector<uint8_t> px(3 * 16 * 16, 1);
    ASSERT_TRUE(writer->Put(RecordKey(0, "r"), MakeRawDatum(3, 16, 16, px.data(), 0)).ok());
    ASSERT_TRUE(writer->Finish().ok());
  }
  ASSERT_TRUE(LmdbEnv::OpenReadOnly(dir / "db", &a).ok());
  EXPECT_EQ(a->entries(), 1);
}

TEST(LmdbEnv, TwoLoadersOfOneDatabaseReadSideBySide) {
  TempDir dir;
  WriteDb(dir / "db");
  for (int round = 0; round < 200; ++round) {
    LoaderOptions o = EvalOptions(dir / "db", 50, 0);
    o.threads = 2;
    Loader first(o);
    ASSERT_TRUE(first.Open().ok()) << first.status().ToString();
    Loader second(o);  // opened while the first one's threads begin their read transactions
    ASSERT_TRUE(second.Open().ok()) << second.status().ToString();
    int images = 0;
    for (Loader* l : {&first, &second}) {
      while (const Batch* b = l->Next()) {
        images += b->n;
        l->Release(b);
      }
      ASSERT_TRUE(l->status().ok()) << l->status().ToString();
    }
    ASSERT_EQ(images, 600) << "round " << round;
  }
}

TEST(LmdbEnv, EmptyDataMdbSaysEmptyNotBadFileDescriptor) {
  TempDir dir;
  WriteDb(dir / "db");
  const std::string db = TruncatedCopy(dir / "db", dir / "empty", 0);
  std::unique_ptr<LmdbEnv> env;
  const Status s = LmdbEnv::OpenReadOnly(db, &env);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find("LMDB " + db + ": data.mdb is empty (0 bytes)"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("Bad file descriptor"), std::string::npos) << s.message();
  EXPECT_EQ(env, nullptr);
}

TEST(LmdbEnv, TruncatedDataMdbIsCorruptNamingBothSizes) {
  TempDir dir;
  WriteDb(dir / "db");
  const uintmax_t full = fs::file_size(dir / "db/data.mdb");
  ASSERT_GT(full, 16u * 4096) << "the test needs a database of many pages";
  struct Case {
    uintmax_t bytes;
    std::string want;
  };
  for (const Case& c : {Case{100, "data.mdb is 100 bytes but the database needs at least 8192"},
                        Case{4096, "data.mdb is 4096 bytes but the database needs at least 8192"},
                        Case{8192, "data.mdb is 8192 bytes but the database needs " + std::to_string(full)},
                        Case{full / 2, fmt::format("data.mdb is {} bytes but the database needs {}", full / 2, full)},
                        Case{full - 4096, fmt::format("data.mdb is {} bytes but the database "
                                                      "needs {}",
                                                      full - 4096, full)}}) {
    const std::string db = TruncatedCopy(dir / "db", dir / fmt::format("cut_{}", c.bytes), c.bytes);
    std::unique_ptr<LmdbEnv> env;
    const Status s = LmdbEnv::OpenReadOnly(db, &env);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << c.bytes << ": " << s.ToString();
    EXPECT_NE(s.message().find("LMDB " + db + ": "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("truncated copy?"), std::string::npos) << s.message();

    // The worker's way in: the loader's Open returns the same error (and does not crash).
    Loader loader(EvalOptions(db, 4, 0));
    const Status ls = loader.Open();
    EXPECT_EQ(ls.code(), StatusCode::kCorrupt) << ls.ToString();
    EXPECT_EQ(ls.message(), s.message());
  }
}

TEST(LmdbEnv, DataMdbThatIsNotLmdbSaysSo) {
  TempDir dir;
  fs::create_directories(dir / "junk");
  std::ofstream(dir / "junk/data.mdb", std::ios::binary) << std::string(20000, 'x');
  std::unique_ptr<LmdbEnv> env;
  const Status s = LmdbEnv::OpenReadOnly(dir / "junk", &env);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find("LMDB " + (dir / "junk") +
                             ": data.mdb (20000 bytes) does not "
                             "start with an LMDB meta page"),
            std::string::npos)
      << s.message();
  // The data file itself given instead of its directory.
  WriteDb(dir / "db");
  const Status f = LmdbEnv::OpenReadOnly(dir / "db/data.mdb", &env);
  EXPECT_EQ(f.code(), StatusCode::kNotFound);
  EXPECT_NE(f.message().find("the one holding data.mdb"), std::string::npos) << f.message();
}

TEST(LmdbWriter, KeyLongerThanLmdbAllowsIsRefusedNamingItsSize) {
  TempDir dir;
  std::unique_ptr<LmdbWriter> writer;
  ASSERT_TRUE(LmdbWriter::Create(dir / "db", &writer).ok());
  const std::string ok_key(kMaxKeyBytes, 'k');
  EXPECT_TRUE(writer->Put(ok_key, "v").ok());
  const Status s = writer->Put(std::string(kMaxKeyBytes + 1, 'k'), "v");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is 512 bytes; LMDB keys are 1..511 bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(writer->Finish().ok());
}

}  // namespace
}  // namespace downpour::data
