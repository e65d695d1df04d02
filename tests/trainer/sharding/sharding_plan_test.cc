// Plan layouts (TorchRec's), validation errors naming the table, and the
// text-format file round trip; a one-rank sharded module equal to the
// unsharded one.
#include "trainer/sharding/sharding_plan.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/testing/test_dirs.h"
#include "tests/trainer/sharding/table_configs.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {
namespace {

using ::deltastream::testing::Table;
using ::testing::HasSubstr;

std::vector<EmbeddingTableConfig> Tables() {
  return {Table("a", 10, 4, {"f1"}), Table("b", 7, 3, {"f2"})};
}

std::string TempPath(const std::string& name) {
  return TestTempDir() + "/" + name;
}

TEST(ShardingPlanTest, RowWiseBlocksAreCeilDivWithTheLastSmallerOrEmpty) {
  v1::TablePlan plan = RowWisePlan(Table("a", 5, 4, {"f"}), 4);
  ASSERT_EQ(plan.shards_size(), 4);
  std::vector<int64_t> offsets, rows;
  for (const v1::Shard& s : plan.shards()) {
    offsets.push_back(s.row_offset());
    rows.push_back(s.rows());
    EXPECT_EQ(s.cols(), 4);
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(rows, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_TRUE(ValidateShardingPlan(
                  [&] {
                    v1::ShardingPlan p;
                    p.set_world_size(4);
                    *p.add_tables() = plan;
                    return p;
                  }(),
                  {Table("a", 5, 4, {"f"})}, 4, true)
                  .ok());
}

TEST(ShardingPlanTest, DefaultIsTableWiseRoundRobin) {
  v1::ShardingPlan plan = DefaultShardingPlan(Tables(), 2);
  ASSERT_EQ(plan.tables_size(), 2);
  EXPECT_EQ(plan.tables(0).sharding_type(), v1::TABLE_WISE);
  EXPECT_EQ(plan.tables(0).shards(0).rank(), 0);
  EXPECT_EQ(plan.tables(1).shards(0).rank(), 1);
  EXPECT_TRUE(ValidateShardingPlan(plan, Tables(), 2, false).ok());
}

TEST(ShardingPlanTest, ValidationNamesWhatIsWrong) {
  v1::ShardingPlan plan = DefaultShardingPlan(Tables(), 2);
  EXPECT_THAT(ValidateShardingPlan(plan, Tables(), 4, true).message(),
              HasSubstr("world size 2"));
  v1::ShardingPlan missing = plan;
  missing.mutable_tables()->RemoveLast();
  EXPECT_THAT(ValidateShardingPlan(missing, Tables(), 2, true).message(),
              HasSubstr("no entry for table 'b'"));
  v1::ShardingPlan gap = plan;
  *gap.mutable_tables(0) = RowWisePlan(Tables()[0], 2);
  gap.mutable_tables(0)->mutable_shards(1)->set_rows(4);
  EXPECT_THAT(ValidateShardingPlan(gap, Tables(), 2, true).message(),
              HasSubstr("cover 36 of 40"));
  v1::ShardingPlan overlap = plan;
  *overlap.mutable_tables(0) = ColumnWisePlan(Tables()[0], {0, 1});
  overlap.mutable_tables(0)->mutable_shards(1)->set_col_offset(1);
  EXPECT_THAT(ValidateShardingPlan(overlap, Tables(), 2, true).message(),
              HasSubstr("shard 1 overlaps shard 0"));
  // Offsets and sizes whose sums overflow int64 (2^62 + 2^62) and whose
  // area wraps to 0 still lie outside the table.
  v1::ShardingPlan overflow = plan;
  *overflow.mutable_tables(0) = RowWisePlan(Tables()[0], 2);
  overflow.mutable_tables(0)->mutable_shards(0)->set_rows(10);
  v1::Shard* huge = overflow.mutable_tables(0)->mutable_shards(1);
  huge->set_row_offset(int64_t{1} << 62);
  huge->set_rows(int64_t{1} << 62);
  EXPECT_THAT(
      ValidateShardingPlan(overflow, Tables(), 2, true).message(),
      HasSubstr(
          "table 'a' shard 1 (rows 4611686018427387904+4611686018427387904, "
          "cols 0+4) lies outside its 10 x 4"));
  v1::ShardingPlan bad_rank = plan;
  bad_rank.mutable_tables(1)->mutable_shards(0)->set_rank(5);
  EXPECT_THAT(ValidateShardingPlan(bad_rank, Tables(), 2, true).message(),
              HasSubstr("rank 5 outside [0, 2)"));
  v1::ShardingPlan twrw = plan;
  *twrw.mutable_tables(0) = TableRowWisePlan(Tables()[0], {0, 1});
  EXPECT_THAT(ValidateShardingPlan(twrw, Tables(), 2, false).message(),
              HasSubstr("pooled collections only"));
  v1::ShardingPlan shape = plan;
  shape.mutable_tables(0)->set_num_embeddings(11);
  EXPECT_THAT(ValidateShardingPlan(shape, Tables(), 2, true).message(),
              HasSubstr("planned as 11 x 4"));
}

// The trainer builds every shard on the module's device: it refuses a plan
// that puts a table in host memory (FUSED_UVM_CACHING) or names a kernel it
// does not know, rather than allocate the table whole on the device.
TEST(ShardingPlanTest, RefusesKernelsTheTrainerCannotRun) {
  v1::ShardingPlan plan = DefaultShardingPlan(Tables(), 2);
  *plan.mutable_tables(1) = DataParallelPlan(Tables()[1], 2);
  ASSERT_TRUE(ValidateShardingPlan(plan, Tables(), 2, true).ok());
  for (v1::ComputeKernel kernel :
       {v1::COMPUTE_KERNEL_UNSPECIFIED, v1::FUSED, v1::DENSE}) {
    v1::ShardingPlan runnable = plan;
    runnable.mutable_tables(0)->set_compute_kernel(kernel);
    EXPECT_TRUE(ValidateShardingPlan(runnable, Tables(), 2, true).ok())
        << v1::ComputeKernel_Name(kernel);
  }
  v1::ShardingPlan uvm = plan;
  uvm.mutable_tables(1)->set_compute_kernel(v1::FUSED_UVM_CACHING);
  const absl::Status refused = ValidateShardingPlan(uvm, Tables(), 2, true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("table 'b'"));
  EXPECT_THAT(refused.message(), HasSubstr("FUSED_UVM_CACHING"));
  v1::ShardingPlan unknown = plan;
  unknown.mutable_tables(0)->set_compute_kernel(
      static_cast<v1::ComputeKernel>(7));
  EXPECT_THAT(ValidateShardingPlan(unknown, Tables(), 2, true).message(),
              HasSubstr("table 'a'"));
  EXPECT_THAT(ValidateShardingPlan(unknown, Tables(), 2, true).message(),
              HasSubstr("compute kernel 7"));
}

TEST(ShardingPlanTest, TextFileRoundTripAndParseErrors) {
  v1::ShardingPlan plan = DefaultShardingPlan(Tables(), 2);
  *plan.mutable_tables(1) = RowWisePlan(Tables()[1], 2);
  const std::string path = TempPath("plan.textproto");
  ASSERT_TRUE(WriteShardingPlan(plan, path).ok());
  absl::StatusOr<v1::ShardingPlan> read = ReadShardingPlan(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), plan.SerializeAsString());

  const std::string bad = TempPath("bad.textproto");
  std::ofstream(bad) << "world_size: 2\ntables { table: \"a\" shardz {} }\n";
  absl::StatusOr<v1::ShardingPlan> parsed = ReadShardingPlan(bad);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("line 2"));
  const absl::Status absent = ReadShardingPlan(TempPath("absent")).status();
  EXPECT_EQ(absent.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.message(), HasSubstr("No such file"));
  const std::string empty = TempPath("empty.textproto");
  std::ofstream(empty) << "";
  const absl::Status none = ReadShardingPlan(empty).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("plans no tables"));
}

// World size 1: the sharded module is the unsharded one plus collectives
// with itself.
TEST(ShardedEmbeddingModuleTest, OneRankEqualsTheUnshardedModule) {
  ProcessGroupOptions group_options;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(group_options);
  ASSERT_TRUE(group.ok()) << group.status();
  ShardedModuleOptions options;
  options.module.path = "sparse.ebc";
  options.module.tables = Tables();
  options.module.seed = 3;
  auto sharded = ShardedEmbeddingBagCollection::Create(options, group->get());
  auto plain = EmbeddingBagCollection::Create(options.module);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*sharded)->local_shards().size(), 2u);
  KeyedJaggedTensor input = *KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::tensor({1, 9, 3, 0, 6}, at::kLong),
      at::tensor({2, 1, 1, 1}, at::kLong));
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<KeyedTensor> a = (*sharded)->Forward(input);
    absl::StatusOr<KeyedTensor> b = (*plain)->Forward(input);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(at::equal(a->values(), b->values()));
    a->values().pow(2).sum().backward();
    b->values().pow(2).sum().backward();
  }
  EXPECT_TRUE(
      at::equal((*sharded)->local_module()->weight(0), (*plain)->weight(0)));
  // An empty batch pools to an empty output.
  KeyedJaggedTensor empty = *KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::empty({0}, at::kLong), at::empty({0}, at::kLong));
  absl::StatusOr<KeyedTensor> none = (*sharded)->Forward(empty);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->values().sizes(), (std::vector<int64_t>{0, 7}));
  // Bad input: an ID outside its table, a missing feature.
  KeyedJaggedTensor bad = *KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::tensor({10, 0}, at::kLong),
      at::tensor({1, 0, 1, 0}, at::kLong));
  EXPECT_THAT((*sharded)->Forward(bad).status().message(),
              HasSubstr("outside [0, 10)"));
  KeyedJaggedTensor partial = *KeyedJaggedTensor::FromLengths(
      {"f1"}, at::tensor({1}, at::kLong), at::tensor({1, 0}, at::kLong));
  EXPECT_EQ((*sharded)->Forward(partial).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace deltastream
