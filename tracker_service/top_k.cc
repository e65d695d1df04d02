#include "tracker_service/top_k.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace deltastream {

absl::Status TopK::Validate() const {
  if (kind == Kind::kPercentage) {
    if (!(percentage > 0 && percentage <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "top-k percentage must be in (0, 100], got ", percentage));
    }
    return absl::OkStatus();
  }
  if (count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k count must be >= 1, got ", count));
  }
  return absl::OkStatus();
}

int64_t TopK::RowsKept(int64_t rows) const {
  if (rows == 0) return 0;
  if (kind == Kind::kCount) return std::min(rows, count);
  const auto kept = static_cast<int64_t>(
      std::ceil(static_cast<double>(rows) * percentage / 100.0 - 1e-9));
  return std::clamp<int64_t>(kept, 1, rows);
}

at::Tensor TopKPositions(const at::Tensor& scores, const TopK& top_k) {
  const int64_t kept = top_k.RowsKept(scores.numel());
  if (kept == scores.numel()) {
    return at::arange(scores.numel(), scores.options().dtype(at::kLong));
  }
  // A stable descending sort keeps equal scores in position order. LibTorch
  // sorts NaN above every number; here a NaN score (a row whose value is not
  // finite) ranks below every number, -inf included, so that it never wins:
  // NaN sorts as -inf, then a stable sort moves the NaN rows behind the rest.
  const at::Tensor nan = scores.isnan();
  at::Tensor order = std::get<1>(
      scores.masked_fill(nan, -std::numeric_limits<double>::infinity())
          .sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor nan_last =
      std::get<1>(nan.index_select(0, order).to(at::kByte).sort(
          /*stable=*/true, /*dim=*/0, /*descending=*/false));
  order = order.index_select(0, nan_last);
  return std::get<0>(order.narrow(0, 0, kept).sort());
}

}  // namespace deltastream
