// access.cc — see access.h.
#include "server/access.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace downpour {

namespace fs = std::filesystem;

const char* PrivilegeName(Privilege p) {
  switch (p) {
    case Privilege::kAdmin:
      return "admin";
    case Privilege::kRegisterServer:
      return "register as a server";
    case Privilege::kRegisterWorker:
      return "register as a worker";
    case Privilege::kWorkerTraffic:
      return "worker traffic";
    case Privilege::kObserve:
      return "register as an observer";
    case Privilege::kEvaluate:
      return "register as the evaluator";
  }
  return "unknown";
}

namespace {

// The key role (common/security.h KeyRoleName) that grants `p` in a keyed run.
const char* KeyRoleFor(Privilege p) {
  switch (p) {
    case Privilege::kRegisterServer:
      return "server";
    case Privilege::kRegisterWorker:
    case Privilege::kWorkerTraffic:
    case Privilege::kEvaluate:
      return "worker";
    case Privilege::kAdmin:
    case Privilege::kObserve:
      return "admin";
  }
  return "admin";
}

// Worker traffic is bound to the connection that registered (which needed the token), so it
// carries no token of its own: the hot path stays free of secret comparisons.
bool NeedsToken(Privilege p) { return p != Privilege::kWorkerTraffic; }

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of `a` is looked at whatever the contents, and the lengths enter the result
  // without a branch, so the time depends on a.size() only.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = i < b.size() ? static_cast<unsigned char>(b[i]) : static_cast<unsigned char>(~x);
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

std::string DescribePeer(const PeerInfo& peer) {
  const std::string where = peer.address.empty() ? "an unknown address" : peer.address;
  return peer.user_id.empty() ? where : where + " (key " + peer.user_id + ")";
}

Status Authorize(const AccessPolicy& policy, const PeerInfo& peer, const MessageHeader& h, Privilege privilege) {
  if (policy.keyed) {
    const char* want = KeyRoleFor(privilege);
    if (peer.user_id == want) return Status::Ok();
    return FailedPrecondition("{} ({}) refused: needs the '{}' key, this connection's key is {}", MsgTypeName(h.type),
                              PrivilegeName(privilege), want,
                              peer.user_id.empty() ? std::string("none") : "'" + peer.user_id + "'");
  }
  if (!NeedsToken(privilege) || policy.run_secret.empty()) return Status::Ok();
  if (ConstantTimeEquals(h.token, policy.run_secret)) return Status::Ok();
  return FailedPrecondition("{} ({}) refused: {} (a run without keys requires the run's secret, <run dir>/secret)",
                            MsgTypeName(h.type), PrivilegeName(privilege),
                            h.token.empty() ? "no token" : "wrong token");
}

namespace {

// `p` made absolute and resolved as far as it exists, without a trailing separator.
fs::path Resolve(const fs::path& p, std::error_code* ec) {
  fs::path r = fs::weakly_canonical(fs::absolute(p), *ec);
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

}  // namespace

Status ConfineToRunDir(const std::string& run_dir, const std::string& wire_path, std::string* resolved) {
  if (run_dir.empty()) {
    return FailedPrecondition(
        "checkpoint path '{}' from the wire refused: this server has no run directory to "
        "confine it to",
        wire_path);
  }
  if (wire_path.empty()) return InvalidArgument("checkpoint path from the wire is empty");
  std::error_code ec;
  const fs::path root = Resolve(run_dir, &ec);
  if (ec) return IoError("run directory '{}': cannot resolve: {}", run_dir, ec.message());
  const fs::path asked(wire_path);
  const fs::path target = Resolve(asked.is_absolute() ? asked : root / asked, &ec);
  if (ec) return IoError("checkpoint path '{}': cannot resolve: {}", wire_path, ec.message());
  // Inside = every component of the root is a leading component of the target, and the target
  // has more (the run directory itself is not a file to write).
  const auto [root_end, target_end] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  if (root_end != root.end() || target_end == target.end()) {
    return FailedPrecondition(
        "checkpoint path '{}' from the wire refused: it resolves to '{}', outside the run directory '{}'", wire_path,
        target.string(), root.string());
  }
  // weakly_canonical leaves a dangling symlink as it is. The checkpoint writer renames over the
  // link (it does not follow it), but a link that could be created later is not worth the doubt.
  if (fs::is_symlink(fs::symlink_status(target, ec))) {
    return FailedPrecondition(
        "checkpoint path '{}' from the wire refused: '{}' is a symlink to '{}', which does not exist and may "
        "lie outside the run directory '{}'",
        wire_path, target.string(), fs::read_symlink(target, ec).string(), root.string());
  }
  *resolved = target.string();
  return Status::Ok();
}

}  // namespace downpour
