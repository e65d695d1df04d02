#include "clients/push_json.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

using nlohmann::json;

// Parses `text`; sets `duplicate` to the first key an object repeats.
json ParseRefusingDuplicates(const std::string& text, std::string& duplicate) {
  std::vector<std::set<std::string>> open_objects;
  json::parser_callback_t on_event = [&](int, json::parse_event_t event,
                                         json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, on_event, /*allow_exceptions=*/false);
}

}  // namespace

absl::StatusOr<std::vector<RecordTable>> ParsePushJson(
    const std::string& text, absl::string_view source) {
  std::string duplicate;
  json doc = ParseRefusingDuplicates(text, duplicate);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("bad JSON in ", source));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the key \"", duplicate,
                     "\" appears twice in one object; refusing to guess "
                     "which one is meant"));
  }
  if (!doc.is_object() || !doc.contains("tables") ||
      !doc["tables"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected {\"tables\": {\"FQN\": {\"ids\": [...]}}}"));
  }
  std::vector<RecordTable> tables;
  for (auto& [fqn, table] : doc["tables"].items()) {
    auto invalid = [&source, &fqn = fqn](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": table '", fqn, "': ", what));
    };
    if (!table.is_object() || !table.contains("ids") ||
        !table["ids"].is_array()) {
      return invalid("needs an \"ids\" array");
    }
    std::vector<int64_t> ids;
    for (const json& id : table["ids"]) {
      if (!id.is_number_integer()) {
        return invalid(absl::StrCat("IDs must be integers, got ", id.dump()));
      }
      if (id.is_number_unsigned() &&
          id.get<uint64_t>() >
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid(absl::StrCat("ID ", id.dump(),
                                    " is outside int64 (IDs are below 2^63)"));
      }
      // The service refuses them too (IDs are row indices), but only in the
      // message that holds them: a push large enough to go as several
      // messages would be recorded up to that one.
      if (id.get<int64_t>() < 0) {
        return invalid(absl::StrCat("ID ", id.dump(),
                                    " is negative (IDs are row indices)"));
      }
      ids.push_back(id.get<int64_t>());
    }
    RecordTable record{fqn, at::tensor(ids, at::kLong), at::Tensor()};
    if (ids.empty()) record.ids = at::empty({0}, at::kLong);
    if (table.contains("states")) {
      const json& states = table["states"];
      std::vector<float> flat;
      size_t dim = 0;
      bool ok = states.is_array();
      for (const json& row : ok ? states : json::array()) {
        if (!row.is_array() || (dim != 0 && row.size() != dim) || row.empty()) {
          ok = false;
          break;
        }
        dim = row.size();
        for (const json& v : row) {
          if (!v.is_number()) {
            ok = false;
            break;
          }
          const float value = v.get<float>();
          if (!std::isfinite(value)) {
            return invalid(absl::StrCat("state ", v.dump(),
                                        " is outside float32's finite range"));
          }
          flat.push_back(value);
        }
        if (!ok) break;
      }
      if (!ok) {
        return invalid("states must be rows of numbers, all of one length");
      }
      record.states = at::tensor(flat, at::kFloat)
                          .reshape({static_cast<int64_t>(states.size()),
                                    static_cast<int64_t>(dim)});
    }
    tables.push_back(std::move(record));
  }
  return tables;
}

}  // namespace deltastream
