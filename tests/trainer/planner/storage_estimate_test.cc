// The storage estimator against what the embedding modules of
// trainer/modules allocate on the CPU: for every shard the planner proposes
// for a table, a module holding one table of the shard's size (weights and
// its fused optimizer's states, tensor nbytes) is within 10% of the
// estimate's tensor part (weights + optimizer state; the I/O buffers are
// per-step allocations the modules do not hold).
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "trainer/modules/embedding_modules.h"
#include "trainer/planner/enumerator.h"
#include "trainer/planner/storage_estimator.h"

namespace deltastream::planner {
namespace {

struct Optimizers {
  SparseOptimizerType module;
  OptimizerKind planner;
};

// Bytes of the weights and optimizer states a module allocates for one
// rows x cols table.
int64_t AllocatedBytes(bool pooled, int64_t rows, int64_t cols,
                       c10::ScalarType dtype, SparseOptimizerType optimizer) {
  EmbeddingModuleOptions options;
  options.path = "sparse";
  EmbeddingTableConfig table;
  table.name = "shard";
  table.num_embeddings = rows;
  table.embedding_dim = cols;
  table.feature_names = {"f"};
  table.dtype = dtype;
  options.tables = {table};
  options.optimizer.type = optimizer;
  std::unique_ptr<EmbeddingModule> module;
  if (pooled) {
    module = *EmbeddingBagCollection::Create(options);
  } else {
    module = *EmbeddingCollection::Create(options);
  }
  int64_t bytes = 0;
  for (const auto& [name, tensor] : module->StateTensors()) {
    // "step" is Adam's counter, a scalar made for checkpoints.
    if (name == "shard.step") continue;
    bytes += static_cast<int64_t>(tensor.nbytes());
  }
  return bytes;
}

TEST(StorageEstimate, WithinTenPercentOfWhatTheModulesAllocate) {
  const Optimizers optimizers[] = {
      {SparseOptimizerType::kSgd, OptimizerKind::kSgd},
      {SparseOptimizerType::kAdagrad, OptimizerKind::kAdagrad},
      {SparseOptimizerType::kRowwiseAdagrad, OptimizerKind::kRowwiseAdagrad},
      {SparseOptimizerType::kAdam, OptimizerKind::kAdam}};
  Topology topology = DefaultTopology(4, false);
  topology.local_world_size = 2;
  topology.ddr_bytes = int64_t{8} << 30;
  for (bool pooled : {true, false}) {
    for (c10::ScalarType dtype : {c10::kFloat, c10::kDouble}) {
      TableSpec table;
      table.name = "t";
      table.rows = 10007;
      table.dim = 96;
      table.pooled = pooled;
      table.element_bytes = dtype == c10::kFloat ? 4 : 8;
      for (const Optimizers& optimizer : optimizers) {
        absl::StatusOr<std::vector<std::vector<ShardingOption>>> options =
            EnumerateOptions({table}, optimizer.planner, topology);
        ASSERT_TRUE(options.ok());
        for (const ShardingOption& option : (*options)[0]) {
          for (const ShardEstimate& shard : option.shards) {
            if (shard.rows == 0) continue;
            const int64_t estimate =
                shard.storage.ddr - shard.input_bytes - shard.output_bytes;
            EXPECT_EQ(estimate,
                      ShardTensorBytes(shard.rows, shard.cols,
                                       table.element_bytes, optimizer.planner));
            const int64_t allocated = AllocatedBytes(
                pooled, shard.rows, shard.cols, dtype, optimizer.module);
            EXPECT_LE(std::abs(estimate - allocated), allocated / 10)
                << ShardingTypeName(option.type) << " " << shard.rows << "x"
                << shard.cols << " optimizer "
                << static_cast<int>(optimizer.planner) << ": estimate "
                << estimate << ", allocated " << allocated;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deltastream::planner
