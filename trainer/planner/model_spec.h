#ifndef DELTASTREAM_TRAINER_PLANNER_MODEL_SPEC_H_
#define DELTASTREAM_TRAINER_PLANNER_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/plan.pb.h"
#include "proto/trainer_config.pb.h"
#include "trainer/planner/sharding_option.h"

namespace deltastream::planner {

// What the planner needs of a model: its tables, batch, optimizers and
// dense size, read from the trainer's configuration (ModelSpecFromConfig
// sets every field).
struct ModelSpec {
  std::vector<TableSpec> tables;
  int64_t batch_size = 0;
  OptimizerKind optimizer = OptimizerKind::kRowwiseAdagrad;
  // Bytes of the dense (MLP) parameters, and how many copies training keeps
  // of them: weights, gradients and the dense optimizer's states (SGD 2,
  // Adagrad 3, Adam 4).
  int64_t dense_parameter_bytes = 0;
  int dense_state_copies = 3;
  bool gpu = false;  // the config's device is "cuda..."
};

// Reads a trainer config (proto/trainer_config.proto) with the defaults
// the trainer applies (WithTrainerConfigDefaults, trainer/config_defaults.h:
// the one place both take them from). DLRM tables are pooled, sequence
// tables not. Pooling factors come from the data settings: the mean IDs per
// example and feature of the synthetic data ((min_length + max_length) / 2)
// or 1 for Criteo, times the table's features. InvalidArgument naming the
// field for what the trainer would refuse (a bad kind, optimizer, dtype,
// table shape or a repeated table name).
absl::StatusOr<ModelSpec> ModelSpecFromConfig(const v1::TrainerConfig& given);

// Parses protobuf text (the trainer's config or planner constraints);
// InvalidArgument with "line L column C: ..." when it does not parse.
absl::StatusOr<v1::TrainerConfig> ParseConfigText(absl::string_view text);
absl::StatusOr<v1::PlannerConstraints> ParseConstraintsText(
    absl::string_view text);

// Applies per-table constraints. InvalidArgument naming the table when it
// is not in `tables` or constrained twice, or a value is out of range (a
// negative min_partition or one wider than the table, a pooling factor that
// is not a finite number >= 0, PLACEMENT_HOST: the trainer keeps every
// table on the rank's device, so PLACEMENT_DEVICE and PLACEMENT_ANY are
// what it is anyway).
absl::Status ApplyConstraints(const v1::PlannerConstraints& constraints,
                              std::vector<TableSpec>* tables);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_MODEL_SPEC_H_
