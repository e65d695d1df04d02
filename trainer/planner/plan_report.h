#ifndef DELTASTREAM_TRAINER_PLANNER_PLAN_REPORT_H_
#define DELTASTREAM_TRAINER_PLANNER_PLAN_REPORT_H_

#include <string>

#include "absl/types/span.h"
#include "trainer/planner/planner.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// The plan's statistics as TorchRec's planner prints them, as aligned
// tables: per rank the memory used (and % of capacity), the estimated cost
// (forward and backward compute and comms), input and output sizes and the
// shards by type; per table its choice and estimates; the imbalance (max /
// mean cost). Ends with a newline.
std::string FormatPlanReport(const Plan& plan,
                             absl::Span<const TableSpec> tables,
                             const Topology& topology);

// The same figures as one JSON object:
//   {"world_size", "local_world_size", "gpu", "batch_size", "proposer",
//    "partitioner", "proposals", "max_cost_ms", "mean_cost_ms", "imbalance",
//    "reserved": {"hbm_bytes", "ddr_bytes", "dense_bytes", "kjt_bytes"},
//    "ranks": [{"rank", "hbm_bytes", "ddr_bytes", "hbm_capacity_bytes",
//               "ddr_capacity_bytes", "hbm_percent", "ddr_percent",
//               "cost_ms", "fwd_compute_ms", "bwd_compute_ms",
//               "fwd_comms_ms", "bwd_comms_ms", "input_bytes",
//               "output_bytes", "shards": {"TW": n, ...}}],
//    "tables": [{"table", "rows", "dim", "sharding_type", "compute_kernel",
//                "ranks": [..], "hbm_bytes", "ddr_bytes", "cost_ms"}]}
std::string FormatPlanJson(const Plan& plan, absl::Span<const TableSpec> tables,
                           const Topology& topology);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_PLAN_REPORT_H_
