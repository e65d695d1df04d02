#include "clients/freshness_window.h"

#include <algorithm>
#include <cmath>

namespace deltastream {

FreshnessWindow::FreshnessWindow(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)) {}

void FreshnessWindow::Add(double ms) {
  if (samples_.size() < capacity_) {
    samples_.push_back(ms);
  } else {
    samples_[next_] = ms;
    next_ = (next_ + 1) % capacity_;
  }
}

double FreshnessWindow::Quantile(double q) const {
  if (samples_.empty()) return 0;
  std::vector<double> sorted = samples_;
  const size_t rank = std::min(
      sorted.size() - 1,
      static_cast<size_t>(std::ceil(q * sorted.size())) - (q > 0 ? 1 : 0));
  std::nth_element(sorted.begin(), sorted.begin() + rank, sorted.end());
  return sorted[rank];
}

double FreshnessWindow::Max() const {
  return samples_.empty() ? 0
                          : *std::max_element(samples_.begin(), samples_.end());
}

}  // namespace deltastream
