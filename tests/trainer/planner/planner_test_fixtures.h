// Shared helpers of the planner tests: a gibibyte and a table spec of a
// name and shape (the rest of TableSpec left at its defaults).
#ifndef DELTASTREAM_TESTS_TRAINER_PLANNER_PLANNER_TEST_FIXTURES_H_
#define DELTASTREAM_TESTS_TRAINER_PLANNER_PLANNER_TEST_FIXTURES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "trainer/planner/sharding_option.h"

namespace deltastream::planner {

inline constexpr int64_t kGib = int64_t{1} << 30;

inline TableSpec Table(std::string name, int64_t rows, int64_t dim) {
  TableSpec table;
  table.name = std::move(name);
  table.rows = rows;
  table.dim = dim;
  return table;
}

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TESTS_TRAINER_PLANNER_PLANNER_TEST_FIXTURES_H_
