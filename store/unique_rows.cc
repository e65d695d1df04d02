#include "store/unique_rows.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_unique2.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>

namespace deltastream {

UniqueRows UniqueRowsOf(const std::vector<at::Tensor>& ids,
                        const std::vector<at::Tensor>& states,
                        UpdateMode mode) {
  at::Tensor all_ids = ids.size() == 1 ? ids[0] : at::cat(ids);
  auto [unique_ids, inverse, counts] =
      at::_unique2(all_ids, /*sorted=*/true, /*return_inverse=*/true,
                   /*return_counts=*/false);
  UniqueRows rows;
  rows.ids = unique_ids;
  if (mode == UpdateMode::kNone) return rows;

  // For every unique ID, the position of its first (or last) occurrence.
  const int64_t n = all_ids.numel();
  at::Tensor positions = at::arange(n, all_ids.options());
  at::Tensor chosen =
      mode == UpdateMode::kFirst
          ? at::full({unique_ids.numel()}, n, all_ids.options())
                .scatter_reduce_(0, inverse, positions, "amin",
                                 /*include_self=*/true)
          : at::full({unique_ids.numel()}, -1, all_ids.options())
                .scatter_reduce_(0, inverse, positions, "amax",
                                 /*include_self=*/true);
  at::Tensor all_states = states.size() == 1 ? states[0] : at::cat(states);
  rows.states = all_states.index_select(0, chosen);
  return rows;
}

}  // namespace deltastream
