#ifndef DELTASTREAM_TRAINER_PLANNER_STORAGE_ESTIMATOR_H_
#define DELTASTREAM_TRAINER_PLANNER_STORAGE_ESTIMATOR_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// Storage estimates (TorchRec's calculate_shard_storages and
// HeuristicalStorageReservation). Pure functions of their arguments: safe
// from any thread. docs/planner.md explains the model.

// Bytes of the optimizer's state for a rows x cols shard: SGD none, Adagrad
// one value per element, row-wise Adagrad one per row, Adam two per element
// (each in the table's element type), as trainer/modules allocates them.
int64_t OptimizerStateBytes(int64_t rows, int64_t cols, int64_t element_bytes,
                            OptimizerKind optimizer);

// Weights plus optimizer state of a rows x cols shard: what the embedding
// modules allocate for it.
int64_t ShardTensorBytes(int64_t rows, int64_t cols, int64_t element_bytes,
                         OptimizerKind optimizer);

// The I/O buffers of one shard per step: the IDs it receives (int64) and
// the embeddings it sends, from the batch size, the world size and the
// table's pooling factor. A shard with no rows or columns has none.
struct ShardIo {
  int64_t input_bytes = 0;
  int64_t output_bytes = 0;
};
ShardIo EstimateShardIo(const TableSpec& table, v1::ShardingType type,
                        int64_t shard_rows, int64_t shard_cols,
                        const Topology& topology);

// A shard's storage per tier: tensors (ShardTensorBytes) plus I/O buffers,
// all on the rank's device (the trainer builds every shard there): HBM on
// GPUs, DDR on CPUs.
Storage EstimateShardStorage(int64_t tensor_bytes, const ShardIo& io,
                             const Topology& topology);

// What every rank keeps back from the planner, per tier.
struct StorageReservation {
  Storage percent;    // storage_reserve_percent of the capacity
  int64_t dense = 0;  // dense parameters, their gradients and optimizer
  int64_t kjt = 0;    // input KJTs (TorchRec's heuristic: 20 x the IDs)
  Storage total;      // the three together (dense and KJT on the device)
};

// Reserves, per rank, the percentage of each tier and, on the compute
// device (HBM on GPUs, DDR on CPUs), the dense parameters (weights,
// gradients and optimizer state: `dense_state_copies` copies of
// `dense_parameter_bytes`) and the KJT buffers of one step.
StorageReservation ReserveStorage(const Topology& topology,
                                  absl::Span<const TableSpec> tables,
                                  int64_t dense_parameter_bytes,
                                  int dense_state_copies);

// A rank's capacity left to the tables: capacity minus reservation, never
// below zero.
Storage UsableStorage(const Topology& topology,
                      const StorageReservation& reservation);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_STORAGE_ESTIMATOR_H_
