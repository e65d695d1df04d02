#include "trainer/models/attention_pooling.h"

#include <ATen/core/Tensor.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "trainer/models/architecture.h"

namespace deltastream {

absl::StatusOr<at::Tensor> AttentionPool(const at::Tensor& rows,
                                         const at::Tensor& lengths,
                                         const at::Tensor& queries) {
  if (!rows.defined() || !lengths.defined() || !queries.defined()) {
    return absl::InvalidArgumentError("AttentionPool: undefined input");
  }
  if (rows.dim() != 2 || queries.dim() != 2 || lengths.dim() != 1 ||
      rows.size(1) != queries.size(1) || lengths.size(0) != queries.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttentionPool: want rows [n, D], lengths [B], queries [B, D]; got "
        "rows of ",
        rows.dim(), " dims, lengths of ", lengths.dim(), " dims, queries of ",
        queries.dim(), " dims (or D / B differ)"));
  }
  if (lengths.scalar_type() != at::kInt && lengths.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(
        "AttentionPool: lengths must be int32 or int64");
  }
  if (!at::isFloatingType(queries.scalar_type())) {
    return absl::InvalidArgumentError(
        "AttentionPool: queries must be floating");
  }
  if (rows.device() != queries.device() ||
      lengths.device() != queries.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttentionPool: inputs on different devices (rows ",
                     rows.device().str(), ", lengths ", lengths.device().str(),
                     ", queries ", queries.device().str(), ")"));
  }
  return CatchTorchErrors([&]() -> absl::StatusOr<at::Tensor> {
    const int64_t num_examples = queries.size(0);
    const at::Tensor values = rows.to(queries.scalar_type());  // [n, D]
    // The example of every row. Its size is rows' count, known on the host,
    // so repeat_interleave does not read lengths back.
    const at::Tensor example = at::repeat_interleave(
        lengths.to(at::kLong), c10::optional<int64_t>(values.size(0)));
    const at::Tensor scores =
        (values * queries.index_select(0, example)).sum(1);  // [n]
    // Softmax within each example, shifted by the example's own maximum (a
    // constant per example: it cancels, so it needs no gradient).
    const at::Tensor example_max =
        at::full({num_examples}, -std::numeric_limits<double>::infinity(),
                 scores.options())
            .scatter_reduce(0, example, scores.detach(), "amax",
                            /*include_self=*/true);
    const at::Tensor exp_scores =
        (scores - example_max.index_select(0, example)).exp();
    // Every example with rows has a total >= 1 (its maximum contributes
    // exp(0)); an example without rows is never divided by.
    const at::Tensor totals = at::zeros({num_examples}, exp_scores.options())
                                  .index_add(0, example, exp_scores);
    const at::Tensor weights = exp_scores / totals.index_select(0, example);
    return at::zeros_like(queries).index_add(0, example,
                                             values * weights.unsqueeze(1));
  });
}

}  // namespace deltastream
