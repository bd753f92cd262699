// lmdb_io.cc — LMDB environment, per-thread read transactions, batched writer.
#include "data/lmdb_io.h"

#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace downpour::data {
namespace {

constexpr size_t kMapSize = size_t{1} << 40;  // 1 TiB of address space (sparse)

Status LmdbError(int rc, const std::string& path, const char* what) {
  return IoError("LMDB {}: {} failed: {}", path, what, mdb_strerror(rc));
}

// Where LMDB 0.9 (liblmdb, 64-bit builds) keeps what we need in its first meta page
// (mdb.c: a 16-byte MDB_page header, then MDB_meta {u32 mm_magic, u32 mm_version,
// void* mm_address, size_t mm_mapsize, MDB_db mm_dbs[2], ...}; the page size is stored in
// mm_dbs[FREE_DBI].md_pad, the first field of mm_dbs).
constexpr size_t kMetaMagicOffset = 16;
constexpr size_t kMetaPageSizeOffset = 40;
constexpr uint32_t kLmdbMagic = 0xBEEFC0DE;

// Before mdb_env_open: a data.mdb must hold LMDB's two meta pages. mdb_env_open takes an
// empty file for a new environment and fails writing it ("Bad file descriptor" on a
// read-only open) and a short one for "not an LMDB file"; both deserve a plainer word.
Status CheckMetaPages(const std::string& path, const std::string& file, uint64_t size) {
  if (size == 0) {
    return Corrupt(
        "LMDB {}: data.mdb is empty (0 bytes); the dataset is incomplete: "
        "convert it again",
        path);
  }
  unsigned char head[kMetaPageSizeOffset + 4] = {};
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(head), sizeof(head));
  uint32_t magic = 0, psize = 0;
  if (in.gcount() == static_cast<std::streamsize>(sizeof(head))) {
    std::memcpy(&magic, head + kMetaMagicOffset, 4);
    std::memcpy(&psize, head + kMetaPageSizeOffset, 4);
  }
  if (magic != kLmdbMagic) {
    return Corrupt(
        "LMDB {}: data.mdb ({} bytes) does not start with an LMDB meta page "
        "(magic 0x{:08x}, expected 0x{:08x}); not an LMDB data file",
        path, size, magic, kLmdbMagic);
  }
  if (size < 2 * uint64_t{psize}) {
    return Corrupt(
        "LMDB {}: data.mdb is {} bytes but the database needs at least {} (its two "
        "{}-byte meta pages); truncated copy? Copy or convert it again",
        path, size, 2 * uint64_t{psize}, psize);
  }
  return Status::Ok();
}

// After mdb_env_open, before any page but the meta pages is touched: pages past the end of
// the file are mapped but not backed, and reading one kills the process with SIGBUS.
Status CheckFileHoldsEveryPage(MDB_env* env, const std::string& path, uint64_t size) {
  MDB_envinfo info;
  MDB_stat stat;
  int rc = mdb_env_info(env, &info);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_info");
  rc = mdb_env_stat(env, &stat);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_stat");
  const uint64_t needed = (uint64_t{info.me_last_pgno} + 1) * stat.ms_psize;
  if (size < needed) {
    return Corrupt(
        "LMDB {}: data.mdb is {} bytes but the database needs {} ({} pages of {} "
        "bytes); truncated copy? Copy or convert it again",
        path, size, needed, uint64_t{info.me_last_pgno} + 1, stat.ms_psize);
  }
  return Status::Ok();
}

}  // namespace

// The file an MDB_env maps: data.mdb's device and inode (two paths to one database are one).
using FileId = std::pair<uint64_t, uint64_t>;

struct SharedMdbEnv {
  FileId file;
  MDB_env* env = nullptr;
  MDB_dbi dbi = 0;
};

namespace {

// The process's open read-only environments (lmdb_io.h: one MDB_env per database file). A
// process-wide table on purpose, the one exception to "no mutable globals": the rule it keeps is
// LMDB's, and it is the process's. An entry stays from the environment's open until its close;
// an open that finds an entry whose last user is closing it waits for the close, so the file is
// never open twice, not even for a moment (closing drops every lock the process holds on it).
struct OpenEnvs {
  std::mutex mu;
  std::condition_variable closed;
  std::map<FileId, std::weak_ptr<SharedMdbEnv>> by_file;
};

OpenEnvs& Envs() {
  static OpenEnvs* envs = new OpenEnvs;  // never destroyed: an LmdbEnv may outlive static destruction
  return *envs;
}

// Closes the environment under the table's mutex, so no open of the same file runs meanwhile.
void CloseShared(SharedMdbEnv* s) {
  OpenEnvs& envs = Envs();
  {
    std::lock_guard<std::mutex> lock(envs.mu);
    if (s->env != nullptr) mdb_env_close(s->env);
    envs.by_file.erase(s->file);
  }
  envs.closed.notify_all();
  delete s;
}

// Opens `path` (data.mdb's directory) read-only. Caller holds the table's mutex.
Status OpenShared(const std::string& path, uint64_t size, FileId file, std::shared_ptr<SharedMdbEnv>* out) {
  auto* raw = new SharedMdbEnv;
  raw->file = file;
  int rc = mdb_env_create(&raw->env);
  if (rc != 0) {
    delete raw;
    return LmdbError(rc, path, "mdb_env_create");
  }
  mdb_env_set_maxreaders(raw->env, 1024);
  // MDB_NOTLS: read transactions are tied to our ReadTxn objects, not to OS threads.
  rc = mdb_env_open(raw->env, path.c_str(), MDB_RDONLY | MDB_NOTLS, 0664);
  if (rc == EACCES || rc == EROFS) {
    // A dataset on a read-only mount cannot take the lock file; readers need no lock as long
    // as nobody writes the dataset while it is read (datasets are immutable once converted).
    mdb_env_close(raw->env);
    mdb_env_create(&raw->env);
    rc = mdb_env_open(raw->env, path.c_str(), MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK, 0664);
  }
  Status s = rc != 0 ? LmdbError(rc, path, "mdb_env_open") : CheckFileHoldsEveryPage(raw->env, path, size);
  MDB_txn* txn = nullptr;
  if (s.ok()) {
    rc = mdb_txn_begin(raw->env, nullptr, MDB_RDONLY, &txn);
    if (rc != 0) s = LmdbError(rc, path, "mdb_txn_begin");
  }
  if (s.ok()) {
    rc = mdb_dbi_open(txn, nullptr, 0, &raw->dbi);
    mdb_txn_abort(txn);
    if (rc != 0) s = LmdbError(rc, path, "mdb_dbi_open");
  }
  if (!s.ok()) {
    mdb_env_close(raw->env);
    delete raw;
    return s;
  }
  // Registered before the caller lets go of the mutex; removed again by CloseShared.
  *out = std::shared_ptr<SharedMdbEnv>(raw, CloseShared);
  return Status::Ok();
}

}  // namespace

Status LmdbEnv::OpenReadOnly(const std::string& path, std::unique_ptr<LmdbEnv>* out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("LMDB {}: no such directory", path);
  if (!fs::is_directory(path, ec)) {
    return NotFound(
        "LMDB {}: not a directory (give the LMDB directory, the one holding "
        "data.mdb)",
        path);
  }
  const std::string data_file = (fs::path(path) / "data.mdb").string();
  struct stat st {};
  if (::stat(data_file.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      // The parent of a sharded dataset (downpour-data convert-* --shards W): name its shards.
      std::vector<std::string> shards;
      for (const auto& e : fs::directory_iterator(path, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("shard_", 0) == 0 && fs::exists(e.path() / "data.mdb", ec)) shards.push_back(name);
      }
      std::sort(shards.begin(), shards.end());
      if (!shards.empty()) {
        return NotFound("LMDB {}: a dataset of {} shards ({}), not one LMDB: give one shard, e.g. {}/{}", path,
                        shards.size(), fmt::format("{}", fmt::join(shards, ", ")), path, shards.front());
      }
      return NotFound("LMDB {}: not an LMDB (no data.mdb in the directory)", path);
    }
    return IoError("LMDB {}: cannot stat data.mdb: {}", path, std::strerror(errno));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  DP_RETURN_IF_ERROR(CheckMetaPages(path, data_file, size));
  const FileId file{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  std::unique_ptr<LmdbEnv> env(new LmdbEnv());
  env->path_ = path;
  {
    OpenEnvs& envs = Envs();
    std::unique_lock<std::mutex> lock(envs.mu);
    while (true) {
      auto it = envs.by_file.find(file);
      if (it == envs.by_file.end()) {
        DP_RETURN_IF_ERROR(OpenShared(path, size, file, &env->shared_));
        envs.by_file[file] = env->shared_;
        break;
      }
      env->shared_ = it->second.lock();
      if (env->shared_ != nullptr) break;
      envs.closed.wait(lock);  // its last user is closing it
    }
  }
  // The entry count of this open (another process may have added records since the first).
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env->env(), nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, path, "mdb_txn_begin");
  MDB_stat stat;
  rc = mdb_stat(txn, env->dbi(), &stat);
  mdb_txn_abort(txn);
  if (rc != 0) return LmdbError(rc, path, "mdb_stat");
  env->entries_ = static_cast<int64_t>(stat.ms_entries);
  *out = std::move(env);
  return Status::Ok();
}

LmdbEnv::~LmdbEnv() = default;

MDB_env* LmdbEnv::env() const { return shared_->env; }
MDB_dbi LmdbEnv::dbi() const { return shared_->dbi; }

Status ReadTxn::Begin(const LmdbEnv* env, std::unique_ptr<ReadTxn>* out) {
  std::unique_ptr<ReadTxn> t(new ReadTxn());
  t->env_ = env;
  int rc = mdb_txn_begin(env->env(), nullptr, MDB_RDONLY, &t->txn_);
  if (rc != 0) return LmdbError(rc, env->path(), "mdb_txn_begin");
  rc = mdb_cursor_open(t->txn_, env->dbi(), &t->cursor_);
  if (rc != 0) return LmdbError(rc, env->path(), "mdb_cursor_open");
  *out = std::move(t);
  return Status::Ok();
}

ReadTxn::~ReadTxn() {
  if (cursor_ != nullptr) mdb_cursor_close(cursor_);
  if (txn_ != nullptr) mdb_txn_abort(txn_);
}

Status ReadTxn::Move(MDB_cursor_op op, bool* found) {
  MDB_val k, v;
  const int rc = mdb_cursor_get(cursor_, &k, &v, op);
  if (rc == MDB_NOTFOUND) {
    *found = false;
    return Status::Ok();
  }
  if (rc != 0) return LmdbError(rc, env_->path(), "mdb_cursor_get");
  *found = true;
  key_ = std::string_view(static_cast<const char*>(k.mv_data), k.mv_size);
  value_ = std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
  return Status::Ok();
}

Status ReadTxn::First(bool* found) { return Move(MDB_FIRST, found); }
Status ReadTxn::Next(bool* found) { return Move(MDB_NEXT, found); }

Status ReadTxn::Seek(std::string_view key) {
  MDB_val k{key.size(), const_cast<char*>(key.data())}, v;
  const int rc = mdb_cursor_get(cursor_, &k, &v, MDB_SET_KEY);
  if (rc == MDB_NOTFOUND) return NotFound("LMDB {}: key '{}' not found", env_->path(), key);
  if (rc != 0) return LmdbError(rc, env_->path(), "mdb_cursor_get(MDB_SET_KEY)");
  key_ = std::string_view(static_cast<const char*>(k.mv_data), k.mv_size);
  value_ = std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
  return Status::Ok();
}

Status ReadTxn::Get(std::string_view key, std::string_view* value) const {
  MDB_val k{key.size(), const_cast<char*>(key.data())}, v;
  const int rc = mdb_get(txn_, env_->dbi(), &k, &v);
  if (rc == MDB_NOTFOUND) return NotFound("LMDB {}: key '{}' not found", env_->path(), key);
  if (rc != 0) return LmdbError(rc, env_->path(), "mdb_get");
  *value = std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
  return Status::Ok();
}

Status LmdbWriter::Create(const std::string& path, std::unique_ptr<LmdbWriter>* out,
                          int commit_every) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_empty(path, ec)) {
    return FailedPrecondition("LMDB {}: output exists and is not empty; remove it first", path);
  }
  fs::create_directories(path, ec);
  if (ec) return IoError("LMDB {}: cannot create directory: {}", path, ec.message());
  std::unique_ptr<LmdbWriter> w(new LmdbWriter());
  w->path_ = path;
  w->commit_every_ = commit_every;
  int rc = mdb_env_create(&w->env_);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_create");
  rc = mdb_env_set_mapsize(w->env_, kMapSize);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_set_mapsize");
  rc = mdb_env_open(w->env_, path.c_str(), 0, 0664);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_open");
  DP_RETURN_IF_ERROR(w->BeginTxn());
  rc = mdb_dbi_open(w->txn_, nullptr, 0, &w->dbi_);
  if (rc != 0) return LmdbError(rc, path, "mdb_dbi_open");
  *out = std::move(w);
  return Status::Ok();
}

LmdbWriter::~LmdbWriter() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
  if (env_ != nullptr) mdb_env_close(env_);
}

Status LmdbWriter::BeginTxn() {
  const int rc = mdb_txn_begin(env_, nullptr, 0, &txn_);
  if (rc != 0) return LmdbError(rc, path_, "mdb_txn_begin");
  return Status::Ok();
}

Status LmdbWriter::Put(std::string_view key, std::string_view value) {
  DP_CHECK(txn_ != nullptr);
  if (key.size() > kMaxKeyBytes || key.empty()) {
    return InvalidArgument("LMDB {}: key '{}' is {} bytes; LMDB keys are 1..{} bytes", path_, key, key.size(),
                           kMaxKeyBytes);
  }
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  int rc = mdb_put(txn_, dbi_, &k, &v, 0);
  if (rc != 0) return LmdbError(rc, path_, "mdb_put");
  ++written_;
  if (++pending_ >= commit_every_) {
    rc = mdb_txn_commit(txn_);
    txn_ = nullptr;
    if (rc != 0) return LmdbError(rc, path_, "mdb_txn_commit");
    pending_ = 0;
    DP_RETURN_IF_ERROR(BeginTxn());
  }
  return Status::Ok();
}

Status LmdbWriter::Finish() {
  if (txn_ != nullptr) {
    const int rc = mdb_txn_commit(txn_);
    txn_ = nullptr;
    if (rc != 0) return LmdbError(rc, path_, "mdb_txn_commit");
  }
  if (env_ != nullptr) {
    mdb_env_sync(env_, 1);
    mdb_env_close(env_);
    env_ = nullptr;
  }
  return Status::Ok();
}

std::string RecordKey(int64_t index, std::string_view name) {
  return fmt::format("{:08d}_{}", index, name);
}

}  // namespace downpour::data
