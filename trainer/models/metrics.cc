#include "trainer/models/metrics.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/isnan.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace deltastream {

at::Tensor BinaryCrossEntropyWithLogits(const at::Tensor& logits,
                                        const at::Tensor& labels) {
  return at::binary_cross_entropy_with_logits(logits,
                                              labels.to(logits.scalar_type()));
}

double Auc(const at::Tensor& scores, const at::Tensor& labels) {
  at::Tensor s = scores.detach().to(at::kCPU, at::kDouble).contiguous();
  at::Tensor l = labels.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t n = s.numel();
  // Outside the contract: no meaningful AUC (and NaN would break the sort's
  // ordering).
  if (l.numel() != n || at::isnan(s).any().item<bool>()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double* score = s.data_ptr<double>();
  const double* label = l.data_ptr<double>();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return score[a] < score[b]; });
  // Sum of the positives' ranks (1-based, ties sharing their average rank).
  double positive_rank_sum = 0;
  int64_t positives = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && score[order[j]] == score[order[i]]) ++j;
    const double average_rank = (i + 1 + j) / 2.0;
    for (int64_t k = i; k < j; ++k) {
      if (label[order[k]] > 0.5) {
        positive_rank_sum += average_rank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_rank_sum - positives * (positives + 1) / 2.0) /
         (static_cast<double>(positives) * negatives);
}

}  // namespace deltastream
