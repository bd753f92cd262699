// security.cc — see security.h. Key generation and Z85 checks use libzmq (built with
// libsodium); key files are TOML read with toml++.
#include "common/security.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/file_io.h"
#include "common/net_address.h"

namespace downpour {

namespace {

constexpr size_t kZ85KeyChars = 40;  // a 32-byte CurveZMQ key in Z85
constexpr KeyRole kClientRoles[] = {KeyRole::kAdmin, KeyRole::kServer, KeyRole::kWorker};
constexpr const char* kKeyNames[] = {"endpoint", "admin", "server", "worker"};

std::string Errno() { return std::strerror(errno); }

std::string KeyPath(const std::string& dir, const std::string& name, const char* ext) { return dir + "/" + name + ext; }

Status CheckCurveAvailable() {
  if (zmq_has("curve") == 0) {
    return FailedPrecondition(
        "this libzmq was built without CURVE (libsodium); CurveZMQ keys cannot be used: "
        "install a libzmq with CURVE or leave security.keys unset");
  }
  return Status::Ok();
}

Status WriteKeypair(const std::string& dir, const std::string& name) {
  char public_key[kZ85KeyChars + 1];
  char secret_key[kZ85KeyChars + 1];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return Internal("zmq_curve_keypair for {}: {}", KeyPath(dir, name, ".key"), zmq_strerror(zmq_errno()));
  }
  const std::string pub = fmt::format(
      "# CurveZMQ public key ({}): copy to every host of the cluster\n"
      "public = \"{}\"\n",
      name, public_key);
  const std::string key = fmt::format(
      "# CurveZMQ keypair ({}): secret, keep mode 0600\n"
      "public = \"{}\"\nsecret = \"{}\"\n",
      name, public_key, secret_key);
  // Exact modes (umask ignored): a .pub must be readable by every host's processes.
  DP_RETURN_IF_ERROR(WriteFileAtomic(KeyPath(dir, name, ".key"), key, Durability::kPowerLoss, 0600));
  return WriteFileAtomic(KeyPath(dir, name, ".pub"), pub, Durability::kPowerLoss, 0644);
}

// The hint every "file is missing" error ends with.
std::string MakeKeysHint(const std::string& dir) {
  return fmt::format(
      "make keys with `downpour-keys --out {}` and copy the directory (or the files "
      "`downpour-keys` lists for this host) to every host",
      dir);
}

// Refuses a secret key file that group or other may read or write, as ssh does.
Status CheckSecretFileMode(const std::string& path, const struct stat& st) {
  if ((st.st_mode & 077) != 0) {
    return FailedPrecondition(
        "permissions {:04o} for '{}' are too open: a secret key must be readable by its "
        "owner only: chmod 600 {}",
        st.st_mode & 07777, path, path);
  }
  return Status::Ok();
}

// Refuses a public key file that group or other may write: whoever can replace admin.pub can
// put their own key in every binder's allow-list.
Status CheckPublicFileMode(const std::string& path, const struct stat& st) {
  if ((st.st_mode & 022) != 0) {
    return FailedPrecondition(
        "permissions {:04o} for '{}' are too open: anyone who may write a public key may replace it "
        "with their own: chmod 644 {}",
        st.st_mode & 07777, path, path);
  }
  return Status::Ok();
}

// Reads field `field` ("public" | "secret") of the key file `path` as a checked Z85 key.
Status ReadKeyField(const toml::table& table, const std::string& path, const char* field, std::string* out) {
  const std::optional<std::string> value = table[field].value<std::string>();
  if (!value) return Corrupt("{}: no `{} = \"...\"` (a CurveZMQ key file made by downpour-keys)", path, field);
  uint8_t decoded[32];
  if (value->size() != kZ85KeyChars || zmq_z85_decode(decoded, value->c_str()) == nullptr) {
    return Corrupt("{}: {} is not a CurveZMQ key (40 Z85 characters), got {} characters", path, field, value->size());
  }
  *out = *value;
  return Status::Ok();
}

struct KeyFile {
  std::string public_key;
  std::string secret_key;  // only for *.key
};

// Loads `dir/name.ext` (ext ".pub" or ".key"); for ".key" also checks its permissions and that
// its public key belongs to its secret key.
Status LoadKeyFile(const std::string& dir, const std::string& name, const char* ext, KeyFile* out) {
  const std::string path = KeyPath(dir, name, ext);
  const bool secret = std::strcmp(ext, ".key") == 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return NotFound("security.keys = {}: {}: no such file; {}", dir, path, MakeKeysHint(dir));
    }
    return IoError("security.keys = {}: {}: {}", dir, path, Errno());
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument("security.keys = {}: {} is not a regular file", dir, path);
  if (secret) DP_RETURN_IF_ERROR(CheckSecretFileMode(path, st));
  if (!secret) DP_RETURN_IF_ERROR(CheckPublicFileMode(path, st));
  std::string text;
  DP_RETURN_IF_ERROR(ReadWholeFile(path, "key", &text));
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return Corrupt("{}: not a key file made by downpour-keys: {}", path, e.description());
  }
  if (!secret) return ReadKeyField(table, path, "public", &out->public_key);
  DP_RETURN_IF_ERROR(ReadKeyField(table, path, "secret", &out->secret_key));
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, out->secret_key.c_str()) != 0) {
    return Corrupt("{}: cannot derive the public key from secret: {}", path, zmq_strerror(zmq_errno()));
  }
  if (table.contains("public")) {
    DP_RETURN_IF_ERROR(ReadKeyField(table, path, "public", &out->public_key));
    if (out->public_key != derived) return Corrupt("{}: public does not belong to secret (a mixed-up key file)", path);
  }
  out->public_key = derived;
  return Status::Ok();
}

Status CheckKeyDirectory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("security.keys = {}: no such directory; {}", dir, MakeKeysHint(dir));
    return IoError("security.keys = {}: {}", dir, Errno());
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("security.keys = {}: not a directory", dir);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return FailedPrecondition(
        "security.keys = {}: the directory is writable by others (mode {:04o}), so they "
        "could replace its keys: chmod 700 {}",
        dir, st.st_mode & 07777, dir);
  }
  return Status::Ok();
}

}  // namespace

const char* KeyRoleName(KeyRole role) {
  switch (role) {
    case KeyRole::kAdmin:
      return "admin";
    case KeyRole::kServer:
      return "server";
    case KeyRole::kWorker:
      return "worker";
  }
  return "?";
}

Status MakeClusterKeys(const std::string& dir) {
  DP_RETURN_IF_ERROR(CheckCurveAvailable());
  // Parents as `mkdir -p` would make them; the key directory itself owner-only from the start.
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec) {
    return IoError("cannot create {} for key directory {}: {}", parent.string(), dir, ec.message());
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return IoError("cannot create key directory {}: {}", dir, Errno());
  }
  // Also for a directory that existed: it is about to hold secrets.
  if (::chmod(dir.c_str(), 0700) != 0) return IoError("cannot chmod 700 key directory {}: {}", dir, Errno());
  for (const char* name : kKeyNames) DP_RETURN_IF_ERROR(WriteKeypair(dir, name));
  return FsyncDirectory(dir, KeyPath(dir, "endpoint", ".key"));
}

Status LoadCurveKeys(const std::string& dir, KeyRole role, bool bind, CurveOptions* out) {
  DP_RETURN_IF_ERROR(CheckCurveAvailable());
  DP_RETURN_IF_ERROR(CheckKeyDirectory(dir));
  CurveOptions curve;
  curve.enabled = true;
  KeyFile endpoint, own;
  DP_RETURN_IF_ERROR(LoadKeyFile(dir, "endpoint", ".pub", &endpoint));
  DP_RETURN_IF_ERROR(LoadKeyFile(dir, KeyRoleName(role), ".key", &own));
  curve.server_public = endpoint.public_key;
  curve.client_public = own.public_key;
  curve.client_secret = own.secret_key;
  if (bind) {
    KeyFile endpoint_pair;
    DP_RETURN_IF_ERROR(LoadKeyFile(dir, "endpoint", ".key", &endpoint_pair));
    if (endpoint_pair.public_key != endpoint.public_key) {
      return Corrupt(
          "security.keys = {}: endpoint.pub does not belong to endpoint.key (files from two "
          "different `downpour-keys` runs?); copy the whole directory again",
          dir);
    }
    curve.server_secret = endpoint_pair.secret_key;
    for (KeyRole client : kClientRoles) {
      KeyFile pub;
      DP_RETURN_IF_ERROR(LoadKeyFile(dir, KeyRoleName(client), ".pub", &pub));
      curve.allowed[pub.public_key] = KeyRoleName(client);
    }
  }
  *out = std::move(curve);
  return Status::Ok();
}

Status CheckClusterKeys(const std::string& dir, std::vector<std::string>* report) {
  DP_RETURN_IF_ERROR(CheckCurveAvailable());
  DP_RETURN_IF_ERROR(CheckKeyDirectory(dir));
  Status first;
  int problems = 0;
  auto note = [&](const std::string& file, const Status& s) {
    report->push_back(s.ok() ? file + ": ok" : s.message());
    if (!s.ok() && problems++ == 0) first = s;
  };
  for (const char* name : kKeyNames) {
    KeyFile pub, key;
    const Status pub_status = LoadKeyFile(dir, name, ".pub", &pub);
    note(std::string(name) + ".pub", pub_status);
    const std::string key_file = std::string(name) + ".key";
    if (::access(KeyPath(dir, name, ".key").c_str(), F_OK) != 0 && errno == ENOENT) {
      report->push_back(key_file + ": absent (needed only on hosts that run its role)");
      continue;
    }
    Status key_status = LoadKeyFile(dir, name, ".key", &key);
    if (key_status.ok() && pub_status.ok() && key.public_key != pub.public_key) {
      key_status = Corrupt(
          "{}: does not belong to {}.pub (files from two `downpour-keys` runs?); copy "
          "both from the directory `downpour-keys` made",
          KeyPath(dir, name, ".key"), name);
    }
    note(key_file, key_status);
  }
  if (problems == 0) return Status::Ok();
  return Status(first.code(), fmt::format("{} problem(s) in {}; the first: {}", problems, dir, first.message()));
}

bool IsLoopbackHost(const std::string& host) { return StripBrackets(host) == "localhost" || IsLoopbackLiteral(host); }

Status CheckBindAllowed(const std::string& bind, const SecurityConfig& security, const std::string& where) {
  if (IsLoopbackHost(bind) || !security.keys.empty() || security.insecure) return Status::Ok();
  return InvalidArgument(
      "{} = {} is reachable from other hosts and security.keys is not set: make keys with "
      "`downpour-keys --out keys`, set [security] keys = \"keys\" (copy the directory to every "
      "host), or set security.insecure = true on a trusted network",
      where, bind);
}

}  // namespace downpour
