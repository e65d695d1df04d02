#include "trainer/planner/cost_estimator.h"

namespace deltastream::planner {
namespace {

constexpr double kIdBytes = 8;
constexpr double kMsPerSecond = 1e3;

}  // namespace

Cost EstimateShardCost(const TableSpec& table, v1::ShardingType type,
                       int64_t shard_rows, int64_t shard_cols,
                       const Topology& topology) {
  Cost cost;
  if (shard_rows == 0 || shard_cols == 0) return cost;
  const double world = topology.world_size;
  const double local = topology.ranks_per_host();
  const double hosts = topology.hosts();
  // Rows are read where the table lives: HBM on GPUs, DDR on CPUs.
  const double mem_bw = topology.gpu ? topology.hbm_bw : topology.ddr_bw;
  const double world_bw = topology.world_comms_bw();
  // Share of an all-to-all's bytes that leave the rank.
  const double remote = (world - 1) / world;

  // One rank's batch: IDs and the embeddings it gets back.
  const double ids =
      static_cast<double>(topology.batch_size) * table.pooling_factor;
  const double outputs = table.pooled
                             ? static_cast<double>(topology.batch_size) *
                                   static_cast<double>(table.num_features)
                             : ids;
  const double row = static_cast<double>(shard_cols * table.element_bytes);

  double lookup_ids = 0;    // IDs this shard looks up per step
  double output_rows = 0;   // rows (pooled or not) it writes
  double input_comms = 0;   // seconds
  double output_comms = 0;  // seconds, forward; the backward mirrors it
  double gather = 0;        // seconds, backward (data-parallel)
  switch (type) {
    case v1::DATA_PARALLEL:
      // As trainer/sharding replicates a table: every rank receives every
      // rank's IDs and looks them all up (so that each applies the same
      // sparse update), keeps its own examples' rows, and all-gathers the
      // output gradients backward. No dense gradient, no all-reduce.
      lookup_ids = ids * world;
      output_rows = outputs * world;
      input_comms = lookup_ids * kIdBytes * remote / world_bw;
      gather = output_rows * row * remote / world_bw;
      break;
    case v1::TABLE_WISE:
    case v1::COLUMN_WISE:
      lookup_ids = ids * world;
      output_rows = outputs * world;
      input_comms = lookup_ids * kIdBytes * remote / world_bw;
      output_comms = output_rows * row * remote / world_bw;
      break;
    case v1::ROW_WISE:
      lookup_ids = ids;
      output_rows = table.pooled ? outputs * world : ids;
      input_comms = lookup_ids * kIdBytes * remote / world_bw;
      // Pooled: a reduce-scatter of partial sums; sequence: an all-to-all.
      output_comms = output_rows * row * remote / world_bw;
      break;
    case v1::TABLE_ROW_WISE:
      lookup_ids = ids * world / local;
      output_rows = outputs * world;
      input_comms = lookup_ids * kIdBytes * remote / world_bw;
      // A reduce-scatter within the host, then an all-to-all across hosts.
      output_comms =
          output_rows * row * (local - 1) / local / topology.intra_host_bw +
          output_rows * row / local * (hosts - 1) / hosts /
              topology.inter_host_bw;
      break;
    default:
      return cost;
  }
  const double compute =
      (lookup_ids * kIdBytes + lookup_ids * row + output_rows * row) / mem_bw +
      lookup_ids * topology.lookup_seconds_per_id;
  cost.fwd_compute = compute * kMsPerSecond;
  cost.bwd_compute = compute * topology.bwd_compute_multiplier * kMsPerSecond;
  cost.fwd_comms = (input_comms + output_comms) * kMsPerSecond;
  cost.bwd_comms = (output_comms + gather) * kMsPerSecond;
  return cost;
}

}  // namespace deltastream::planner
