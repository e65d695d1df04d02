#include "trainer/cut_agreement.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace deltastream {

absl::StatusOr<int> ServeAgreedCuts(StepCuts& cuts, ProcessGroup& group,
                                    absl::Duration hold_limit) {
  constexpr int64_t k = StepCuts::kMaxPerBoundary;
  const std::vector<int64_t> waiting = cuts.Waiting();
  at::Tensor mine = at::zeros({k}, at::kLong);  // 0: no cut
  for (size_t i = 0; i < waiting.size(); ++i) {
    mine[static_cast<int64_t>(i)] = waiting[i];
  }
  const at::TensorOptions on_device =
      at::TensorOptions().dtype(at::kLong).device(group.device());
  at::Tensor everyone = at::empty({group.world_size() * k}, on_device);
  if (absl::Status status =
          group.AllGather(mine.to(group.device()), everyone, "cuts.agree");
      !status.ok()) {
    return status;
  }
  if (waiting.empty()) return 0;
  // How many ranks wait for each of this rank's cuts (ids are unique
  // within a rank's list).
  const at::Tensor all = everyone.cpu();
  const int64_t* ids = all.data_ptr<int64_t>();
  absl::flat_hash_map<int64_t, int> ranks_waiting;
  for (int64_t cut : waiting) ranks_waiting[cut] = 0;
  for (int64_t i = 0; i < all.numel(); ++i) {
    auto it = ranks_waiting.find(ids[i]);
    if (it != ranks_waiting.end()) ++it->second;
  }
  std::vector<int64_t> agreed;
  for (int64_t cut : waiting) {
    if (ranks_waiting[cut] == group.world_size()) agreed.push_back(cut);
  }
  if (agreed.empty()) return 0;
  return cuts.Serve(agreed, absl::Now() + hold_limit);
}

}  // namespace deltastream
