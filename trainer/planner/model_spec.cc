#include "trainer/planner/model_spec.h"

#include <google/protobuf/text_format.h>

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/text_proto.h"
#include "trainer/config_defaults.h"
#include "trainer/models/architecture_rule.h"

namespace deltastream::planner {
namespace {

template <typename Message>
absl::StatusOr<Message> ParseText(absl::string_view text,
                                  absl::string_view what) {
  Message message;
  if (absl::Status parsed = ParseTextProto(text, &message); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", parsed.message()));
  }
  return message;
}

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", field, ": ", message));
}

// Parameters of an MLP from `in` features through `layers` (weights and
// biases).
int64_t MlpParameters(int64_t in, const std::vector<int64_t>& layers) {
  int64_t parameters = 0;
  for (int64_t out : layers) {
    parameters += in * out + out;
    in = out;
  }
  return parameters;
}

}  // namespace

absl::StatusOr<v1::TrainerConfig> ParseConfigText(absl::string_view text) {
  return ParseText<v1::TrainerConfig>(text, "config");
}

absl::StatusOr<v1::PlannerConstraints> ParseConstraintsText(
    absl::string_view text) {
  return ParseText<v1::PlannerConstraints>(text, "constraints");
}

absl::StatusOr<ModelSpec> ModelSpecFromConfig(const v1::TrainerConfig& given) {
  const v1::TrainerConfig config = WithTrainerConfigDefaults(given);
  ModelSpec spec;
  const v1::Model& model = config.model();
  const bool sequence = model.kind() == "sequence";
  if (!sequence && model.kind() != "dlrm") {
    return Invalid("model.kind",
                   absl::StrCat("dlrm or sequence, got '", model.kind(), "'"));
  }

  // IDs per example and feature: the synthetic data's mean length, or one
  // per Criteo feature.
  double ids_per_feature = 1;
  if (!config.data().has_criteo()) {
    const v1::SyntheticData& synthetic = config.data().synthetic();
    if (synthetic.min_length() < 0 ||
        synthetic.max_length() < synthetic.min_length()) {
      return Invalid("data.synthetic", "needs 0 <= min_length <= max_length");
    }
    ids_per_feature =
        static_cast<double>(synthetic.min_length() + synthetic.max_length()) /
        2;
  }
  spec.batch_size = config.data().batch_size();
  if (spec.batch_size <= 0)
    return Invalid("data.batch_size", "must be positive");

  absl::flat_hash_map<std::string, bool> names;
  for (const v1::EmbeddingTable& in : model.tables()) {
    const std::string field = absl::StrCat("model.tables '", in.name(), "'");
    TableSpec table;
    table.name = in.name();
    table.rows = in.num_embeddings();
    table.dim = in.embedding_dim();
    table.num_features = in.feature_names_size();
    if (table.name.empty())
      return Invalid("model.tables", "a table has no name");
    if (!names.emplace(table.name, true).second) {
      return Invalid(field, "the name repeats");
    }
    if (table.rows <= 0 || table.dim <= 0) {
      return Invalid(field,
                     "num_embeddings and embedding_dim must be positive");
    }
    if (in.dtype() == "float") {
      table.element_bytes = 4;
    } else if (in.dtype() == "double") {
      table.element_bytes = 8;
    } else {
      return Invalid(field, absl::StrCat("dtype must be float or double, got '",
                                         in.dtype(), "'"));
    }
    table.pooled = !sequence;
    table.pooling_factor =
        ids_per_feature * static_cast<double>(table.num_features);
    spec.tables.push_back(table);
  }

  const std::string& optimizer = model.sparse_optimizer().type();
  if (optimizer == "rowwise_adagrad") {
    spec.optimizer = OptimizerKind::kRowwiseAdagrad;
  } else if (optimizer == "sgd") {
    spec.optimizer = OptimizerKind::kSgd;
  } else if (optimizer == "adagrad") {
    spec.optimizer = OptimizerKind::kAdagrad;
  } else if (optimizer == "adam") {
    spec.optimizer = OptimizerKind::kAdam;
  } else {
    return Invalid("model.sparse_optimizer",
                   absl::StrCat("unknown optimizer '", optimizer, "'"));
  }
  const std::string& dense = model.dense_optimizer().type();
  if (dense == "sgd") {
    spec.dense_state_copies = 2;
  } else if (dense == "adagrad") {
    spec.dense_state_copies = 3;
  } else if (dense == "adam") {
    spec.dense_state_copies = 4;
  } else {
    return Invalid("model.dense_optimizer.type",
                   absl::StrCat("sgd, adagrad or adam, got '", dense, "'"));
  }

  // The dense parameters, as trainer/models builds them (float).
  const std::vector<int64_t> dense_arch(model.dense_arch().begin(),
                                        model.dense_arch().end());
  const std::vector<int64_t> over_arch(model.over_arch().begin(),
                                       model.over_arch().end());
  std::vector<TableShape> shapes;
  for (const TableSpec& table : spec.tables) {
    shapes.push_back({table.name, table.dim});
  }
  // A model the trainer would not build is not planned.
  if (absl::Status status = ValidateArchitecture(model.num_dense(), dense_arch,
                                                 over_arch, shapes);
      !status.ok()) {
    return Invalid("model", status.message());
  }
  const int64_t dim = spec.tables.front().dim;
  int64_t features = 0;
  for (const TableSpec& table : spec.tables) features += table.num_features;
  const int64_t vectors = features + 1;
  const int64_t over_in =
      sequence ? dim * (features + 1) : dim + vectors * (vectors - 1) / 2;
  spec.dense_parameter_bytes =
      4 * (MlpParameters(model.num_dense(), dense_arch) +
           MlpParameters(over_in, over_arch));
  spec.gpu = absl::StartsWith(config.device(), "cuda");
  return spec;
}

absl::Status ApplyConstraints(const v1::PlannerConstraints& constraints,
                              std::vector<TableSpec>* tables) {
  absl::flat_hash_map<std::string, TableSpec*> by_name;
  for (TableSpec& table : *tables) by_name[table.name] = &table;
  absl::flat_hash_set<std::string> constrained;
  for (const v1::TableConstraints& given : constraints.tables()) {
    auto invalid = [&](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraints: table '", given.table(), "': ", message));
    };
    auto it = by_name.find(given.table());
    if (it == by_name.end()) return invalid("not a table of the model");
    if (!constrained.insert(given.table()).second) {
      // The second entry would silently replace the first.
      return absl::InvalidArgumentError(
          absl::StrCat("constraints: table '", given.table(),
                       "' is constrained twice (one entry per table)"));
    }
    TableSpec& table = *it->second;
    table.sharding_types.clear();
    for (int type : given.sharding_types()) {
      if (type == v1::SHARDING_TYPE_UNSPECIFIED) {
        return invalid("SHARDING_TYPE_UNSPECIFIED is not a sharding type");
      }
      table.sharding_types.push_back(static_cast<v1::ShardingType>(type));
    }
    if (given.min_partition() < 0) return invalid("min_partition < 0");
    if (given.min_partition() > table.dim) {
      return invalid(absl::StrCat("min_partition ", given.min_partition(),
                                  " is wider than the table (dim ", table.dim,
                                  ")"));
    }
    table.min_partition = given.min_partition();
    if (!(given.pooling_factor() >= 0) ||
        !std::isfinite(given.pooling_factor())) {
      return invalid(absl::StrCat(
          "pooling_factor must be a finite number >= 0 (0: from the "
          "config), got ",
          given.pooling_factor()));
    }
    if (given.pooling_factor() > 0) {
      table.pooling_factor = given.pooling_factor();
    }
    if (given.placement() == v1::PLACEMENT_HOST) {
      return invalid(
          "PLACEMENT_HOST (host memory with a device cache, "
          "FUSED_UVM_CACHING) is not supported: the trainer keeps every "
          "table on the rank's device");
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream::planner
