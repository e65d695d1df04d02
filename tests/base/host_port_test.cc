// base/host_port.h: where the host of "HOST:PORT" ends, IPv6 in brackets, and
// the refusals that name the address.
#include "base/host_port.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <string>

#include "absl/status/status.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

// The host and port of `address`, which must split.
HostPort Split(const std::string& address) {
  absl::StatusOr<HostPort> split = SplitHostPort(address);
  EXPECT_TRUE(split.ok()) << address << ": " << split.status();
  return split.ok() ? *split : HostPort{"<refused>", -1};
}

// The message of the refusal of `address`, which must be InvalidArgument.
std::string Refusal(const std::string& address) {
  absl::StatusOr<HostPort> split = SplitHostPort(address);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument)
      << address;
  return std::string(split.status().message());
}

TEST(SplitHostPortTest, NamesAndIpv4) {
  EXPECT_EQ(Split("localhost:50051").host, "localhost");
  EXPECT_EQ(Split("localhost:50051").port, 50051);
  EXPECT_EQ(Split("10.0.0.7:0").host, "10.0.0.7");
  EXPECT_EQ(Split("10.0.0.7:0").port, 0);
  EXPECT_EQ(Split("trainer-0.trainer.svc:65535").host, "trainer-0.trainer.svc");
  EXPECT_EQ(Split("trainer-0.trainer.svc:65535").port, 65535);
}

TEST(SplitHostPortTest, Ipv6HostsLoseTheirBrackets) {
  EXPECT_EQ(Split("[::1]:80").host, "::1");
  EXPECT_EQ(Split("[::1]:80").port, 80);
  EXPECT_EQ(Split("[::]:0").host, "::");
  EXPECT_EQ(Split("[fe80::1%eth0]:9").host, "fe80::1%eth0");
}

TEST(SplitHostPortTest, AnEmptyHostIsTheCallersToRefuse) {
  EXPECT_EQ(Split(":5000").host, "");
  EXPECT_EQ(Split(":5000").port, 5000);
  EXPECT_EQ(Split("[]:5000").host, "");
}

TEST(SplitHostPortTest, RefusesWithOneLineNamingTheAddress) {
  EXPECT_THAT(Refusal("localhost"), HasSubstr("'localhost' is not HOST:PORT"));
  EXPECT_THAT(Refusal("localhost"), HasSubstr("no port"));
  EXPECT_THAT(Refusal("::1:80"), HasSubstr("an IPv6 host goes in brackets"));
  EXPECT_THAT(Refusal("[::1:80"), HasSubstr("unmatched bracket"));
  EXPECT_THAT(Refusal("::1]:80"), HasSubstr("brackets"));
  EXPECT_THAT(Refusal("a]:80"), HasSubstr("unmatched bracket"));
  EXPECT_THAT(Refusal("[::1]x:80"), HasSubstr("unmatched bracket"));
  for (const char* port :
       {"", "65536", "99999", "123456", "-1", "+1", "8O", " 80", "0x50"}) {
    EXPECT_THAT(Refusal(std::string("localhost:") + port),
                HasSubstr("the port must be a number from 0 to 65535"))
        << port;
  }
}

TEST(JoinHostPortTest, BracketsIpv6AndRoundTrips) {
  EXPECT_EQ(JoinHostPort("localhost", 50051), "localhost:50051");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("", 0), ":0");
  for (const char* address :
       {"localhost:50051", "10.0.0.7:0", "[::1]:80", "[::]:0", ":5000"}) {
    const HostPort split = Split(address);
    EXPECT_EQ(JoinHostPort(split.host, split.port), address);
  }
}

// As `hostname -f`: the name resolves, and it is the machine's name or a
// longer form of it.
TEST(FullHostNameTest, IsTheHostNameOrItsCanonicalForm) {
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::string full = FullHostName();
  ASSERT_FALSE(full.empty());
  if (full != name) {
    addrinfo hints = {};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    EXPECT_EQ(getaddrinfo(full.c_str(), nullptr, &hints, &found), 0) << full;
    if (found != nullptr) freeaddrinfo(found);
  }
}

TEST(OffsetPortTest, MovesThePortUpAndLeavesPortZero) {
  EXPECT_EQ(OffsetPort("127.0.0.1:50051", 3), "127.0.0.1:50054");
  EXPECT_EQ(OffsetPort("[::1]:9464", 1), "[::1]:9465");
  EXPECT_EQ(OffsetPort("localhost:9464", 0), "localhost:9464");
  EXPECT_EQ(OffsetPort("localhost:0", 2), "localhost:0");
  EXPECT_EQ(OffsetPort("no port", 2), "no port");
}

// A target is a server to connect to: port 1..65535 (gRPC reads port 99999
// as 34463), a host.
TEST(ValidateTargetTest, RefusesWhatWouldConnectElsewhere) {
  for (const char* good : {"127.0.0.1:50051", "localhost:1", "[::1]:65535",
                           "trainer-0.svc:50051"}) {
    EXPECT_TRUE(ValidateTarget(good).ok()) << good;
  }
  for (const char* bad :
       {"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:0", "127.0.0.1", ":50051",
        "a b:1", "::1:80", "127.0.0.1:165999"}) {
    const absl::Status status = ValidateTarget(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find(bad), std::string::npos) << status;
  }
}

}  // namespace
}  // namespace deltastream
