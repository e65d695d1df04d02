#ifndef DELTASTREAM_CLIENTS_FRESHNESS_WINDOW_H_
#define DELTASTREAM_CLIENTS_FRESHNESS_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deltastream {

// The last `capacity` freshness samples of a consumer (milliseconds from a
// change's batch closing to its apply), with their quantiles. Once full, a
// new sample replaces the oldest.
//
// Not thread-safe: its owner locks around it.
class FreshnessWindow {
 public:
  // The predictor keeps the last 10,000 samples.
  static constexpr size_t kDefaultCapacity = 10000;

  // `capacity` >= 1.
  explicit FreshnessWindow(size_t capacity = kDefaultCapacity);

  void Add(double ms);
  // The q-quantile (q in [0, 1], nearest rank) of the samples held; 0
  // without any.
  double Quantile(double q) const;
  // The largest sample held; 0 without any.
  double Max() const;
  // Samples held: at most the capacity.
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }

 private:
  const size_t capacity_;
  std::vector<double> samples_;
  size_t next_ = 0;  // once full: the oldest sample, replaced next
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_FRESHNESS_WINDOW_H_
