// Tests for common/security.h: the key directory downpour-keys makes, what LoadCurveKeys
// refuses (missing, garbled, mixed-up or too-open key files, a world-writable directory) and
// the loopback rule. The keys at work on real sockets are in transport_test.cc.
#include "common/security.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>

#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr const char* kKeyNames[] = {"endpoint", "admin", "server", "worker"};

mode_t ModeOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// A fresh key directory <scratch>/keys.
std::string MakeKeys(const std::string& prefix) {
  const std::string dir = (test::ScratchDir(prefix) / "keys").string();
  const Status s = MakeClusterKeys(dir);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dir;
}

TEST(ClusterKeys, EveryKeypairWithSecretsOwnerOnly) {
  const std::string dir = MakeKeys("keys_made");
  EXPECT_EQ(ModeOf(dir), 0700u);
  for (const char* name : kKeyNames) {
    EXPECT_EQ(ModeOf(dir + "/" + name + ".key"), 0600u) << name;
    EXPECT_EQ(ModeOf(dir + "/" + name + ".pub"), 0644u) << name;
    EXPECT_THAT(test::ReadFile(dir + "/" + name + ".key"), HasSubstr("secret = \"")) << name;
  }
}

TEST(ClusterKeys, BinderGetsTheAllowListClientGetsOnlyItsOwnKey) {
  const std::string dir = MakeKeys("keys_load");
  CurveOptions binder, client;
  ASSERT_TRUE(LoadCurveKeys(dir, KeyRole::kServer, /*bind=*/true, &binder).ok());
  ASSERT_TRUE(LoadCurveKeys(dir, KeyRole::kWorker, /*bind=*/false, &client).ok());
  EXPECT_TRUE(binder.enabled);
  EXPECT_TRUE(client.enabled);
  EXPECT_EQ(binder.server_public.size(), 40u);
  EXPECT_EQ(binder.server_secret.size(), 40u);
  EXPECT_EQ(client.server_public, binder.server_public);
  EXPECT_TRUE(client.server_secret.empty());
  EXPECT_TRUE(client.allowed.empty());
  std::set<std::string> roles;
  for (const auto& [key, role] : binder.allowed) roles.insert(role);
  EXPECT_EQ(roles, (std::set<std::string>{"admin", "server", "worker"}));
  // The worker's key is in the binder's allow-list, as "worker".
  ASSERT_TRUE(binder.allowed.count(client.client_public));
  EXPECT_EQ(binder.allowed.at(client.client_public), "worker");
  EXPECT_NE(binder.client_public, client.client_public);
}

TEST(ClusterKeys, TwoClustersShareNoKey) {
  CurveOptions a, b;
  ASSERT_TRUE(LoadCurveKeys(MakeKeys("keys_a"), KeyRole::kWorker, true, &a).ok());
  ASSERT_TRUE(LoadCurveKeys(MakeKeys("keys_b"), KeyRole::kWorker, true, &b).ok());
  EXPECT_NE(a.server_public, b.server_public);
  EXPECT_NE(a.client_public, b.client_public);
  EXPECT_EQ(b.allowed.count(a.client_public), 0u);
}

TEST(ClusterKeys, WorldReadableSecretRefusedWithChmodHint) {
  const std::string dir = MakeKeys("keys_perm");
  const std::string key = dir + "/worker.key";
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  CurveOptions out;
  const Status s = LoadCurveKeys(dir, KeyRole::kWorker, false, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("permissions 0644 for '" + key + "' are too open"));
  EXPECT_THAT(s.message(), HasSubstr("chmod 600 " + key));
  ASSERT_EQ(::chmod(key.c_str(), 0640), 0);  // group-readable is refused too
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kWorker, false, &out).message(), HasSubstr("0640"));
}

TEST(ClusterKeys, MissingFileNamedWithHowToMakeKeys) {
  const std::string dir = MakeKeys("keys_missing");
  fs::remove(dir + "/worker.key");
  CurveOptions out;
  const Status s = LoadCurveKeys(dir, KeyRole::kWorker, false, &out);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/worker.key: no such file"));
  EXPECT_THAT(s.message(), HasSubstr("downpour-keys --out " + dir));
  // A client needs no other role's secret: the server loads fine without worker.key.
  EXPECT_TRUE(LoadCurveKeys(dir, KeyRole::kServer, true, &out).ok());
  fs::remove(dir + "/admin.pub");  // but a binder needs every client public key
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kServer, true, &out).message(), HasSubstr(dir + "/admin.pub"));
}

TEST(ClusterKeys, MissingDirectoryNamed) {
  const std::string dir = (test::ScratchDir("keys_nodir") / "nope").string();
  CurveOptions out;
  const Status s = LoadCurveKeys(dir, KeyRole::kWorker, false, &out);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("security.keys = " + dir + ": no such directory"));
}

TEST(ClusterKeys, GarbledKeyNamed) {
  const std::string dir = MakeKeys("keys_garbled");
  test::WriteFile(dir + "/endpoint.pub", "public = \"tooshort\"\n");
  CurveOptions out;
  Status s = LoadCurveKeys(dir, KeyRole::kWorker, false, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/endpoint.pub: public is not a CurveZMQ key"));
  // 40 characters, but not Z85 (a space is not in its alphabet).
  test::WriteFile(dir + "/endpoint.pub", "public = \"" + std::string(40, ' ') + "\"\n");
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kWorker, false, &out).message(), HasSubstr("not a CurveZMQ key"));
  test::WriteFile(dir + "/endpoint.pub", "this is not toml = = =\n");
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kWorker, false, &out).message(),
              HasSubstr(dir + "/endpoint.pub: not a key file made by downpour-keys"));
}

TEST(ClusterKeys, KeyFileWhosePublicIsNotItsSecretsRefused) {
  const std::string dir = MakeKeys("keys_mixed");
  const std::string other = MakeKeys("keys_mixed_other");
  // worker.key with the admin's public key pasted in.
  auto public_line = [](const std::string& text) {
    const size_t at = text.find("public = ");
    return std::make_pair(at, text.find('\n', at) - at);
  };
  const std::string admin_pub = test::ReadFile(other + "/admin.pub");
  std::string worker = test::ReadFile(dir + "/worker.key");
  const auto [at, length] = public_line(worker);
  const auto [admin_at, admin_length] = public_line(admin_pub);
  worker.replace(at, length, admin_pub.substr(admin_at, admin_length));
  test::WriteFile(dir + "/worker.key", worker);
  ASSERT_EQ(::chmod((dir + "/worker.key").c_str(), 0600), 0);
  CurveOptions out;
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kWorker, false, &out).message(),
              HasSubstr("worker.key: public does not belong to secret"));
}

TEST(ClusterKeys, EndpointFilesFromTwoClustersRefused) {
  const std::string dir = MakeKeys("keys_twoend");
  const std::string other = MakeKeys("keys_twoend_other");
  fs::copy_file(other + "/endpoint.pub", dir + "/endpoint.pub", fs::copy_options::overwrite_existing);
  CurveOptions out;
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kServer, true, &out).message(),
              HasSubstr("endpoint.pub does not belong to endpoint.key"));
}

TEST(ClusterKeys, WorldWritableDirectoryRefused) {
  const std::string dir = MakeKeys("keys_dirperm");
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  CurveOptions out;
  const Status s = LoadCurveKeys(dir, KeyRole::kWorker, false, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("writable by others"));
  EXPECT_THAT(s.message(), HasSubstr("chmod 700 " + dir));
  ASSERT_EQ(::chmod(dir.c_str(), 0770), 0);
  EXPECT_THAT(LoadCurveKeys(dir, KeyRole::kWorker, false, &out).message(), HasSubstr("writable by others"));
}

TEST(ClusterKeys, PublicKeyOthersMayReplaceRefused) {
  // Whoever may write admin.pub could put their own key in every binder's allow-list.
  const std::string dir = MakeKeys("keys_pubperm");
  const std::string pub = dir + "/admin.pub";
  ASSERT_EQ(::chmod(pub.c_str(), 0664), 0);
  CurveOptions out;
  const Status s = LoadCurveKeys(dir, KeyRole::kServer, /*bind=*/true, &out);
  EXPECT_THAT(s.message(), HasSubstr("permissions 0664 for '" + pub + "' are too open"));
  EXPECT_THAT(s.message(), HasSubstr("chmod 644 " + pub));
}

TEST(ClusterKeys, RemakingOverwritesEveryKey) {
  const std::string dir = MakeKeys("keys_remake");
  const std::string before = test::ReadFile(dir + "/endpoint.pub");
  ASSERT_TRUE(MakeClusterKeys(dir).ok());
  EXPECT_NE(test::ReadFile(dir + "/endpoint.pub"), before);
  EXPECT_EQ(ModeOf(dir + "/endpoint.key"), 0600u);
}

TEST(ClusterKeys, CheckReportsEveryFileAndToleratesAbsentSecrets) {
  const std::string dir = MakeKeys("keys_check");
  std::vector<std::string> report;
  ASSERT_TRUE(CheckClusterKeys(dir, &report).ok());
  EXPECT_EQ(report.size(), 8u);
  EXPECT_THAT(report, ::testing::Contains("worker.key: ok"));
  // A worker host holds no endpoint secret: fine. A world-readable admin.key: not.
  fs::remove(dir + "/endpoint.key");
  ASSERT_EQ(::chmod((dir + "/admin.key").c_str(), 0604), 0);
  report.clear();
  const Status s = CheckClusterKeys(dir, &report);
  EXPECT_THAT(s.message(), HasSubstr("1 problem(s)"));
  EXPECT_THAT(s.message(), HasSubstr("chmod 600 " + dir + "/admin.key"));
  EXPECT_THAT(report, ::testing::Contains(HasSubstr("endpoint.key: absent")));
}

// downpour-keys as an operator runs it.
TEST(KeysProgram, MakesChecksAndRefusesToOverwriteWithoutForce) {
  const std::string dir = (test::ScratchDir("keys_program") / "keys").string();
  const std::string keys = test::Binary("downpour-keys");
  std::string out;
  ASSERT_EQ(test::RunCommand({keys, "--out", dir}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("worker hosts:        " + dir + "/worker.key"));
  // The coordinator's task also runs the evaluator, which registers with the worker key.
  EXPECT_THAT(out, HasSubstr("coordinator host:    " + dir + "/endpoint.key " + dir + "/admin.key " +
                             dir + "/worker.key"));
  EXPECT_EQ(test::RunCommand({keys, "--check", dir}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(dir + ": ok"));
  const std::string before = test::ReadFile(dir + "/endpoint.key");
  EXPECT_EQ(test::RunCommand({keys, "--out", dir}, &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("pass --force"));
  EXPECT_EQ(test::ReadFile(dir + "/endpoint.key"), before);
  EXPECT_EQ(test::RunCommand({keys, "--out", dir, "--force"}, &out), 0) << out;
  EXPECT_NE(test::ReadFile(dir + "/endpoint.key"), before);
  ASSERT_EQ(::chmod((dir + "/server.key").c_str(), 0644), 0);
  EXPECT_EQ(test::RunCommand({keys, "--check", dir}, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("chmod 600 " + dir + "/server.key"));
  EXPECT_EQ(test::RunCommand({keys}, &out), 2) << out;
}

TEST(KeyRoles, NamesAreTheUserIds) {
  EXPECT_STREQ(KeyRoleName(KeyRole::kAdmin), "admin");
  EXPECT_STREQ(KeyRoleName(KeyRole::kServer), "server");
  EXPECT_STREQ(KeyRoleName(KeyRole::kWorker), "worker");
}

TEST(Loopback, HostsThatStayOnThisMachine) {
  for (const char* host :
       {"localhost", "127.0.0.1", "127.0.0.3", "127.255.255.254", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "*", "::", "[::]", "10.1.2.3", "128.0.0.1", "node1", "fd00::3", "",
                           "localhost.example.com", "::ffff:10.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(BindRule, OffHostBindNeedsKeysOrInsecure) {
  const SecurityConfig none;
  SecurityConfig keyed;
  keyed.keys = "keys";
  SecurityConfig insecure;
  insecure.insecure = true;
  for (const char* bind : {"127.0.0.1", "127.0.0.7", "::1", "localhost"}) {
    EXPECT_TRUE(CheckBindAllowed(bind, none, "cluster.bind").ok()) << bind;
  }
  for (const char* bind : {"0.0.0.0", "*", "::", "10.1.2.3", "node7"}) {
    const Status s = CheckBindAllowed(bind, none, "cluster.bind");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bind;
    EXPECT_THAT(s.message(), HasSubstr(std::string("cluster.bind = ") + bind + " is reachable from other hosts"));
    EXPECT_THAT(s.message(), HasSubstr("downpour-keys --out keys"));
    EXPECT_THAT(s.message(), HasSubstr("security.insecure = true"));
    EXPECT_TRUE(CheckBindAllowed(bind, keyed, "cluster.bind").ok()) << bind;
    EXPECT_TRUE(CheckBindAllowed(bind, insecure, "cluster.bind").ok()) << bind;
  }
  EXPECT_THAT(CheckBindAllowed("0.0.0.0", none, "--bind").message(), HasSubstr("--bind = 0.0.0.0"));
}

}  // namespace
}  // namespace downpour
