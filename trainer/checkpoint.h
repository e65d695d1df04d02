#ifndef DELTASTREAM_TRAINER_CHECKPOINT_H_
#define DELTASTREAM_TRAINER_CHECKPOINT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainer/models/model.h"
#include "trainer/optim/dense_optimizer.h"

namespace deltastream {

class ProcessGroup;

// Named tensors of a checkpoint's gradient scaler (GradientScaler::
// StateTensors()).
using GradientScalerState = std::vector<std::pair<std::string, at::Tensor>>;

// Full checkpoints of a model, sharded or not: every dense parameter, the
// dense optimizer's state, every embedding table and its sparse optimizer
// state, the step and the examples seen (docs/checkpoints.md).
//
// One format for every world size. A checkpoint is a directory
// "<dir>/checkpoint-<step, 12 digits>/" holding
//   rank-<r, 5 digits>-of-<world size, 5 digits>.pt   one per rank
//   manifest.json                                     written last
// Each rank file is a plain pickled dict of tensors that
// torch.load(f, weights_only=True) reads, keyed as TorchRec's state dicts:
//   "<table FQN>.weight"                    this rank's block of a table
//   "fused_optimizer.state.<table FQN>.weight.<table>.<state>"
//                                           its optimizer states ("momentum1",
//                                           "momentum2", "step")
//   "<dense parameter name>"                rank 0's file only
//   "dense_optimizer"                       rank 0's file only: uint8, the
//                                           torch::optim archive
//   "grad_scaler.<name>"                    rank 0's file only, when saved
//                                           with mixed precision's loss
//                                           scaler state ("scale", double;
//                                           "growth_tracker", int64; 0-dim)
// where the table FQN is the delta FQN ("<module path>.embedding_bags.<table>"
// or ".embeddings.<table>"). The manifest (proto/checkpoint_manifest.proto,
// protobuf's JSON mapping) holds the step, examples, world size, each
// module's plan, the files with their sizes, and for every tensor its whole
// shape and which file holds which (row, column) block. Data-parallel tables
// are written once (by the lowest rank holding them), dense parameters and
// the dense optimizer by rank 0.
//
// Files are written to temporary names, flushed and renamed; rank 0 writes
// the manifest the same way after every rank's file is durable. A crash
// leaves either a complete checkpoint or a directory without a (matching)
// manifest, which LatestCheckpoint never returns.
//
// Single-file checkpoints of the format before ("<dir>/checkpoint-<step>.pt",
// keys "meta.step", "dense.<name>", "sparse.<module path>.<table>.<state>")
// are still found, loaded (into any world size and plan) and read.
struct CheckpointInfo {
  std::string path;  // the checkpoint directory (or an old file)
  int64_t step = 0;
  int64_t examples = 0;
  // Saved: every rank's file on rank 0 (this rank's on the others);
  // loaded: the files this rank read.
  int64_t bytes = 0;
  absl::Duration elapsed;
  // Loaded: the gradient scaler's state as saved (GradientScaler::
  // StateTensors' names and CPU tensors, by name); empty when the checkpoint
  // holds none (saved without mixed precision, or before it was saved).
  // Saved: empty.
  GradientScalerState gradient_scaler_state;
};

// Writes a checkpoint of `model` at `step` into `dir` (created if missing)
// and, on rank 0, deletes all complete checkpoints but the newest `keep`
// (at least 1) and incomplete ones of earlier steps.
//
// `group`: the model's process group when it is sharded (null: one process).
// Every rank calls it at the same step: it is a collective (a barrier
// before writing, the files' descriptions through the group's store, one
// all-reduce at the end), so that every rank returns OK only when the
// manifest is durable, and an error on any rank (a full disk, a dead rank:
// the group's timeouts) fails it on every rank, naming the rank. An
// existing checkpoint of the same step is replaced, and is incomplete from
// the start of the call until it returns OK: a crash meanwhile leaves
// neither (the trainer saves a step once). `bytes`: on rank 0 every rank's
// file, on the others their own. `dir` must be one
// directory every rank sees (a shared file system when ranks run on
// several hosts). PermissionDenied / Internal name the path.
//
// `gradient_scaler_state`: mixed precision's loss scaler state
// (GradientScaler::StateTensors(); empty without mixed precision), saved in
// rank 0's file as "grad_scaler.<name>" (every rank passes its own: they are
// equal). InvalidArgument, before anything is written, for an empty or
// repeated name or an undefined tensor.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(
    const std::string& dir, int64_t step, int64_t examples, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, int64_t keep,
    ProcessGroup* group = nullptr,
    const GradientScalerState& gradient_scaler_state = {});

// The newest complete checkpoint in `dir` (a directory whose manifest parses
// and whose rank files all exist with the sizes it lists, or an old
// single-file checkpoint); nullopt when there is none (or no dir). Reads
// manifests only, from the newest down. Internal, naming `dir`, when it
// cannot be listed (an I/O error, a file in its place), and the OS's error
// when a manifest cannot be read (EIO: Unknown): never taken for empty or
// incomplete, which would start a run again from step 0 or an older step.
absl::StatusOr<std::optional<std::string>> LatestCheckpoint(
    const std::string& dir);

// The step in a checkpoint's name ("checkpoint-<step>" or, old,
// "checkpoint-<step>.pt", any directory); nullopt for another name.
std::optional<int64_t> CheckpointStep(const std::string& path);

// Loads a checkpoint (a directory, or an old single file) into `model` and
// `dense_optimizer` (on the model's device), and returns the gradient
// scaler's state it holds (CheckpointInfo::gradient_scaler_state: the
// caller applies it with GradientScaler::LoadStateTensors, which checks
// it). Every rank calls it (no
// collective inside: ranks may load at their own pace; `group` is the
// model's, or null).
//
// Resharding: the model's world size and plans may differ from the
// checkpoint's. Each rank assembles each of its shards, and their optimizer
// states, from the overlapping blocks of the saved files, reading only the
// files it needs (one at a time). Tables and per-element states (Adagrad,
// Adam's moments) reshard exactly; row-wise Adagrad's row states merge
// column blocks by a column-weighted mean (exact) and a column block split
// off a wider one takes the wider one's row state; Adam's per-shard step
// takes the largest step of the blocks it overlaps (docs/checkpoints.md).
//
// DataLoss for a file or manifest that does not parse (or fails its zip
// checksums) or blocks that do not cover a shard; InvalidArgument, naming
// the table or tensor, when the checkpoint does not fit the model (another
// architecture, table size or optimizer); the model may then be partly
// loaded and must not be used.
absl::StatusOr<CheckpointInfo> LoadCheckpoint(
    const std::string& path, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, ProcessGroup* group = nullptr);

// The tensors of one pickled checkpoint file (a rank file, or an old
// single-file checkpoint) by key. The OS's error when it cannot be opened or
// read (absl::ErrnoToStatus: ENOENT NotFound, EIO Unknown); DataLoss when it
// does not parse or fails its zip checksums.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointTensors(
    const std::string& path);

// What a checkpoint holds of the model, read without one, the tables
// assembled whole from every rank's blocks: what a predictor's replica or a
// checkpoint chain of the same step must equal.
struct CheckpointModel {
  int64_t step = -1;
  // Embedding tables by table FQN ("<module path>.embedding_bags.<table>");
  // old single-file checkpoints do not record FQNs: theirs are named
  // "<module path>.<table>" (CheckpointTableName).
  std::map<std::string, at::Tensor> tables;
  // Dense parameters by name (as the tracker service publishes them).
  std::map<std::string, at::Tensor> dense;
};
// Errors as LoadCheckpoint's and ReadCheckpointTensors'.
absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path);

// The one mapping between delta FQNs and checkpoint keys (TorchRec's
// state-dict names): a table's weight is "<fqn>.weight"; its optimizer
// state `state` is "fused_optimizer.state.<fqn>.weight.<table>.<state>"
// (TorchRec's fused optimizer state_dict()["state"][<fqn>.weight]
// [<table>.<state>], flattened).
std::string CheckpointTableKey(absl::string_view fqn);
std::string CheckpointOptimizerStateKey(absl::string_view fqn,
                                        absl::string_view state);
// The FQN of a table weight's key; nullopt for another key.
std::optional<std::string> TableFqnOfCheckpointKey(absl::string_view key);

// A table FQN as old single-file checkpoints named the table:
// "<module path>.<table>".
std::string CheckpointTableName(absl::string_view fqn);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CHECKPOINT_H_
