#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKED_MODULES_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKED_MODULES_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// One embedding table of a module, and the features that look it up.
struct TrackedTable {
  std::string name;
  std::vector<std::string> feature_names;
};

// An embedding module of the model, as the trainer describes it to the tracker.
struct TrackedModule {
  // The module's path in the model, e.g.
  // "_dmp_wrapped_module.module.sparse.ebc".
  std::string path;
  // True for a pooled collection (EmbeddingBagCollection), false for a
  // sequence collection (EmbeddingCollection).
  bool pooled = false;
  std::vector<TrackedTable> tables;
};

// Strips the prefix that wrapping adds to module paths so that FQNs match the
// state dict: "_dmp_wrapped_module.module." or else "module.".
std::string CleanFqn(absl::string_view path);

// The FQN of a table: the cleaned path of the table's own submodule,
// "<module path>.embedding_bags.<table>" for pooled modules and
// "<module path>.embeddings.<table>" otherwise.
std::string TableFqn(const TrackedModule& module, const TrackedTable& table);

// Which table FQN each feature's IDs belong to.
struct FeatureMap {
  absl::flat_hash_map<std::string, std::string> fqn_of_feature;
  // Features whose table is skipped: their IDs are not recorded.
  absl::flat_hash_set<std::string> skipped_features;
  // Tracked table FQNs, in model order.
  std::vector<std::string> fqns;
  // Tracked modules' cleaned paths, and whether they are pooled.
  std::vector<std::pair<std::string, bool>> modules;
  // Things a person should know but that do not stop tracking, e.g. a feature
  // that two tables claim (the first keeps it).
  std::vector<std::string> warnings;
};

// Builds the feature map. A module is skipped when a component of its path
// (split at '.') is in `fqns_to_skip`; a table when its name is.
// InvalidArgument for an empty module path, table name or feature name, a
// tracked table whose FQN breaks the name rule (tracker_service/names.h),
// or (when `modules` is not empty) an entry of `fqns_to_skip` that skips
// nothing.
absl::StatusOr<FeatureMap> BuildFeatureMap(
    const std::vector<TrackedModule>& modules,
    const std::vector<std::string>& fqns_to_skip);

// Whether a table FQN pushed directly (not through a module) is skipped: one of
// its components is in `fqns_to_skip`.
bool IsSkipped(absl::string_view fqn,
               const std::vector<std::string>& fqns_to_skip);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKED_MODULES_H_
