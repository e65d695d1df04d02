#include "tracker_service/tracked_modules.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tracker_service/names.h"

namespace deltastream {

std::string CleanFqn(absl::string_view path) {
  for (absl::string_view prefix : {"_dmp_wrapped_module.module.", "module."}) {
    if (absl::StartsWith(path, prefix)) {
      return std::string(path.substr(prefix.size()));
    }
  }
  return std::string(path);
}

std::string TableFqn(const TrackedModule& module, const TrackedTable& table) {
  return CleanFqn(absl::StrCat(
      module.path, module.pooled ? ".embedding_bags." : ".embeddings.",
      table.name));
}

bool IsSkipped(absl::string_view fqn,
               const std::vector<std::string>& fqns_to_skip) {
  for (absl::string_view component : absl::StrSplit(fqn, '.')) {
    if (std::find(fqns_to_skip.begin(), fqns_to_skip.end(), component) !=
        fqns_to_skip.end()) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<FeatureMap> BuildFeatureMap(
    const std::vector<TrackedModule>& modules,
    const std::vector<std::string>& fqns_to_skip) {
  FeatureMap map;
  for (const TrackedModule& module : modules) {
    if (module.path.empty()) {
      return absl::InvalidArgumentError("a tracked module has an empty path");
    }
    const bool module_skipped = IsSkipped(module.path, fqns_to_skip);
    if (!module_skipped) {
      map.modules.emplace_back(CleanFqn(module.path), module.pooled);
    }
    for (const TrackedTable& table : module.tables) {
      if (table.name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "module '", module.path, "' has a table with an empty name"));
      }
      const bool skipped =
          module_skipped || IsSkipped(table.name, fqns_to_skip);
      const std::string fqn = TableFqn(module, table);
      if (!skipped) {
        if (absl::Status status = ValidateName("table FQN", fqn);
            !status.ok()) {
          return status;
        }
        map.fqns.push_back(fqn);
      }
      for (const std::string& feature : table.feature_names) {
        if (feature.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "table '", fqn, "' has a feature with an empty name"));
        }
        if (skipped) {
          map.skipped_features.insert(feature);
          continue;
        }
        auto [it, inserted] = map.fqn_of_feature.emplace(feature, fqn);
        if (!inserted) {
          map.warnings.push_back(
              absl::StrCat("feature '", feature, "' is looked up by both '",
                           it->second, "' and '", fqn,
                           "'; its IDs are recorded for '", it->second, "'"));
        }
      }
    }
  }
  // A feature also owned by a tracked table is recorded there.
  for (const auto& [feature, fqn] : map.fqn_of_feature) {
    map.skipped_features.erase(feature);
  }
  // With the modules known, an entry that skips nothing is a mistake (a
  // misspelling, or a whole FQN where one component is meant).
  for (const std::string& entry : fqns_to_skip) {
    bool skips = false;
    for (const TrackedModule& module : modules) {
      skips = skips || IsSkipped(module.path, {entry});
      for (const TrackedTable& table : module.tables) {
        skips = skips || IsSkipped(table.name, {entry});
      }
    }
    if (!modules.empty() && !skips) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fqns_to_skip entry '", entry,
          "' skips nothing: an entry is one component of a tracked module's "
          "path or a table's name, and none is '",
          entry, "'"));
    }
  }
  return map;
}

}  // namespace deltastream
