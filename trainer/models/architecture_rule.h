#ifndef DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_RULE_H_
#define DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_RULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace deltastream {

// The shape rule of the models' dense and embedding parts, without LibTorch:
// every model's Create checks it before it builds anything, and so do the
// trainer's config resolution (ResolveTrainerConfig) and the planner
// (ModelSpecFromConfig), so that a config no model would build is refused
// first, in one way.

// One embedding table as the rule sees it.
struct TableShape {
  std::string name;
  int64_t dim = 0;
};

// InvalidArgument unless num_dense >= 1, both archs are non-empty with
// positive widths, over_arch ends in 1, there are tables, and every table's
// dim is dense_arch's last width (DLRM's interaction, the sequence model's
// query).
absl::Status ValidateArchitecture(int64_t num_dense,
                                  const std::vector<int64_t>& dense_arch,
                                  const std::vector<int64_t>& over_arch,
                                  const std::vector<TableShape>& tables);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_RULE_H_
