// Tests for common/tensor_file.h: round trip, CRC-32 against the standard check value, files that
// end at or near a read-buffer boundary, every kind of corruption named in the error, and atomic
// writes that leave the old file intact.
#include "common/tensor_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "common/env.h"
#include "common/file_io.h"
#include "tests/testing/fault_env.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TensorFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("downpour_tensor_file_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static TensorFile Sample(float offset = 0.0f) {
    TensorFile f;
    f.meta["model"] = "fmnist_small";
    f.meta["updates"] = "1234";
    f.meta["empty"] = "";
    f.tensors.push_back({"conv1.weight", {2, 1, 3, 3}, std::vector<float>(18)});
    for (size_t i = 0; i < 18; ++i) f.tensors[0].data[i] = offset + 0.5f * float(i) - 3.0f;
    f.tensors.push_back({"conv1.bias", {2}, {offset + 1.0f, -1.0f}});
    f.tensors.push_back({"scalar", {}, {offset + 42.0f}});
    f.tensors.push_back({"empty", {0, 5}, {}});
    return f;
  }

  std::vector<char> Bytes(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  void PutBytes(const std::string& path, const std::vector<char>& b) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  }
  int CountEntries() const {
    return static_cast<int>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }

  fs::path dir_;
};

TEST(Crc32Test, StandardCheckValueAndIncremental) {
  const std::string s = "123456789";
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  EXPECT_EQ(Crc32({p, s.size()}), 0xCBF43926u);
  EXPECT_EQ(Crc32({p + 4, 5}, Crc32({p, 4})), 0xCBF43926u);
  EXPECT_EQ(Crc32({}), 0u);
  // An empty piece in the middle of a chain, null data as an empty vector has, changes nothing
  // (libdeflate alone would answer 0 and restart the chain).
  const std::vector<uint8_t> empty;
  EXPECT_EQ(Crc32({p + 4, 5}, Crc32({empty.data(), empty.size()}, Crc32({p, 4}))), 0xCBF43926u);
  EXPECT_EQ(Crc32({static_cast<const uint8_t*>(nullptr), 0}, 0x12345678u), 0x12345678u);
  // The folded path agrees with the bytewise one at every alignment and length.
  std::vector<uint8_t> buf(300);
  std::mt19937 rng(1);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{250}}) {
      uint32_t bytewise = 0;
      for (size_t i = 0; i < len; ++i) bytewise = Crc32({&buf[start + i], 1}, bytewise);
      EXPECT_EQ(Crc32({&buf[start], len}), bytewise) << start << "+" << len;
    }
  }
}

TEST_F(TensorFileTest, RoundTrip) {
  const TensorFile f = Sample();
  ASSERT_TRUE(WriteTensorFile(Path("a.dpt"), f).ok());
  TensorFile back;
  Status s = ReadTensorFile(Path("a.dpt"), &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(back, f);
  ASSERT_NE(FindTensor(back, "conv1.bias"), nullptr);
  EXPECT_EQ(FindTensor(back, "conv1.bias")->data, (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ(FindTensor(back, "nope"), nullptr);
  EXPECT_EQ(CountEntries(), 1) << "temporary file left behind";
}

TEST_F(TensorFileTest, LargeTensorCrossesIoBuffers) {
  TensorFile f;
  f.tensors.push_back({"big", {3, 500001}, std::vector<float>(1500003)});
  for (size_t i = 0; i < f.tensors[0].data.size(); ++i) f.tensors[0].data[i] = float(i % 9973);
  ASSERT_TRUE(WriteTensorFile(Path("big.dpt"), f).ok());
  TensorFile back;
  ASSERT_TRUE(ReadTensorFile(Path("big.dpt"), &back).ok());
  EXPECT_EQ(back, f);
}

// A read that straddles the end of the 1 MiB read buffer near the end of the file: the reader
// must ask the file for what is left of it, not for what is left after the bytes already
// consumed (it used to, and files like a Fashion-MNIST shard checkpoint — several tensors with
// the last buffer refill short — were refused as "truncated (file shrank)").
TEST_F(TensorFileTest, ManySmallAndLargeTensorsWithAShortLastBuffer) {
  for (const size_t tail : {size_t{1}, size_t{37}, size_t{4096}, size_t{300000}}) {
    TensorFile f;
    f.meta["kind"] = "shard_checkpoint";
    // Tensors that do not line up with the buffer: 1 MiB - 20 bytes, then small ones, then
    // `tail` floats, so the last refill is short and a tensor's bytes span two refills.
    f.tensors.push_back({"chunk0.weights", {262139}, std::vector<float>(262139, 0.5f)});
    for (int i = 0; i < 5; ++i) f.tensors.push_back({fmt::format("small{}", i), {3}, {1.0f, 2.0f, float(i)}});
    f.tensors.push_back({"chunk0.history", {262139}, std::vector<float>(262139, -0.25f)});
    f.tensors.push_back({"tail", {static_cast<int64_t>(tail)}, std::vector<float>(tail, 7.0f)});
    ASSERT_TRUE(WriteTensorFile(Path("c.dpt"), f).ok());
    TensorFile back;
    const Status s = ReadTensorFile(Path("c.dpt"), &back);
    ASSERT_TRUE(s.ok()) << "tail " << tail << ": " << s.ToString();
    EXPECT_EQ(back, f) << "tail " << tail;
  }
}

// Bytes `file` takes on disk, from the layout documented in tensor_file.h.
uint64_t FileBytes(const TensorFile& file) {
  uint64_t n = 16 + 4;
  for (const auto& [k, v] : file.meta) n += 4 + k.size() + 4 + v.size();
  for (const NamedTensor& t : file.tensors) n += 4 + t.name.size() + 4 + 8 * t.shape.size() + 8 + 4 * t.data.size() + 4;
  return n;
}

// Files whose last tensor ends exactly at a read-buffer boundary (the reader refills 1 MiB at a
// time, kIoBuffer in tensor_file.cc) or 1 or 4 bytes either side of it — at the first and the
// second refill, after nothing but a header, after small tensors, and after a tensor larger than
// the buffer (read straight into its destination) — each read back equal.
TEST_F(TensorFileTest, LastTensorEndingAtOrNearTheReadBufferBoundaryReadsBackEqual) {
  constexpr uint64_t kIoBuffer = uint64_t{1} << 20;
  std::vector<TensorFile> prefixes(3);
  prefixes[1].meta["kind"] = "downpour-shard";
  for (int i = 0; i < 5; ++i) prefixes[1].tensors.push_back({fmt::format("small{}", i), {3}, {1.0f, 2.0f, float(i)}});
  prefixes[2].tensors.push_back({"big", {300001}, std::vector<float>(300001, -1.5f)});
  int files = 0;
  for (const uint64_t boundary : {kIoBuffer, 2 * kIoBuffer}) {
    for (const int64_t delta : {-4, -1, 0, 1, 4}) {
      for (size_t p = 0; p < prefixes.size(); ++p) {
        const uint64_t target = boundary + static_cast<uint64_t>(delta);
        TensorFile f = prefixes[p];
        const uint64_t before = FileBytes(f);
        if (before + 40 > target) continue;
        // The last record is 4 + name + 4 + 8 (one dim) + 8 + 4 n + 4 bytes: a name of 1..4 bytes
        // makes the rest a whole number of floats.
        const uint64_t rest = target - before - 28;
        const size_t name_len = 1 + static_cast<size_t>((rest - 1) % 4);
        const uint64_t n = (rest - name_len) / 4;
        NamedTensor last{std::string(name_len, 'z'), {static_cast<int64_t>(n)}, std::vector<float>(n)};
        for (uint64_t i = 0; i < n; ++i) last.data[i] = float(i % 65521) * 0.5f;
        f.tensors.push_back(std::move(last));
        SCOPED_TRACE(fmt::format("prefix {}, file of boundary {:+} bytes", p, delta));
        const std::string path = Path(fmt::format("b{}_{}_{}.dpt", boundary, delta, p));
        ASSERT_TRUE(WriteTensorFile(path, f).ok());
        ASSERT_EQ(fs::file_size(path), target) << "the test's size arithmetic is off";
        TensorFile back;
        const Status s = ReadTensorFile(path, &back);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(back, f);
        fs::remove(path);
        ++files;
      }
    }
  }
  EXPECT_EQ(files, 25);  // the 1.2 MB prefix fits only under the second boundary
}

TEST_F(TensorFileTest, LayoutIsTheDocumentedOne) {
  TensorFile f;
  f.tensors.push_back({"x", {2}, {1.0f, 2.0f}});
  ASSERT_TRUE(WriteTensorFile(Path("x.dpt"), f).ok());
  const std::vector<char> b = Bytes(Path("x.dpt"));
  // 16 header + 4 header_crc + (4 + 1 name + 4 ndim + 8 dim + 8 numel + 8 data + 4 crc).
  ASSERT_EQ(b.size(), 16u + 4u + 37u);
  EXPECT_EQ(std::string(b.data(), 4), "DPTF");
  uint32_t version;
  std::memcpy(&version, b.data() + 4, 4);
  EXPECT_EQ(version, kTensorFileVersion);
  uint32_t header_crc;
  std::memcpy(&header_crc, b.data() + 16, 4);
  EXPECT_EQ(header_crc, Crc32({reinterpret_cast<const uint8_t*>(b.data()), 16}));
  uint32_t tensor_crc;
  std::memcpy(&tensor_crc, b.data() + 20 + 33, 4);
  EXPECT_EQ(tensor_crc, Crc32({reinterpret_cast<const uint8_t*>(b.data()) + 20, 33}));
  float second;
  std::memcpy(&second, b.data() + 20 + 29, 4);
  EXPECT_EQ(second, 2.0f);
}

// An empty tensor's record (no floats) is covered by its CRC like any other: a flipped byte of
// its name is refused. (With a CRC chain that restarted at the empty data, the record's CRC was
// 0 whatever its name and shape, and a damaged one read back as another tensor.)
TEST_F(TensorFileTest, AnEmptyTensorsNameAndShapeAreCoveredByItsCrc) {
  ASSERT_TRUE(WriteTensorFile(Path("e.dpt"), Sample()).ok());
  std::vector<char> b = Bytes(Path("e.dpt"));
  // The file ends with "empty": 4 + 5 name + 4 ndim + 16 dims + 8 numel + 4 crc = 41 bytes.
  uint32_t crc;
  std::memcpy(&crc, b.data() + b.size() - 4, 4);
  EXPECT_NE(crc, 0u);
  const size_t name = b.size() - 41 + 4;
  ASSERT_EQ(std::string(b.data() + name, 5), "empty");
  b[name + 4] = 'z';
  PutBytes(Path("e.dpt"), b);
  TensorFile back;
  const Status s = ReadTensorFile(Path("e.dpt"), &back);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("crc")) << s.message();
}

TEST_F(TensorFileTest, CorruptDataNamesTheTensor) {
  ASSERT_TRUE(WriteTensorFile(Path("c.dpt"), Sample()).ok());
  std::vector<char> b = Bytes(Path("c.dpt"));
  // The file ends with the records of "scalar" (..., value f32, crc u32) and "empty"
  // (4 + 5 name + 4 ndim + 16 dims + 8 numel + 4 crc = 41 bytes): flip a bit of the scalar.
  const size_t scalar_value = b.size() - 41 - 4 - 4;
  b[scalar_value] ^= 0x01;
  PutBytes(Path("c.dpt"), b);
  TensorFile back;
  Status s = ReadTensorFile(Path("c.dpt"), &back);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr(Path("c.dpt")));
  EXPECT_THAT(s.message(), HasSubstr("crc mismatch in tensor \"scalar\""));
}

TEST_F(TensorFileTest, CorruptMetaIsCaughtByHeaderCrc) {
  ASSERT_TRUE(WriteTensorFile(Path("m.dpt"), Sample()).ok());
  std::vector<char> b = Bytes(Path("m.dpt"));
  b[16 + 4 + 2] ^= 0x20;  // a character of the first meta key
  PutBytes(Path("m.dpt"), b);
  TensorFile back;
  EXPECT_THAT(ReadTensorFile(Path("m.dpt"), &back).message(),
              HasSubstr("crc mismatch in header/meta"));
}

TEST_F(TensorFileTest, BadMagicAndVersion) {
  ASSERT_TRUE(WriteTensorFile(Path("v.dpt"), Sample()).ok());
  std::vector<char> b = Bytes(Path("v.dpt"));
  std::vector<char> bad_magic = b;
  bad_magic[0] = 'X';
  PutBytes(Path("magic.dpt"), bad_magic);
  TensorFile back;
  Status s = ReadTensorFile(Path("magic.dpt"), &back);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr(Path("magic.dpt") + ": bad magic"));
  b[4] = 9;
  PutBytes(Path("v.dpt"), b);
  s = ReadTensorFile(Path("v.dpt"), &back);
  EXPECT_THAT(s.message(), HasSubstr(Path("v.dpt") + ": bad version 9 (this build reads version 1)"));
}

TEST_F(TensorFileTest, EveryTruncationIsReported) {
  ASSERT_TRUE(WriteTensorFile(Path("t.dpt"), Sample()).ok());
  const std::vector<char> b = Bytes(Path("t.dpt"));
  for (size_t len = 0; len < b.size(); ++len) {
    PutBytes(Path("t.dpt"), std::vector<char>(b.begin(), b.begin() + static_cast<long>(len)));
    TensorFile back;
    Status s = ReadTensorFile(Path("t.dpt"), &back);
    ASSERT_EQ(s.code(), StatusCode::kCorrupt) << "length " << len << ": " << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("truncated")) << "length " << len;
  }
  std::vector<char> longer = b;
  longer.push_back(0);
  PutBytes(Path("t.dpt"), longer);
  TensorFile back;
  EXPECT_THAT(ReadTensorFile(Path("t.dpt"), &back).message(),
              HasSubstr("1 unexpected bytes after the last tensor"));
}

TEST_F(TensorFileTest, MissingFileIsNotFound) {
  TensorFile back;
  Status s = ReadTensorFile(Path("none.dpt"), &back);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(Path("none.dpt")));
}

TEST_F(TensorFileTest, InvalidTensorsAreRejectedBeforeTouchingDisk) {
  TensorFile f;
  f.tensors.push_back({"w", {2, 3}, std::vector<float>(5)});
  Status s = WriteTensorFile(Path("bad.dpt"), f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"w\" has shape [2, 3] but 5 values"));
  f.tensors[0].data.resize(6);
  f.tensors.push_back(f.tensors[0]);
  EXPECT_THAT(WriteTensorFile(Path("bad.dpt"), f).message(), HasSubstr("duplicate tensor name \"w\""));
  EXPECT_EQ(CountEntries(), 0);
}

TEST_F(TensorFileTest, WriteIntoMissingDirectoryFails) {
  Status s = WriteTensorFile(Path("no/such/dir/x.dpt"), Sample());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir/x.dpt"));
}

// Every way the write of a file can fail after its temporary exists — the disk filling
// half-way, the fsync, the rename — leaves the previous file loadable, the failure named with
// the file's path, and no temporary behind; the same for tensor files (streamed) and for
// WriteFileAtomic (the .addr files, the workers' progress, the mean files). The failures come
// from a FaultEnv (tests/testing/fault_env.h), in this process.
TEST_F(TensorFileTest, AFailedWriteFsyncOrRenameLeavesTheOldFileAndNoTemporary) {
  const std::string path = Path("ckpt.dpt");
  const TensorFile old_file = Sample(0.0f);
  ASSERT_TRUE(WriteTensorFile(path, old_file).ok());
  TensorFile big = Sample(1.0f);
  big.tensors.push_back({"fc6.weight", {1 << 18}, std::vector<float>(1 << 18, 0.25f)});  // 1 MiB

  struct Case {
    const char* what;
    std::function<void(test::FaultEnv&)> fault;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"disk full after 64 KiB", [](test::FaultEnv& e) { e.FillDiskAfter(64 * 1024); }, "write failed"},
      {"fsync EIO", [](test::FaultEnv& e) { e.FailFsync(EIO); }, "fsync failed"},
      {"rename EXDEV", [](test::FaultEnv& e) { e.FailRename(EXDEV); }, "rename from"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    test::FaultEnv env;
    c.fault(env);
    Status s;
    {
      ScopedEnv scoped(&env);
      s = WriteTensorFile(path, big);
    }
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_THAT(s.message(), HasSubstr(path));
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    TensorFile back;
    ASSERT_TRUE(ReadTensorFile(path, &back).ok());
    EXPECT_EQ(back, old_file);
    EXPECT_EQ(CountEntries(), 1) << "temporary file left behind";

    const std::string text_path = Path("server-0.addr");
    ASSERT_TRUE(WriteFileAtomic(text_path, "tcp://127.0.0.1:5601\n").ok());
    {
      ScopedEnv scoped(&env);
      s = WriteFileAtomic(text_path, std::string(256 * 1024, 'x'));
    }
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_THAT(s.message(), HasSubstr(text_path));
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    std::string text;
    ASSERT_TRUE(ReadWholeFile(text_path, "addr", &text).ok());
    EXPECT_EQ(text, "tcp://127.0.0.1:5601\n");
    EXPECT_EQ(CountEntries(), 2) << "temporary file left behind";
    fs::remove(text_path);
  }
  // The same writes, nothing failing, go through.
  ASSERT_TRUE(WriteTensorFile(path, big).ok());
  TensorFile back;
  ASSERT_TRUE(ReadTensorFile(path, &back).ok());
  EXPECT_EQ(back, big);
}

// Something that is not a regular file at the path (a directory, a FIFO) is refused before any
// temporary exists, and stays what it was: renaming over /dev/null as root once replaced the
// machine's device with a regular file (downpour-worker --write-tensors /dev/null, 2026-11-28).
TEST_F(TensorFileTest, ANonRegularFileAtThePathIsRefusedAndLeftAlone) {
  fs::create_directories(dir_ / "occupied" / "child");
  Status s = WriteTensorFile(Path("occupied"), Sample());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("occupied: is a directory"));
  EXPECT_EQ(CountEntries(), 1);
  EXPECT_TRUE(fs::is_directory(dir_ / "occupied" / "child"));

  const std::string fifo = Path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  s = WriteTensorFile(fifo, Sample());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is a FIFO"));
  s = WriteFileAtomic(fifo, "bytes");
  EXPECT_THAT(s.message(), HasSubstr("is a FIFO"));
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(CountEntries(), 2) << "a temporary left behind";

  // The device itself is only checked, never written to here.
  s = CheckReplaceable("/dev/null");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("/dev/null: is a character device"));
  EXPECT_TRUE(CheckReplaceable(Path("new-file")).ok());
}

TEST_F(TensorFileTest, OverwriteReplacesAtomically) {
  const std::string path = Path("w.dpt");
  ASSERT_TRUE(WriteTensorFile(path, Sample(0.0f)).ok());
  ASSERT_TRUE(WriteTensorFile(path, Sample(5.0f)).ok());
  TensorFile back;
  ASSERT_TRUE(ReadTensorFile(path, &back).ok());
  EXPECT_EQ(back, Sample(5.0f));
  EXPECT_EQ(CountEntries(), 1);
}

}  // namespace
}  // namespace downpour
