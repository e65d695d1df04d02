#ifndef DELTASTREAM_TRAINER_PLANNER_SHARDING_OPTION_H_
#define DELTASTREAM_TRAINER_PLANNER_SHARDING_OPTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/plan.pb.h"

namespace deltastream::planner {

// The sparse optimizer of the tables (trainer/optim/sparse_optimizer.h),
// as far as storage is concerned.
enum class OptimizerKind { kSgd, kAdagrad, kRowwiseAdagrad, kAdam };

// One embedding table as the planner sees it, with its constraints.
struct TableSpec {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t element_bytes = 4;  // float 4, double 8 (optimizer states too)
  // IDs per example over all of the table's features (TorchRec's pooling
  // factor summed over the features).
  double pooling_factor = 1;
  int64_t num_features = 1;
  bool pooled = true;  // EmbeddingBagCollection (true) or EmbeddingCollection

  // Constraints. Allowed sharding types; empty: every type that applies.
  std::vector<v1::ShardingType> sharding_types;
  // Column-wise shards are at least this wide (the last may take the rest);
  // 0: the default, kDefaultMinPartition.
  int64_t min_partition = 0;
};

// Column-wise shards are at least this wide unless a table says otherwise.
inline constexpr int64_t kDefaultMinPartition = 32;

// Bytes per rank in the two memory tiers. Tables live on the rank's device
// (the trainer builds every shard there): in HBM on a GPU topology, in DDR on
// a CPU one.
struct Storage {
  int64_t hbm = 0;
  int64_t ddr = 0;

  Storage& operator+=(const Storage& other) {
    hbm += other.hbm;
    ddr += other.ddr;
    return *this;
  }
  bool FitsIn(const Storage& free) const {
    return hbm <= free.hbm && ddr <= free.ddr;
  }
};

// Estimated time of one training step, milliseconds.
struct Cost {
  double fwd_compute = 0;
  double bwd_compute = 0;
  double fwd_comms = 0;
  double bwd_comms = 0;

  double total() const {
    return fwd_compute + bwd_compute + fwd_comms + bwd_comms;
  }
  Cost& operator+=(const Cost& other) {
    fwd_compute += other.fwd_compute;
    bwd_compute += other.bwd_compute;
    fwd_comms += other.fwd_comms;
    bwd_comms += other.bwd_comms;
    return *this;
  }
};

// One rectangular piece of a table and its estimates. `rank` is -1 until a
// partitioner places it (data-parallel and row-wise shards are placed by
// the enumerator: their ranks follow from their position).
struct ShardEstimate {
  int64_t row_offset = 0;
  int64_t rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
  int rank = -1;
  Storage storage;           // weights + optimizer state + I/O buffers
  int64_t input_bytes = 0;   // IDs this shard receives per step
  int64_t output_bytes = 0;  // embeddings it sends per step
  Cost cost;
};

// One way to shard one table (TorchRec's ShardingOption): the type, the
// kernel (DENSE for data-parallel tables, FUSED otherwise: the kernels the
// trainer runs) and every shard with its estimates.
struct ShardingOption {
  int table = 0;  // index into the planner's tables
  v1::ShardingType type = v1::TABLE_WISE;
  v1::ComputeKernel kernel = v1::FUSED;
  std::vector<ShardEstimate> shards;
  Storage total_storage;  // sum over the shards
  double total_cost = 0;  // sum over the shards, ms

  // Recomputes total_storage and total_cost from the shards.
  void Total();
};

// "DATA_PARALLEL", "TABLE_WISE", ... (the proto's names).
absl::string_view ShardingTypeName(v1::ShardingType type);
// Short names for tables of figures: "DP", "TW", "RW", "CW", "TWRW".
absl::string_view ShardingTypeShortName(v1::ShardingType type);
// "FUSED" (also for COMPUTE_KERNEL_UNSPECIFIED), "DENSE", ...
absl::string_view ComputeKernelName(v1::ComputeKernel kernel);

// The sharding types a planner considers, in this order.
inline constexpr v1::ShardingType kShardingTypes[] = {
    v1::DATA_PARALLEL, v1::TABLE_WISE, v1::ROW_WISE, v1::COLUMN_WISE,
    v1::TABLE_ROW_WISE};

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_SHARDING_OPTION_H_
