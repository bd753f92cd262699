// lmdb_io.h — thin RAII wrappers over LMDB: a read-only environment shared by threads, a
// per-thread read transaction with a cursor, and a batching writer.
//
// LMDB's rule (STYLE.md §13): a read transaction belongs to one thread. LmdbEnv is opened
// with MDB_NOTLS so each thread can own its own ReadTxn; share the LmdbEnv by pointer and
// create one ReadTxn per thread. Values returned by ReadTxn point into the memory map and
// stay valid until that ReadTxn's next call or its destruction.
//
// LMDB's other rule: a database may not be opened twice in one process at the same time (its
// lock file's locks are per process, so a second MDB_env takes the file for unused and
// re-initialises the reader table under the first one's readers; closing either drops the
// other's locks). So every LmdbEnv of one data.mdb (by device and inode, whatever path names
// it) shares one MDB_env, opened by the first and closed with the last; two loaders of one
// LMDB, or a loader and an entry count, read side by side.
//
// Thread-safety: LmdbEnv is safe to share (const use), and OpenReadOnly and ~LmdbEnv may run on
// any threads (the process's table of open environments has its own mutex). ReadTxn and
// LmdbWriter are single-thread objects. Ownership: LmdbEnv shares the MDB_env; ReadTxn owns its
// txn + cursor and must not outlive its env; LmdbWriter owns its env and write transaction.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace downpour::data {

struct SharedMdbEnv;  // lmdb_io.cc: one open MDB_env of one database file

class LmdbEnv {
 public:
  // Opens an existing LMDB directory read-only. A missing path or a directory without
  // data.mdb is kNotFound naming the path. A data.mdb that is empty, is not an LMDB file or
  // is shorter than its meta pages say the database is (a truncated copy, which LMDB would
  // map and then die on with SIGBUS at the first read past the end) is kCorrupt naming the
  // path and both sizes.
  static Status OpenReadOnly(const std::string& path, std::unique_ptr<LmdbEnv>* out);
  ~LmdbEnv();
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;

  const std::string& path() const { return path_; }  // as given to OpenReadOnly
  int64_t entries() const { return entries_; }      // records in the main database, at the open
  MDB_env* env() const;                             // shared with every other open of the file
  MDB_dbi dbi() const;

 private:
  LmdbEnv() = default;
  std::string path_;
  std::shared_ptr<SharedMdbEnv> shared_;
  int64_t entries_ = 0;
};

// One thread's read transaction and cursor over an LmdbEnv.
class ReadTxn {
 public:
  static Status Begin(const LmdbEnv* env, std::unique_ptr<ReadTxn>* out);
  ~ReadTxn();
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;

  // Cursor walk in key order. *found is false past the end.
  Status First(bool* found);
  Status Next(bool* found);
  // Positions the cursor at `key` exactly (kNotFound if absent).
  Status Seek(std::string_view key);
  std::string_view key() const { return key_; }
  std::string_view value() const { return value_; }
  // Point lookup without moving the cursor.
  Status Get(std::string_view key, std::string_view* value) const;

 private:
  ReadTxn() = default;
  Status Move(MDB_cursor_op op, bool* found);
  const LmdbEnv* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_cursor* cursor_ = nullptr;
  std::string_view key_, value_;
};

// Writes key/value records, committing every `commit_every` puts (Caffe uses 1000).
class LmdbWriter {
 public:
  // Creates a new LMDB directory at `path`; an existing non-empty directory is refused
  // (kFailedPrecondition) so a converter never appends to or mixes with an old dataset.
  // The map size is 1 TiB of sparse address space, grown by nothing on disk.
  static Status Create(const std::string& path, std::unique_ptr<LmdbWriter>* out,
                       int commit_every = 1000);
  ~LmdbWriter();
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  Status Put(std::string_view key, std::string_view value);
  // Commits what is pending and closes the environment. Call once; the destructor aborts an
  // unfinished transaction (a half-written dataset then holds only committed records).
  Status Finish();
  int64_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  LmdbWriter() = default;
  Status BeginTxn();
  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  int commit_every_ = 1000;
  int pending_ = 0;
  int64_t written_ = 0;
};

// Caffe's key style: zero-padded index so insertion order is key order ("%08d_<name>").
std::string RecordKey(int64_t index, std::string_view name);

// The longest key LMDB accepts (liblmdb's compiled-in MDB_MAXKEYSIZE, 511 bytes).
inline constexpr size_t kMaxKeyBytes = 511;

}  // namespace downpour::data
