// security.h — the cluster's CurveZMQ key material and the rule that keeps an unkeyed job on
// loopback.
//
// A key directory (made by `downpour-keys --out DIR`, mode 0700) holds CurveZMQ keypairs as
// small TOML files, `public = "<Z85>"` in NAME.pub and `secret = "<Z85>"` (plus its public
// key) in NAME.key:
//   endpoint.key / .pub   the keypair of every BOUND socket (coordinator and servers);
//   admin.key    / .pub   the client keypair of the operator/launcher (may send admin messages);
//   server.key   / .pub   the client keypair of servers (may register as a server);
//   worker.key   / .pub   the client keypair of workers (may register as a worker, push, pull).
// A binder loads endpoint.key and the three client .pub files (its allow-list maps each client
// public key to its role name); a client loads endpoint.pub and its own role's .key. *.key
// files are mode 0600 and refused when group or other may read them (as ssh refuses an open
// private key); *.pub files and the directory are refused when group or other may write them
// (whoever can replace a .pub can put their own key in the allow-list).
//
// Thread-safety: free functions over files and values; no shared state.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/config/security.h"
#include "common/status.h"

namespace downpour {

// The three client identities of a cluster. The name is what the ZAP handler sets as the
// connection's User-Id, so it arrives as PeerInfo::user_id.
enum class KeyRole { kAdmin, kServer, kWorker };
const char* KeyRoleName(KeyRole role);  // "admin" | "server" | "worker"

// CurveZMQ settings of one ZmqTransport (common/zmq_transport.h). Keys are 40-character Z85.
struct CurveOptions {
  bool enabled = false;       // false = plaintext ZMTP (loopback default)
  std::string server_public;  // endpoint.pub: what clients expect of every bound socket
  std::string server_secret;  // endpoint.key: set only in processes that bind
  std::string client_public;  // <role>.key: what this process presents when it connects
  std::string client_secret;
  // The ZAP allow-list of bound sockets: client public key (Z85) -> role name. A client whose
  // key is absent is refused (and counted).
  std::map<std::string, std::string> allowed;
};

// Makes the key directory `dir` (created with mode 0700, parents as mkdir -p; existing key files are
// overwritten) with the four keypairs above. kFailedPrecondition when this libzmq lacks CURVE.
Status MakeClusterKeys(const std::string& dir);

// Loads what one process needs from the key directory `dir`: always endpoint.pub and
// `<role>.key` (the client side); with `bind` also endpoint.key and admin.pub, server.pub,
// worker.pub as the allow-list. Sets out->enabled. Errors name the file and say what to do
// (missing file, garbled key, *.key readable or *.pub / the directory writable by group/other).
Status LoadCurveKeys(const std::string& dir, KeyRole role, bool bind, CurveOptions* out);

// Checks every file of the key directory `dir` and appends one line per file to `report`
// ("worker.key: ok", "admin.key: absent (...)", or what is wrong and how to fix it). Every .pub
// must be there; a .key may be absent (a host holds only the secrets of the roles it runs), but
// one that is there must be mode 0600 and belong to its .pub. Returns the first problem, with
// the number of problems, or Ok.
Status CheckClusterKeys(const std::string& dir, std::vector<std::string>* report);

// True for "localhost", 127.0.0.0/8, "::1" and "[::1]" (the address stays on this host).
bool IsLoopbackHost(const std::string& host);

// A bind address reachable from other hosts ("0.0.0.0", "*", "::", a non-loopback address or
// name) needs security.keys, or security.insecure = true. `where` names the setting in the
// error ("cluster.bind", "--bind"). InvalidArgument saying how to make keys otherwise.
Status CheckBindAllowed(const std::string& bind, const SecurityConfig& security, const std::string& where);

}  // namespace downpour
