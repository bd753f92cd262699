// Tests for common/net_address.h: host:port with IPv6 brackets, tcp:// URLs, and which host a
// process advertises for each kind of bind (over an injected HostNetwork, so the answers do not
// depend on the machine), plus one look at the real host.
#include "common/net_address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace downpour {
namespace {

using ::testing::HasSubstr;

TEST(HostPort, SplitsNamesIpv4AndBracketedIpv6) {
  HostPort hp;
  ASSERT_TRUE(ParseHostPort("n1:5555", "--coordinator", &hp).ok());
  EXPECT_EQ(hp.host, "n1");
  EXPECT_EQ(hp.port, 5555);
  ASSERT_TRUE(ParseHostPort("10.1.2.3:0", "x", &hp).ok());
  EXPECT_EQ(hp.host, "10.1.2.3");
  EXPECT_EQ(hp.port, 0);
  ASSERT_TRUE(ParseHostPort("[::1]:5601", "x", &hp).ok());
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 5601);
  ASSERT_TRUE(ParseHostPort("[fe80::1:2]:65535", "x", &hp).ok());
  EXPECT_EQ(hp.host, "fe80::1:2");
  ASSERT_TRUE(ParseHostPort("tcp://127.0.0.1:37935", "x", &hp).ok());
  EXPECT_EQ(hp.host, "127.0.0.1");
  EXPECT_EQ(hp.port, 37935);
}

TEST(HostPort, BadTextIsOneErrorNamingTheFlagAndTheText) {
  HostPort hp;
  const auto error = [&](const char* text) {
    const Status s = ParseHostPort(text, "--coordinator", &hp);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr(fmt::format("--coordinator = '{}'", text)));
    return s.message();
  };
  EXPECT_THAT(error("n1"), HasSubstr("expected host:port"));
  EXPECT_THAT(error("n1:"), HasSubstr("bad port"));
  EXPECT_THAT(error("n1:70000"), HasSubstr("bad port '70000'"));
  EXPECT_THAT(error("n1:55x"), HasSubstr("bad port"));
  EXPECT_THAT(error(":5555"), HasSubstr("the host is empty"));
  EXPECT_THAT(error("::1:5555"), HasSubstr("needs brackets: [::1]:5555"));
  EXPECT_THAT(error("[::1]5555"), HasSubstr("expected [ipv6-address]:port"));
  EXPECT_THAT(error("[::1"), HasSubstr("expected [ipv6-address]:port"));
  EXPECT_THAT(error("tcp://n1"), HasSubstr("expected tcp://host:port"));
}

TEST(HostPort, FormatsAndUrlsBracketIpv6Only) {
  EXPECT_EQ(FormatHostPort("n1", 5555), "n1:5555");
  EXPECT_EQ(FormatHostPort("::1", 5555), "[::1]:5555");
  EXPECT_EQ(FormatHostPort("[::1]", 5555), "[::1]:5555");
  EXPECT_EQ(TcpUrl("127.0.0.3", 5601), "tcp://127.0.0.3:5601");
  EXPECT_EQ(TcpUrl("::", 5601), "tcp://[::]:5601");
  EXPECT_EQ(TcpUrl("", 5601), "tcp://*:5601");
  HostPort hp;
  ASSERT_TRUE(ParseTcpUrl("tcp://[::1]:41234", &hp).ok());
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 41234);
  ASSERT_TRUE(ParseTcpUrl("tcp://0.0.0.0:5601", &hp).ok());
  EXPECT_EQ(hp.host, "0.0.0.0");
}

TEST(HostPort, ClassifiesAddresses) {
  EXPECT_TRUE(IsIpv6Literal("::1"));
  EXPECT_TRUE(IsIpv6Literal("[::]"));
  EXPECT_FALSE(IsIpv6Literal("127.0.0.1"));
  EXPECT_FALSE(IsIpv6Literal("n1"));
  for (const char* w : {"0.0.0.0", "*", "::", "[::]", ""}) EXPECT_TRUE(IsWildcardAddress(w)) << w;
  EXPECT_FALSE(IsWildcardAddress("127.0.0.1"));
  for (const char* l : {"127.0.0.1", "127.0.0.5", "127.255.0.1", "::1", "[::1]", "::ffff:127.0.0.1"})
    EXPECT_TRUE(IsLoopbackLiteral(l)) << l;
  for (const char* l : {"10.0.0.1", "128.0.0.1", "::", "fe80::1", "localhost", "n1"})
    EXPECT_FALSE(IsLoopbackLiteral(l)) << l;
}

// A made-up machine: names resolve from a table, interfaces are listed.
HostNetwork FakeHost(const std::string& hostname, std::map<std::string, std::vector<std::string>> names,
                     std::vector<std::string> interfaces) {
  HostNetwork h;
  h.hostname = hostname;
  h.resolve = [names](const std::string& name, std::vector<std::string>* out) -> Status {
    const auto it = names.find(name);
    if (it != names.end()) {
      *out = it->second;
      return Status::Ok();
    }
    if (IsIpv6Literal(name) || name.find_first_not_of("0123456789.") == std::string::npos) {
      *out = {name};
      return Status::Ok();
    }
    return NotFound("'{}' does not resolve: Name or service not known", name);
  };
  h.interface_addresses = std::move(interfaces);
  return h;
}

TEST(Advertise, SpecificBindAdvertisesItself) {
  const HostNetwork h = FakeHost("n2", {{"n2", {"10.0.0.2"}}}, {"127.0.0.1", "10.0.0.2"});
  std::string a;
  ASSERT_TRUE(ResolveAdvertise("127.0.0.3", "", "", h, &a).ok());
  EXPECT_EQ(a, "127.0.0.3");
  ASSERT_TRUE(ResolveAdvertise("[::1]", "", "", h, &a).ok());
  EXPECT_EQ(a, "::1");
}

TEST(Advertise, WildcardBindAdvertisesTheHostNameWhenItIsRoutable) {
  const HostNetwork h = FakeHost("n2", {{"n2", {"10.0.0.2"}}}, {"127.0.0.1", "10.0.0.2"});
  std::string a;
  for (const char* bind : {"0.0.0.0", "*", "::"}) {
    ASSERT_TRUE(ResolveAdvertise(bind, "", "", h, &a).ok()) << bind;
    EXPECT_EQ(a, "n2");
  }
}

TEST(Advertise, WildcardBindNeverAdvertisesLoopback) {
  // Debian maps the host name to 127.0.1.1: the first non-loopback interface address instead.
  std::string a;
  HostNetwork h = FakeHost("laptop", {{"laptop", {"127.0.1.1"}}}, {"127.0.0.1", "::1", "192.168.1.20"});
  ASSERT_TRUE(ResolveAdvertise("0.0.0.0", "", "", h, &a).ok());
  EXPECT_EQ(a, "192.168.1.20");
  // A name that does not resolve at all: the same.
  h = FakeHost("ghost", {}, {"127.0.0.1", "10.9.8.7"});
  ASSERT_TRUE(ResolveAdvertise("0.0.0.0", "", "", h, &a).ok());
  EXPECT_EQ(a, "10.9.8.7");
  // Nothing but loopback: an error that says what to set.
  h = FakeHost("laptop", {{"laptop", {"127.0.1.1"}}}, {"127.0.0.1", "::1"});
  const Status s = ResolveAdvertise("0.0.0.0", "", "", h, &a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("binding 0.0.0.0"));
  EXPECT_THAT(s.message(), HasSubstr("set cluster.advertise or --advertise"));
}

TEST(Advertise, GivenNameMustResolveAndIsUsedAsGiven) {
  const HostNetwork h = FakeHost("n2", {{"n1", {"127.0.0.1"}}}, {"127.0.0.1", "10.0.0.2"});
  std::string a;
  // Given explicitly (Slurm's node name on a one-machine cluster): loopback is the operator's call.
  ASSERT_TRUE(ResolveAdvertise("0.0.0.0", "n1", "SLURMD_NODENAME", h, &a).ok());
  EXPECT_EQ(a, "n1");
  ASSERT_TRUE(ResolveAdvertise("0.0.0.0", "[::1]", "--advertise", h, &a).ok());
  EXPECT_EQ(a, "::1");
  const Status s = ResolveAdvertise("0.0.0.0", "no-such-host.invalid", "--advertise", h, &a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--advertise = 'no-such-host.invalid': this address does not resolve"));
}

TEST(Advertise, RealHostResolvesLocalhostAndRefusesAnInvalidName) {
  const HostNetwork h = ThisHost();
  std::vector<std::string> addresses;
  ASSERT_TRUE(h.resolve("localhost", &addresses).ok());
  EXPECT_FALSE(addresses.empty());
  std::string a;
  EXPECT_FALSE(ResolveAdvertise("0.0.0.0", "no-such-host.invalid", "cluster.advertise", h, &a).ok());
}

}  // namespace
}  // namespace downpour
