#ifndef DELTASTREAM_TRAINER_MODULES_EMBEDDING_CONFIG_H_
#define DELTASTREAM_TRAINER_MODULES_EMBEDDING_CONFIG_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// How a pooled collection reduces the rows of one example's IDs.
enum class Pooling { kSum, kMean };

absl::string_view PoolingName(Pooling pooling);

// One embedding table (TorchRec's EmbeddingBagConfig / EmbeddingConfig).
struct EmbeddingTableConfig {
  // The table's name, unique in its module; its FQN is
  // "<module path>.embedding_bags.<name>" (pooled) or
  // "<module path>.embeddings.<name>" (sequence).
  std::string name;
  int64_t num_embeddings = 0;  // rows
  int64_t embedding_dim = 0;
  // The features whose IDs look this table up, each in one table only.
  std::vector<std::string> feature_names;
  // Pooled collections only.
  Pooling pooling = Pooling::kSum;
  // kFloat or kDouble; optimizer states use the same type.
  c10::ScalarType dtype = c10::kFloat;
  // Rows start uniform in [init_min, init_max]; by default
  // +-sqrt(1 / num_embeddings), as TorchRec does.
  std::optional<double> init_min;
  std::optional<double> init_max;
};

// InvalidArgument, naming the table and the field, when a name is empty or
// repeats, rows or dim are not positive, a table has no features, a feature
// is empty or read by two tables, the dtype is not float or double, or
// init_min > init_max.
absl::Status ValidateTables(const std::vector<EmbeddingTableConfig>& tables);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODULES_EMBEDDING_CONFIG_H_
