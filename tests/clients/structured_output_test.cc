// clients/structured_output.h: the JSON of a message is protobuf's own JSON
// mapping (numbers for 64-bit integers), and YAML holds the same tree.
#include "clients/structured_output.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "proto/tracker.pb.h"

namespace deltastream {
namespace {

using json = nlohmann::ordered_json;

v1::StatusResponse FilledStatus() {
  v1::StatusResponse s;
  s.set_mode("embedding");
  s.set_current_batch(std::numeric_limits<int64_t>::max());
  s.set_delete_on_read(true);
  s.set_bytes(4096);
  s.set_db("/var/lib/deltastream/db");
  v1::ConsumerStatus* c = s.add_consumers();
  c->set_name("predictor");
  c->set_cursor(-1);
  c->set_lag_seconds(0.25);
  c->set_has_pending_read(true);
  c->set_pending_reads(2);
  s.add_consumers()->set_name("checkpoint \"job\"");
  v1::TableStatus* t = s.add_tables();
  t->set_fqn("sparse.t1");
  t->set_ids(3);
  s.mutable_last_snapshot()->set_generation(
      std::numeric_limits<uint64_t>::max());
  s.mutable_last_snapshot()->set_seconds(1e-5);
  return s;
}

// protobuf's JSON with the 64-bit integers (strings there) made numbers.
json ProtobufJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string text;
  EXPECT_TRUE(
      google::protobuf::util::MessageToJsonString(message, &text, options)
          .ok());
  return json::parse(text);
}

// Whether `ours` equals protobuf's `theirs`, where theirs may write an
// integer as a string.
bool SameTree(const json& ours, const json& theirs, std::string* where) {
  if (theirs.is_string() && ours.is_number_integer()) {
    if (ours.dump() == theirs.get<std::string>()) return true;
  } else if (theirs.is_object() && ours.is_object()) {
    if (ours.size() != theirs.size()) {
      *where = "keys of " + ours.dump() + " vs " + theirs.dump();
      return false;
    }
    for (const auto& [key, value] : theirs.items()) {
      if (!ours.contains(key)) {
        *where = "missing " + key;
        return false;
      }
      if (!SameTree(ours[key], value, where)) return false;
    }
    return true;
  } else if (theirs.is_array() && ours.is_array() &&
             ours.size() == theirs.size()) {
    for (size_t i = 0; i < ours.size(); ++i) {
      if (!SameTree(ours[i], theirs[i], where)) return false;
    }
    return true;
  } else if (ours == theirs) {
    return true;
  }
  *where = ours.dump() + " vs " + theirs.dump();
  return false;
}

TEST(MessageToJsonTest, IsProtobufsMappingWithNumbers) {
  for (const v1::StatusResponse& status :
       {v1::StatusResponse(), FilledStatus()}) {
    const json ours = MessageToJson(status);
    std::string where;
    EXPECT_TRUE(SameTree(ours, ProtobufJson(status), &where)) << where;
  }
  const json ours = MessageToJson(FilledStatus());
  EXPECT_EQ(ours["current_batch"], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ours["last_snapshot"]["generation"],
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ours["tables"][0]["fqn"], "sparse.t1");
  // Fields in the proto's order; an unset message is left out.
  EXPECT_EQ(ours.begin().key(), "mode");
  EXPECT_FALSE(MessageToJson(v1::StatusResponse()).contains("last_snapshot"));
}

TEST(ToYamlTest, WritesBlocksAndFlowArrays) {
  const json value = {
      {"mode", "embedding"},
      {"batch", 7},
      {"seconds", 1e-5},
      {"whole", 2.0},
      {"on", true},
      {"db", nullptr},
      {"consumers", {{{"name", "a"}, {"cursor", -1}}, {{"name", "b\n"}}}},
      {"tables",
       {{"sparse.t1", {{"ids", {1, 3}}, {"states", {{1.5, 2.5}}}}},
        {"odd key", json::object()}}},
      {"empty", json::array()},
  };
  EXPECT_EQ(ToYaml(value),
            "mode: \"embedding\"\n"
            "batch: 7\n"
            "seconds: 1.0e-05\n"
            "whole: 2.0\n"
            "\"on\": true\n"
            "db: null\n"
            "consumers:\n"
            "- name: \"a\"\n"
            "  cursor: -1\n"
            "- name: \"b\\n\"\n"
            "tables:\n"
            "  sparse.t1:\n"
            "    ids: [1, 3]\n"
            "    states: [[1.5, 2.5]]\n"
            "  \"odd key\": {}\n"
            "empty: []\n");
  EXPECT_EQ(ToYaml(json::array({1, 2})), "[1, 2]\n");
  EXPECT_EQ(ToYaml(json::array({json::array({json{{"a", 1}}})})), "- - a: 1\n");
}

TEST(ParseOutputFormatTest, NamesTheAcceptedFormats) {
  EXPECT_EQ(*ParseOutputFormat(""), OutputFormat::kText);
  EXPECT_EQ(*ParseOutputFormat("text"), OutputFormat::kText);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_EQ(ParseOutputFormat("xml").status().message(),
            "output format 'xml': expected text, wide, json or yaml");
}

}  // namespace
}  // namespace deltastream
