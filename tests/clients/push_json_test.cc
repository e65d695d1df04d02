#include "clients/push_json.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace deltastream {
namespace {

using ::testing::HasSubstr;

TEST(PushJsonTest, ParsesTablesByName) {
  absl::StatusOr<std::vector<RecordTable>> tables = ParsePushJson(
      R"({"tables": {"b": {"ids": [3, 0, 9223372036854775807]},
                     "a": {"ids": [1, 2], "states": [[0.5, 1], [2, 3]]}}})",
      "test");
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 2u);
  EXPECT_EQ((*tables)[0].fqn, "a");
  EXPECT_TRUE(
      (*tables)[0].ids.equal(at::tensor({int64_t{1}, int64_t{2}}, at::kLong)));
  EXPECT_TRUE((*tables)[0].states.equal(
      at::tensor({0.5f, 1.0f, 2.0f, 3.0f}, at::kFloat).reshape({2, 2})));
  EXPECT_EQ((*tables)[1].fqn, "b");
  EXPECT_TRUE((*tables)[1].ids.equal(
      at::tensor({int64_t{3}, int64_t{0}, std::numeric_limits<int64_t>::max()},
                 at::kLong)));
  EXPECT_FALSE((*tables)[1].states.defined());
}

TEST(PushJsonTest, RefusesIdsOf2To63AndAbove) {
  for (const std::string id : {"9223372036854775808", "18446744073709551615",
                               "18446744073709551616", "1.5"}) {
    absl::StatusOr<std::vector<RecordTable>> tables =
        ParsePushJson(R"({"tables": {"t": {"ids": [1, )" + id + "]}}}", "in");
    ASSERT_FALSE(tables.ok()) << id;
    EXPECT_EQ(tables.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tables.status().message()),
                HasSubstr("in: table 't'"))
        << id;
  }
  absl::StatusOr<std::vector<RecordTable>> tables = ParsePushJson(
      R"({"tables": {"t": {"ids": [9223372036854775808]}}})", "in");
  EXPECT_THAT(std::string(tables.status().message()),
              HasSubstr("ID 9223372036854775808 is outside int64"));
}

// Negative IDs are refused before anything is sent: the service refuses
// them only in the message that holds them, after the earlier messages of a
// large push were recorded.
TEST(PushJsonTest, RefusesNegativeIds) {
  absl::StatusOr<std::vector<RecordTable>> tables =
      ParsePushJson(R"({"tables": {"t": {"ids": [0, 1, -1]}}})", "in");
  ASSERT_FALSE(tables.ok());
  EXPECT_EQ(tables.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tables.status().message()),
              HasSubstr("in: table 't': ID -1 is negative"));
}

TEST(PushJsonTest, RefusesKeysRepeatedInAnyObject) {
  for (const std::string text :
       {R"({"tables": {"t": {"ids": [1]}, "t": {"ids": [2]}}})",
        R"({"tables": {"t": {"ids": [1], "ids": [2]}}})",
        R"({"tables": {"t": {"ids": [1]}}, "tables": {}})"}) {
    absl::StatusOr<std::vector<RecordTable>> tables = ParsePushJson(text, "in");
    ASSERT_FALSE(tables.ok()) << text;
    EXPECT_THAT(std::string(tables.status().message()),
                HasSubstr("appears twice"))
        << text;
  }
  // The same key in different objects is fine.
  EXPECT_TRUE(ParsePushJson(R"({"tables": {"a": {"ids": [1]},
                                            "b": {"ids": [1]}}})",
                            "in")
                  .ok());
}

TEST(PushJsonTest, RefusesStatesOutsideFloat32) {
  absl::StatusOr<std::vector<RecordTable>> tables = ParsePushJson(
      R"({"tables": {"t": {"ids": [1], "states": [[1e39]]}}})", "in");
  ASSERT_FALSE(tables.ok());
  EXPECT_THAT(std::string(tables.status().message()),
              HasSubstr("outside float32's finite range"));
}

TEST(PushJsonTest, RefusesMalformedDocuments) {
  for (const std::string text :
       {"", "{", "[]", R"({"tables": []})", R"({"tables": {"t": {}}})",
        R"({"tables": {"t": {"ids": [1], "states": [[1], [1, 2]]}}})",
        R"({"tables": {"t": {"ids": ["1"]}}})"}) {
    absl::StatusOr<std::vector<RecordTable>> tables = ParsePushJson(text, "in");
    EXPECT_EQ(tables.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
  }
}

}  // namespace
}  // namespace deltastream
