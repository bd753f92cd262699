// lmdb_io.cc — LMDB environment, per-thread read transactions, batched writer.
#include "data/lmdb_io.h"

#include <filesystem>

namespace downpour::data {
namespace {

constexpr size_t kMapSize = size_t{1} << 40;  // 1 TiB of address space (sparse)

Status LmdbError(int rc, const std::string& path, const char* what) {
  return IoError("LMDB {}: {} failed: {}", path, what, mdb_strerror(rc));
}

}  // namespace

Status LmdbEnv::OpenReadOnly(const std::string& path, std::unique_ptr<LmdbEnv>* out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("LMDB {}: no such directory", path);
  if (!fs::is_directory(path, ec)) return NotFound("LMDB {}: not a directory", path);
  if (!fs::exists(fs::path(path) / "data.mdb", ec)) {
    return NotFound("LMDB {}: not an LMDB (no data.mdb in the directory)", path);
  }
  std::unique_ptr<LmdbEnv> env(new LmdbEnv());
  env->path_ = path;
  int rc = mdb_env_create(&env->env_);
  if (rc != 0) return LmdbError(rc, path, "mdb_env_create");
  mdb_env_set_maxreaders(env->env_, 1024);
  // MDB_NOTLS: read transactions are tied to our ReadTxn objects, not to OS threads.
  rc = mdb_env_open(env->env_, path.c_str(), MDB_RDONLY | MDB_NOTLS, 0664);
  if (rc == EACCES || rc == EROFS) {
    // A dataset on a read-only mount cannot take the lock file; readers need no lock as long
    // as nobody writes the dataset while it is read (datasets are immutable once converted).
    mdb_env_close(env->env_);
    mdb_env_create(&env->env_);
    rc = mdb_env_open(env->env_, path.c_str(), MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK, 0664);
  }
  if (rc != 0) return LmdbError(rc, path, "mdb_env_open");
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env->env_, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, path, "mdb_txn_begin");
  rc = mdb_dbi_open(txn, nullptr, 0, &env->dbi_);
  if (rc != 0) {
    mdb_txn_abort(txn);
    return LmdbError(rc, path, "mdb_dbi_open");
  }
  MDB_stat stat;
  mdb_stat(txn, env->dbi_, &stat);
  env->entries_ = static_cast<int64_t>(stat.ms_entries);
  mdb_txn_abort(txn);
  *out = std::move(env);
  return Status::Ok();
}

LmdbEnv::~LmdbEnv() {
  if (env_ != nullptr) mdb_env_close(env_);
}

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
