#include "clients/structured_output.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace deltastream {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using json = nlohmann::ordered_json;

json FloatJson(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

// A singular field's value (index < 0) or one element of a repeated field.
json FieldJson(const Message& message, const FieldDescriptor& field,
               int index) {
  const Reflection& r = *message.GetReflection();
  const bool repeated = index >= 0;
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? r.GetRepeatedInt32(message, &field, index)
                      : r.GetInt32(message, &field);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? r.GetRepeatedInt64(message, &field, index)
                      : r.GetInt64(message, &field);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? r.GetRepeatedUInt32(message, &field, index)
                      : r.GetUInt32(message, &field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? r.GetRepeatedUInt64(message, &field, index)
                      : r.GetUInt64(message, &field);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return FloatJson(repeated ? r.GetRepeatedDouble(message, &field, index)
                                : r.GetDouble(message, &field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return FloatJson(repeated ? r.GetRepeatedFloat(message, &field, index)
                                : r.GetFloat(message, &field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? r.GetRepeatedBool(message, &field, index)
                      : r.GetBool(message, &field);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = repeated
                             ? r.GetRepeatedEnumValue(message, &field, index)
                             : r.GetEnumValue(message, &field);
      const auto* value = field.enum_type()->FindValueByNumber(number);
      return value != nullptr ? json(value->name()) : json(number);
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string value = repeated ? r.GetRepeatedString(message, &field, index)
                                   : r.GetString(message, &field);
      return field.type() == FieldDescriptor::TYPE_BYTES
                 ? absl::Base64Escape(value)
                 : value;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToJson(repeated
                               ? r.GetRepeatedMessage(message, &field, index)
                               : r.GetMessage(message, &field));
  }
  return nullptr;
}

// A map entry's key as proto3 JSON writes it: always a string.
std::string MapKey(const Message& entry) {
  const FieldDescriptor& key = *entry.GetDescriptor()->map_key();
  const json value = FieldJson(entry, key, -1);
  return value.is_string() ? value.get<std::string>() : value.dump();
}

bool IsScalar(const json& value) { return !value.is_structured(); }

// Arrays of scalars, arrays of those, and empty containers: one line.
bool IsFlow(const json& value) {
  if (IsScalar(value) || value.empty()) return true;
  if (!value.is_array()) return false;
  for (const json& item : value) {
    if (!IsFlow(item) || item.is_object()) return false;
  }
  return true;
}

std::string Quoted(const std::string& text) {
  return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string YamlScalar(const json& value) {
  if (value.is_string()) return Quoted(value.get<std::string>());
  if (value.is_number_float()) {
    std::string text = value.dump();
    // PyYAML (YAML 1.1) reads "1e-05" as a string: give it a fraction.
    if (text.find_first_of(".en") == std::string::npos) text += ".0";
    if (text.find('.') == std::string::npos &&
        text.find('e') != std::string::npos) {
      text.insert(text.find('e'), ".0");
    }
    return text;
  }
  return value.dump();  // null, true, false, integers
}

std::string YamlKey(const std::string& key) {
  static const char* const kReserved[] = {"true", "false", "null", "yes", "no",
                                          "on",   "off",   "y",    "n",   "~"};
  bool plain = !key.empty() && (absl::ascii_isalpha(key[0]) || key[0] == '_');
  for (char c : key) {
    plain = plain && (absl::ascii_isalnum(c) || c == '_' || c == '.');
  }
  for (const char* reserved : kReserved) {
    plain = plain && absl::AsciiStrToLower(key) != reserved;
  }
  return plain ? key : Quoted(key);
}

std::string FlowYaml(const json& value) {
  if (value.is_object()) return "{}";
  if (!value.is_array()) return YamlScalar(value);
  std::string out = "[";
  for (size_t i = 0; i < value.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? ", " : "", FlowYaml(value[i]));
  }
  return out + "]";
}

// A non-flow container as lines indented by `indent` spaces.
void AppendBlock(const json& value, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      absl::StrAppend(out, pad, YamlKey(key), ":");
      if (IsFlow(item)) {
        absl::StrAppend(out, " ", FlowYaml(item), "\n");
      } else {
        absl::StrAppend(out, "\n");
        // Sequences under a key sit at the key's indent, as kubectl writes.
        AppendBlock(item, item.is_array() ? indent : indent + 2, out);
      }
    }
    return;
  }
  for (const json& item : value) {
    if (IsFlow(item)) {
      absl::StrAppend(out, pad, "- ", FlowYaml(item), "\n");
      continue;
    }
    // The item's first line takes the dash: "- key: value".
    std::string block;
    AppendBlock(item, indent + 2, &block);
    block.replace(indent, 2, "- ");
    absl::StrAppend(out, block);
  }
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view name) {
  if (name.empty() || name == "text") return OutputFormat::kText;
  if (name == "wide") return OutputFormat::kWide;
  if (name == "json") return OutputFormat::kJson;
  if (name == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(absl::StrCat(
      "output format '", name, "': expected text, wide, json or yaml"));
}

json MessageToJson(const Message& message) {
  json out = json::object();
  const google::protobuf::Descriptor& descriptor = *message.GetDescriptor();
  const Reflection& r = *message.GetReflection();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.is_map()) {
      json map = json::object();
      for (int k = 0; k < r.FieldSize(message, &field); ++k) {
        const Message& entry = r.GetRepeatedMessage(message, &field, k);
        map[MapKey(entry)] =
            FieldJson(entry, *entry.GetDescriptor()->map_value(), -1);
      }
      out[field.name()] = std::move(map);
    } else if (field.is_repeated()) {
      json list = json::array();
      for (int k = 0; k < r.FieldSize(message, &field); ++k) {
        list.push_back(FieldJson(message, field, k));
      }
      out[field.name()] = std::move(list);
    } else if (!field.has_presence() || r.HasField(message, &field)) {
      out[field.name()] = FieldJson(message, field, -1);
    }
  }
  return out;
}

std::string ToYaml(const json& value) {
  if (IsFlow(value)) return FlowYaml(value) + "\n";
  std::string out;
  AppendBlock(value, 0, &out);
  return out;
}

}  // namespace deltastream
