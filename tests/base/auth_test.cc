#include "base/auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tracker_service/names.h"

namespace deltastream {
namespace {

TEST(TokenAuthorizerTest, ParsesGrantsAndRefusesMalformedLines) {
  auto parsed = TokenAuthorizer::Parse(
      "# comment\n\n  admin-token-0123456789 admin\n"
      "producer-token-012345\tproducer\n"
      "consumer-token-012345 consumer a,b\n"
      "every-consumer-token-0 consumer *\n",
      &ValidateName);
  EXPECT_TRUE(parsed.ok()) << parsed.status();

  for (const char* bad : {
           "short admin\n",                        // too short
           "admin-token-0123456789\n",             // no role
           "admin-token-0123456789 root\n",        // unknown role
           "consumer-token-012345 consumer\n",     // no names
           "consumer-token-012345 consumer ,\n",   // grants no consumer
           "consumer-token-012345 consumer a,\n",  // an empty name
           "consumer-token-012345 consumer a,,b\n",
           "consumer-token-012345 consumer a/b\n",  // breaks the name rule
           "producer-token-012345 producer a\n",    // names
           "admin-token-0123456789 admin\nadmin-token-0123456789 admin\n",
           "# nothing\n",
           // Bytes no client could send (gRPC aborts on such metadata).
           "admin-token\x01-0123456789 admin\n",
           "admin-token-\xc3\xa9-0123456789 admin\n",
       }) {
    auto result = TokenAuthorizer::Parse(bad, &ValidateName);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  auto second_line = TokenAuthorizer::Parse(
      "admin-token-0123456789 admin\nx-token-0123456789 king\n", &ValidateName);
  EXPECT_NE(second_line.status().message().find("line 2"), std::string::npos);
}

// Without a name rule (the predictor's lookup API) names are only checked to
// be there; with the tracker's, they follow it.
TEST(TokenAuthorizerTest, NameRuleIsTheCallers) {
  EXPECT_TRUE(
      TokenAuthorizer::Parse("consumer-token-012345 consumer a/b\n", nullptr)
          .ok());
  for (const char* bad : {"consumer-token-012345 consumer a,\n",
                          "consumer-token-012345 consumer ,\n"}) {
    EXPECT_EQ(TokenAuthorizer::Parse(bad, nullptr).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// The OS's error, named: a missing file is refused (NotFound, exit 2 at
// start), a read error (EIO: /proc/self/mem's first page) is not.
TEST(TokenAuthorizerTest, MissingFileIsAClearError) {
  auto result = TokenAuthorizer::FromFile("/nonexistent/tokens", nullptr);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find("/nonexistent/tokens"),
            std::string::npos);
  auto unreadable = TokenAuthorizer::FromFile("/proc/self/mem", nullptr);
  EXPECT_EQ(unreadable.status().code(), absl::StatusCode::kUnknown)
      << unreadable.status();
  EXPECT_NE(unreadable.status().message().find("cannot read token file"),
            std::string::npos);
}

// One rule for a token file's tokens and a client's --token_file.
TEST(CheckTokenTest, PrintableAsciiWithoutSpacesOf16To256) {
  EXPECT_TRUE(CheckToken("admin-token-0123456789").ok());
  EXPECT_TRUE(CheckToken(std::string(256, '~')).ok());
  for (const std::string& bad : {std::string("short"), std::string(257, 'a'),
                                 std::string("admin token 0123456789"),
                                 std::string("admin-token-\x01-0123456789"),
                                 std::string("admin-token-\xc3\xa9-0123456789"),
                                 std::string("admin-token-\x7f-0123456789")}) {
    EXPECT_EQ(CheckToken(bad).code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace deltastream
