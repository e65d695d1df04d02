#include "trainer/planner/storage_estimator.h"

#include <algorithm>
#include <cmath>

namespace deltastream::planner {
namespace {

constexpr int64_t kIdBytes = 8;  // int64 IDs
// TorchRec's HeuristicalStorageReservation multiplies the KJT by 20.
constexpr int64_t kKjtMultiplier = 20;

// Estimates beyond 2^53 bytes (8 PiB, more than any rank holds) are
// 2^53: the conversion stays defined and sums of estimates stay in int64.
constexpr double kMaxBytes = 9007199254740992.0;

int64_t Ceil(double bytes) {
  return static_cast<int64_t>(bytes < kMaxBytes ? std::ceil(bytes) : kMaxBytes);
}

}  // namespace

int64_t OptimizerStateBytes(int64_t rows, int64_t cols, int64_t element_bytes,
                            OptimizerKind optimizer) {
  switch (optimizer) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return rows * cols * element_bytes;
    case OptimizerKind::kRowwiseAdagrad:
      return rows * element_bytes;
    case OptimizerKind::kAdam:
      return 2 * rows * cols * element_bytes;
  }
  return 0;
}

int64_t ShardTensorBytes(int64_t rows, int64_t cols, int64_t element_bytes,
                         OptimizerKind optimizer) {
  return rows * cols * element_bytes +
         OptimizerStateBytes(rows, cols, element_bytes, optimizer);
}

ShardIo EstimateShardIo(const TableSpec& table, v1::ShardingType type,
                        int64_t shard_rows, int64_t shard_cols,
                        const Topology& topology) {
  ShardIo io;
  if (shard_rows == 0 || shard_cols == 0) return io;
  const double batch = static_cast<double>(topology.batch_size);
  const double world = topology.world_size;
  // IDs of one rank's batch, and the embeddings one rank's batch gets back.
  const double ids = batch * table.pooling_factor;
  const double outputs =
      table.pooled ? batch * static_cast<double>(table.num_features) : ids;
  const double out_row = static_cast<double>(shard_cols * table.element_bytes);
  switch (type) {
    case v1::DATA_PARALLEL:  // trainer/sharding looks up every rank's IDs
    case v1::TABLE_WISE:
    case v1::COLUMN_WISE:
      // Every rank's IDs; every rank's outputs.
      io.input_bytes = Ceil(ids * world * kIdBytes);
      io.output_bytes = Ceil(outputs * world * out_row);
      break;
    case v1::ROW_WISE:
    case v1::TABLE_ROW_WISE: {
      // The IDs that fall in its rows (an even share); pooled: a partial
      // sum for every example of every rank, sequence: a row per ID.
      const double blocks =
          type == v1::ROW_WISE ? world : topology.ranks_per_host();
      io.input_bytes = Ceil(ids * world / blocks * kIdBytes);
      io.output_bytes = table.pooled ? Ceil(outputs * world * out_row)
                                     : Ceil(ids * world / blocks * out_row);
      break;
    }
    default:
      break;
  }
  return io;
}

Storage EstimateShardStorage(int64_t tensor_bytes, const ShardIo& io,
                             const Topology& topology) {
  const int64_t bytes = tensor_bytes + io.input_bytes + io.output_bytes;
  return topology.gpu ? Storage{bytes, 0} : Storage{0, bytes};
}

StorageReservation ReserveStorage(const Topology& topology,
                                  absl::Span<const TableSpec> tables,
                                  int64_t dense_parameter_bytes,
                                  int dense_state_copies) {
  StorageReservation reservation;
  const Storage capacity = topology.capacity();
  reservation.percent.hbm = Ceil(static_cast<double>(capacity.hbm) *
                                 topology.storage_reserve_percent);
  reservation.percent.ddr = Ceil(static_cast<double>(capacity.ddr) *
                                 topology.storage_reserve_percent);
  reservation.dense = dense_parameter_bytes * dense_state_copies;
  double ids = 0;
  for (const TableSpec& table : tables) {
    ids += static_cast<double>(topology.batch_size) * table.pooling_factor;
  }
  reservation.kjt = Ceil(ids * kIdBytes) * kKjtMultiplier;
  reservation.total = reservation.percent;
  if (topology.gpu) {
    reservation.total.hbm += reservation.dense + reservation.kjt;
  } else {
    reservation.total.ddr += reservation.dense + reservation.kjt;
  }
  return reservation;
}

Storage UsableStorage(const Topology& topology,
                      const StorageReservation& reservation) {
  const Storage capacity = topology.capacity();
  return Storage{std::max<int64_t>(0, capacity.hbm - reservation.total.hbm),
                 std::max<int64_t>(0, capacity.ddr - reservation.total.ddr)};
}

}  // namespace deltastream::planner
