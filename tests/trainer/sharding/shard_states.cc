#include "tests/trainer/sharding/shard_states.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace testing {

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.sizes().equals(b.sizes())) {
    return 1e30;
  }
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor ShardSlice(const at::Tensor& unsharded,
                      const EmbeddingShard& shard) {
  at::Tensor part = unsharded;
  if (part.dim() == 2) {
    part = part.narrow(0, shard.row_offset, shard.rows);
    if (part.size(1) != 1) part = part.narrow(1, shard.col_offset, shard.cols);
  } else if (part.dim() == 1 && part.numel() > 1) {
    part = part.narrow(0, shard.row_offset, shard.rows);
  }
  return part;
}

absl::StatusOr<std::vector<ShardStateDiff>> ShardStateDiffs(
    const EmbeddingModule& unsharded, const ShardedEmbeddingModule& sharded,
    bool with_step) {
  std::map<std::string, at::Tensor> whole, local;
  for (const auto& [name, tensor] : unsharded.StateTensors()) {
    whole[name] = tensor;
  }
  for (const auto& [name, tensor] : sharded.LocalStateTensors()) {
    local[name] = tensor;
  }
  std::vector<ShardStateDiff> diffs;
  for (const EmbeddingShard& shard : sharded.local_shards()) {
    for (const char* state : {"weight", "momentum1", "momentum2", "step"}) {
      const std::string name = absl::StrCat(shard.table, ".", state);
      auto want = whole.find(name);
      if (want == whole.end()) continue;
      auto got = local.find(name);
      if (got == local.end()) {
        return absl::NotFoundError(
            absl::StrCat("the shard of ", shard.table, " has no ", name));
      }
      if (!with_step && std::string(state) == "step") continue;
      diffs.push_back(
          {name, MaxDiff(got->second, ShardSlice(want->second, shard))});
    }
  }
  return diffs;
}

}  // namespace testing
}  // namespace deltastream
