#include "trainer/modules/embedding_config.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

absl::string_view PoolingName(Pooling pooling) {
  return pooling == Pooling::kSum ? "sum" : "mean";
}

absl::Status ValidateTables(const std::vector<EmbeddingTableConfig>& tables) {
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_map<std::string, std::string> table_of_feature;
  for (size_t i = 0; i < tables.size(); ++i) {
    const EmbeddingTableConfig& table = tables[i];
    if (table.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table at position ", i, " has an empty name"));
    }
    if (!names.insert(table.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name, "' appears twice"));
    }
    if (table.num_embeddings <= 0 || table.embedding_dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name, "': num_embeddings and embedding_dim must be ",
          "positive, got ", table.num_embeddings, " and ",
          table.embedding_dim));
    }
    if (table.feature_names.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name, "' has no features"));
    }
    for (const std::string& feature : table.feature_names) {
      if (feature.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", table.name, "' has an empty feature name"));
      }
      auto [it, inserted] = table_of_feature.emplace(feature, table.name);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature '", feature, "' is read by tables '",
                         it->second, "' and '", table.name, "'"));
      }
    }
    if (table.dtype != c10::kFloat && table.dtype != c10::kDouble) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name, "': dtype must be float or ",
                       "double, got ", c10::toString(table.dtype)));
    }
    if (table.init_min.has_value() != table.init_max.has_value() ||
        (table.init_min && *table.init_min > *table.init_max)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name,
          "': give both init_min and init_max, with init_min <= init_max"));
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream
