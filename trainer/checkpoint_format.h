#ifndef DELTASTREAM_TRAINER_CHECKPOINT_FORMAT_H_
#define DELTASTREAM_TRAINER_CHECKPOINT_FORMAT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/checkpoint_manifest.pb.h"

namespace deltastream {

// The on-disk pieces of trainer checkpoints (trainer/checkpoint.h describes
// the format): names, pickled rank files, manifests. Stateless functions,
// safe to call from any thread.

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr char kCheckpointManifestName[] = "manifest.json";

// "checkpoint-<step, 12 digits>" (a directory) and, old, ".pt" (a file).
std::string CheckpointDirName(int64_t step);
std::string LegacyCheckpointFileName(int64_t step);
// "rank-<rank, 5 digits>-of-<world size, 5 digits>.pt".
std::string CheckpointRankFileName(int rank, int world_size);

// The bytes of a file torch.load(f, weights_only=True) reads as a plain
// dict {key: tensor} (torch.save's zip container; the pickle names no
// global but torch._utils._rebuild_tensor_v2, collections.OrderedDict and
// torch.*Storage). Tensors are copied to the host. Internal on a LibTorch
// error.
absl::StatusOr<std::string> PickleTensorDict(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// "float32", "int64", "uint8", ... (numpy's names), for manifests.
std::string DtypeName(const at::Tensor& tensor);

// Writes `manifest` as JSON into "<checkpoint dir>/manifest.json", durably.
absl::Status WriteCheckpointManifest(const std::string& checkpoint_dir,
                                     const v1::CheckpointManifest& manifest);
// Reads and parses it. NotFound without one; DataLoss when it does not
// parse or is not a manifest of a version this code reads; the OS's error
// when it cannot be read (absl::ErrnoToStatus: EIO Unknown).
absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const std::string& checkpoint_dir);
// OK when every file the manifest lists exists with its size; DataLoss
// naming the first that does not; the OS's error when one cannot be looked
// at (EIO).
absl::Status CheckCheckpointFiles(const std::string& checkpoint_dir,
                                  const v1::CheckpointManifest& manifest);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CHECKPOINT_FORMAT_H_
