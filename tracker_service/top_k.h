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
  // kPercentage: in (0, 100], rounded up to whole rows, at least one row
  // when any changed.
  double percentage = 100;
  // kCount: >= 1, any int64 (the wire's).
  int64_t count = 0;

  static TopK Percentage(double percent) {
    return {Kind::kPercentage, percent, 0};
  }
  static TopK Count(int64_t rows) { return {Kind::kCount, 0, rows}; }

  // InvalidArgument for a percentage outside (0, 100] or a count below 1.
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
