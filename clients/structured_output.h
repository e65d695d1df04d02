#ifndef DELTASTREAM_CLIENTS_STRUCTURED_OUTPUT_H_
#define DELTASTREAM_CLIENTS_STRUCTURED_OUTPUT_H_

#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// How deltactl prints what it prints (`-o FORMAT`): text tables, wider text
// tables, one JSON object per result, or one YAML document per result. The
// JSON and YAML of a result hold the same tree, built once as an
// nlohmann::ordered_json (keys in the order they were added). All functions
// are pure and thread-safe.

enum class OutputFormat { kText, kWide, kJson, kYaml };

// "text" (or ""), "wide", "json", "yaml". InvalidArgumentError naming the
// accepted values otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view name);

// `message` as google::protobuf::util::MessageToJsonString writes it with
// always_print_primitive_fields and preserve_proto_field_names: every field
// under its proto name in field order, scalars at their defaults included,
// unset message fields (and unset proto3 `optional` or oneof members) left
// out, enums by name, bytes in base64, maps as objects, NaN and infinities as
// "NaN", "Infinity", "-Infinity". One difference: 64-bit integers are JSON
// numbers, not strings, so that jq and Python compare them as numbers
// (nlohmann holds them exactly). Well-known types (Timestamp, Struct, ...)
// are written as ordinary messages.
nlohmann::ordered_json MessageToJson(const google::protobuf::Message& message);

// `value` as a YAML block document (YAML 1.2, and 1.1 readers such as PyYAML
// read the same values): one key per line, two-space indents, arrays of
// scalars (and arrays of such arrays) in flow style `[1, 2]`, strings and
// keys that are not plain identifiers double-quoted with JSON escapes, floats
// always with a '.' or an exponent. Ends with a newline; has no "---".
std::string ToYaml(const nlohmann::ordered_json& value);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_STRUCTURED_OUTPUT_H_
