#ifndef DELTASTREAM_TRAINER_CHECKPOINT_H_
#define DELTASTREAM_TRAINER_CHECKPOINT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainer/models/model.h"
#include "trainer/optim/dense_optimizer.h"

namespace deltastream {

// Full checkpoints of a model: every dense parameter, the dense optimizer's
// state, every embedding table and its sparse optimizer state, and the step.
//
// A checkpoint is one file "<dir>/checkpoint-<step, 12 digits>.pt" holding a
// pickled dict of tensors (torch::pickle_save; Python's torch.load reads it):
//   "meta.step", "meta.examples"       int64 scalars
//   "dense.<parameter name>"           the dense module's named parameters
//   "dense_optimizer"                  uint8: the optimizer's own archive
//   "sparse.<module path>.<state>"     EmbeddingModule::StateTensors()
// It is written to a temporary file, flushed to disk and renamed: a crash
// leaves the previous checkpoints intact, never a torn one.
struct CheckpointInfo {
  std::string path;
  int64_t step = 0;
  int64_t examples = 0;
  int64_t bytes = 0;
  absl::Duration elapsed;
};

// Writes a checkpoint of `model` at `step` into `dir` (created if missing)
// and deletes all but the newest `keep`. Internal/PermissionDenied-style
// errors name the path.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(
    const std::string& dir, int64_t step, int64_t examples, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, int64_t keep);

// The newest checkpoint file in `dir`; nullopt when there is none (or no
// dir).
std::optional<std::string> LatestCheckpoint(const std::string& dir);

// The step in a checkpoint file's name ("checkpoint-<step>.pt", any
// directory); nullopt for another name.
std::optional<int64_t> CheckpointStep(const std::string& path);

// Loads a checkpoint into `model` and `dense_optimizer` (on the model's
// device). DataLoss for a file that does not parse; InvalidArgument, naming
// the tensor, when it does not fit the model (another architecture or table
// size); the model may then be partly loaded and must not be used.
absl::StatusOr<CheckpointInfo> LoadCheckpoint(
    const std::string& path, RecModel& model,
    torch::optim::Optimizer& dense_optimizer);

// The tensors of a checkpoint file by key (the layout above). NotFound when
// it cannot be read; DataLoss when it does not parse.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointTensors(
    const std::string& path);

// What a checkpoint holds of the model, read without one: what a predictor's
// replica or a checkpoint chain of the same step must equal.
struct CheckpointModel {
  int64_t step = -1;
  // Embedding tables by CheckpointTableName: "<module path>.<table>".
  std::map<std::string, at::Tensor> tables;
  // Dense parameters by name (as the tracker service publishes them).
  std::map<std::string, at::Tensor> dense;
};
// Errors as ReadCheckpointTensors; DataLoss without a step.
absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path);

// A tracker table FQN ("<module path>.embedding_bags.<table>" or
// ".embeddings.") as a checkpoint names the table: "<module path>.<table>".
std::string CheckpointTableName(absl::string_view fqn);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CHECKPOINT_H_
