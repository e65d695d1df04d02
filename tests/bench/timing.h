#ifndef DELTASTREAM_TESTS_BENCH_TIMING_H_
#define DELTASTREAM_TESTS_BENCH_TIMING_H_

#include <stdlib.h>  // getloadavg

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
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

// The machine's 1, 5 and 15 minute load averages, "1.20 1.35 1.50" ("? ? ?"
// when unknown): what the benchmarks print beside their figures.
inline std::string LoadAverage() {
  double load[3];
  if (getloadavg(load, 3) != 3) return "? ? ?";
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %.2f %.2f", load[0], load[1],
                load[2]);
  return text;
}

}  // namespace deltastream::bench

#endif  // DELTASTREAM_TESTS_BENCH_TIMING_H_
