#ifndef DELTASTREAM_TRAINER_PLANNER_COST_ESTIMATOR_H_
#define DELTASTREAM_TRAINER_PLANNER_COST_ESTIMATOR_H_

#include <cstdint>

#include "trainer/planner/sharding_option.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// The estimated step time of one shard, ms, split as TorchRec's perf model
// splits it: forward and backward compute (bytes a lookup moves through
// memory over the memory bandwidth of the rank's device: HBM on GPUs, DDR
// on CPUs) and communication (bytes the
// shard's input and output distribution move across ranks over the link's
// bandwidth). docs/planner.md gives the formulas. A shard with no rows or
// columns costs nothing. Pure: safe from any thread.
Cost EstimateShardCost(const TableSpec& table, v1::ShardingType type,
                       int64_t shard_rows, int64_t shard_cols,
                       const Topology& topology);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_COST_ESTIMATOR_H_
