#ifndef DELTASTREAM_TESTS_BENCH_ZIPF_H_
#define DELTASTREAM_TESTS_BENCH_ZIPF_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace deltastream {

// Draws row IDs in [0, rows) whose popularity follows Zipf(exponent): the k-th
// most popular row is drawn with probability proportional to 1 / k^exponent.
// Popular rows are scattered over the ID space by a fixed bijection, as hashed
// feature values are. Deterministic for a given seed.
class ZipfIds {
 public:
  ZipfIds(int64_t rows, double exponent, uint64_t seed)
      : rows_(rows), cdf_(rows), rng_(seed) {
    double sum = 0;
    for (int64_t k = 0; k < rows; ++k) {
      sum += 1.0 / std::pow(static_cast<double>(k + 1), exponent);
      cdf_[k] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }

  int64_t Next() {
    const double u = uniform_(rng_);
    const int64_t rank = std::min<int64_t>(
        std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
        rows_ - 1);
    // 2654435761 is odd and not a multiple of 5, so it is coprime with row
    // counts made of 2s and 5s (10^k); for other counts collisions only merge
    // a few popular rows.
    return static_cast<int64_t>(
        (static_cast<unsigned __int128>(rank) * 2654435761u) %
        static_cast<uint64_t>(rows_));
  }

 private:
  int64_t rows_;
  std::vector<double> cdf_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_BENCH_ZIPF_H_
