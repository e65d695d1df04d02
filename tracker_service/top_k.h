#ifndef DELTASTREAM_TRACKER_SERVICE_TOP_K_H_
#define DELTASTREAM_TRACKER_SERVICE_TOP_K_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"

namespace deltastream {

// How many of a table's changed rows a read keeps: those with the highest
// scores (see Tracker for what a row's score is in each mode).
struct TopK {
  enum class Kind { kPercentage, kCount };
  Kind kind = Kind::kPercentage;
  // A percentage in (0, 100] (rounded up to whole rows, at least one row when
  // any changed), or a count >= 1.
  double value = 100;

  static TopK Percentage(double percent) {
    return {Kind::kPercentage, percent};
  }
  static TopK Count(int64_t rows) {
    return {Kind::kCount, static_cast<double>(rows)};
  }

  // InvalidArgument for a percentage outside (0, 100] or a count below 1 or
  // not whole.
  absl::Status Validate() const;

  // Rows kept out of `rows`.
  int64_t RowsKept(int64_t rows) const;
};

// Positions (int64, ascending) of the RowsKept(scores.numel()) highest of
// `scores` (float [n]); NaN ranks below every number, -inf included. Ties go
// to the lower position, so with rows sorted by
// ID the lower ID wins.
at::Tensor TopKPositions(const at::Tensor& scores, const TopK& top_k);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TOP_K_H_
