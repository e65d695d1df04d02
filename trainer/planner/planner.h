#ifndef DELTASTREAM_TRAINER_PLANNER_PLANNER_H_
#define DELTASTREAM_TRAINER_PLANNER_PLANNER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/plan.pb.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/storage_estimator.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// The most memory bins per rank of the dynamic-programming proposer (10 times
// the default): its states take 32 bytes per bin of the whole world, so
// kMaxWorldSize ranks of these stay near 128 MiB (docs/planner.md).
inline constexpr int kMaxDpBinsPerDevice = 1000;

// The one check of that bound: OK when `bins` is in [1, kMaxDpBinsPerDevice];
// otherwise InvalidArgument, one line that starts with `what` (MakePlan's
// "dp_bins_per_device", the planner CLI's "--dp_bins_per_device") and says
// the range and the value. For callers that must refuse it before planning
// (the CLI, before it reads anything).
absl::Status ValidateDpBinsPerDevice(absl::string_view what, int bins);

struct PlannerOptions {
  // Proposers to run, in order: "dp", "greedy", "uniform".
  std::vector<std::string> proposers = {"dp", "greedy", "uniform"};
  // Memory bins per rank of the dynamic-programming proposer, in
  // [1, kMaxDpBinsPerDevice].
  int dp_bins_per_device = 100;
  // Proposals partitioned per proposer at most (proposals whose lower
  // bound cannot beat the best plan so far are skipped without counting).
  int max_proposals = 2000;
};

// One rank's figures in a plan.
struct RankStats {
  Storage capacity;  // the rank's memory
  Storage reserved;  // kept back (StorageReservation::total)
  Storage used;      // by the plan's shards
  Cost cost;         // sum over its shards, ms per step
  int64_t input_bytes = 0;
  int64_t output_bytes = 0;
  std::map<v1::ShardingType, int> shards;  // shards by type
};

// The best plan found (Plan::max_cost the smallest of all proposals).
struct Plan {
  // Per table in the planner's order: the chosen option, every shard with
  // its rank.
  std::vector<ShardingOption> options;
  std::vector<RankStats> ranks;
  std::string proposer;     // which proposer proposed it
  std::string partitioner;  // "greedy" or "memory_balanced"
  double max_cost = 0;      // the most expensive rank, ms per step
  double mean_cost = 0;     // mean over the ranks
  int proposals = 0;        // proposals partitioned, all proposers
  StorageReservation reservation;
  Storage usable;  // per rank, for the tables

  // max / mean cost (1: perfectly balanced; 0 without cost).
  double imbalance() const { return mean_cost > 0 ? max_cost / mean_cost : 0; }
};

// Plans `tables` (names unique) on `topology` (TorchRec's
// EmbeddingShardingPlanner.plan): enumerates the options, runs every
// proposer, partitions each proposal (greedy by cost, then memory-balanced
// when that fails) and returns the plan with the lowest max-rank cost.
// Proposals whose total cost over the world size (a lower bound of their
// max-rank cost) cannot beat the best plan so far are not partitioned; the
// proposals of proposers that ignore feedback (dp, uniform) are partitioned
// in order of that bound, so that the search stops at the first that
// cannot win.
//
// Errors: InvalidArgument for a bad topology, table or option (or
// dp_bins_per_device outside [1, kMaxDpBinsPerDevice]); when no
// proposal fits, ResourceExhausted whose message names the tables that
// cannot be placed, the bytes missing on which rank and what would make it
// fit (more ranks, a smaller batch, fewer constraints, a smaller
// reservation), one item per line. Pure: safe from any thread.
absl::StatusOr<Plan> MakePlan(absl::Span<const TableSpec> tables,
                              OptimizerKind optimizer, const Topology& topology,
                              const StorageReservation& reservation,
                              const PlannerOptions& options = {});

// The plan file the trainer's --plan reads.
v1::ShardingPlan ToProto(const Plan& plan, absl::Span<const TableSpec> tables,
                         const Topology& topology);

// Checks a plan against the tables it is for: every table exactly once
// with its shape and a kernel the trainer runs (FUSED, DENSE or unset);
// DATA_PARALLEL with the whole table on every rank once; otherwise shards
// inside the table, not overlapping, covering every row and column; ranks
// in [0, world_size), no rank holding two shards of one table (the
// trainer's rule); and, when `usable` is given, no rank's shards
// (Shard.hbm_bytes, Shard.ddr_bytes) over it. InvalidArgument naming the
// table and what is wrong.
absl::Status ValidatePlan(const v1::ShardingPlan& plan,
                          absl::Span<const TableSpec> tables,
                          const Storage* usable = nullptr);

// The estimated cost of every rank under any plan for `tables` (the
// planner's, or one written by hand or by trainer/sharding's helpers):
// EstimateShardCost of each shard of rows and columns > 0 with the table's
// sharding type, summed per rank.
// Element r is rank r's cost; the plan's figure of merit is the largest.
// InvalidArgument when ValidatePlan refuses the plan or its world size is
// not the topology's. Pure: safe from any thread.
absl::StatusOr<std::vector<Cost>> EstimateRankCosts(
    const v1::ShardingPlan& plan, absl::Span<const TableSpec> tables,
    const Topology& topology);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_PLANNER_H_
