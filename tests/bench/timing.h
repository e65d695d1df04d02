#ifndef DELTASTREAM_TESTS_BENCH_TIMING_H_
#define DELTASTREAM_TESTS_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace deltastream::bench {

using Clock = std::chrono::steady_clock;

// Seconds since `since`.
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The median of `values` (not empty): what the benchmarks report.
inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace deltastream::bench

#endif  // DELTASTREAM_TESTS_BENCH_TIMING_H_
