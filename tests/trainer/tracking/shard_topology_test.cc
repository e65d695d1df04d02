// The topology a one-process trainer serves (its tables whole on rank 0,
// only tracked ones), endpoint exchange without a group, and the address
// published for a wildcard listen host.
#include "trainer/tracking/shard_topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "trainer/modules/embedding_modules.h"

namespace deltastream {
namespace {

TEST(ShardTopologyTest, UnshardedTablesAreWholeOnRankZero) {
  EmbeddingModuleOptions options;
  options.path = "module.sparse.ebc";
  options.tables = {{"user", 200, 8, {"user_id"}},
                    {"item", 50, 4, {"item_id"}}};
  std::unique_ptr<EmbeddingBagCollection> ebc =
      *EmbeddingBagCollection::Create(options);
  std::vector<EmbeddingModule*> modules = {ebc.get()};
  const std::vector<std::string> skip = {"user"};
  const ServiceTopology topology = DescribeTopology(0, 1, {}, modules, skip);
  EXPECT_EQ(topology.world_size, 1);
  EXPECT_EQ(topology.rank, 0);
  EXPECT_TRUE(topology.plan.empty());
  ASSERT_EQ(topology.shards.size(), 1u);  // "user" is skipped
  const ServiceTopology::Shard& item = topology.shards[0];
  EXPECT_EQ(item.fqn, "sparse.ebc.embedding_bags.item");
  EXPECT_EQ(item.sharding_type, "TABLE_WISE");
  EXPECT_EQ(item.rank, 0);
  EXPECT_EQ(item.row_offset, 0);
  EXPECT_EQ(item.rows, 50);
  EXPECT_EQ(item.col_offset, 0);
  EXPECT_EQ(item.cols, 4);
  EXPECT_EQ(item.table_rows, 50);
  EXPECT_EQ(item.table_cols, 4);
  // No sharded module: no row offsets.
  EXPECT_TRUE(ShardRowOffsets({}).empty());
}

TEST(ShardTopologyTest, EndpointsWithoutAGroupAreOwn) {
  absl::StatusOr<std::vector<std::string>> endpoints =
      ExchangeEndpoints(nullptr, "127.0.0.1:5000");
  ASSERT_TRUE(endpoints.ok()) << endpoints.status();
  EXPECT_EQ(*endpoints, std::vector<std::string>{"127.0.0.1:5000"});
}

TEST(ShardTopologyTest, WildcardHostsBecomeTheHostname) {
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::string host = name;
  EXPECT_EQ(ReachableAddress("0.0.0.0:5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress("[::]:5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress(":5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress("127.0.0.1:5000"), "127.0.0.1:5000");
  EXPECT_EQ(ReachableAddress("[::1]:5000"), "[::1]:5000");
  EXPECT_EQ(ReachableAddress("trainer-0.svc:5000"), "trainer-0.svc:5000");
}

}  // namespace
}  // namespace deltastream
