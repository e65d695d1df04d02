// The topology a one-process trainer serves (its tables whole on rank 0,
// only tracked ones), endpoint exchange without a group, the address
// published for a wildcard listen host, and the Topology RPC over gRPC: a
// service's default answer, the trainer's, and the columns a column-wise
// shard's chunks say they hold.
#include "trainer/tracking/shard_topology.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "base/host_port.h"
#include "proto/tracker.grpc.pb.h"
#include "tracker_service/service_host.h"
#include "tracker_service/tracker.h"
#include "trainer/modules/embedding_modules.h"

namespace deltastream {
namespace {

std::unique_ptr<EmbeddingBagCollection> MakeModule() {
  EmbeddingModuleOptions options;
  options.path = "module.sparse.ebc";
  options.tables = {{"user", 200, 8, {"user_id"}},
                    {"item", 50, 4, {"item_id"}}};
  return *EmbeddingBagCollection::Create(options);
}

TEST(ShardTopologyTest, UnshardedTablesAreWholeOnRankZero) {
  std::unique_ptr<EmbeddingBagCollection> ebc = MakeModule();
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

TEST(ShardTopologyTest, WildcardHostsBecomeTheFullHostName) {
  const std::string host = FullHostName();
  ASSERT_FALSE(host.empty());
  EXPECT_EQ(ReachableAddress("0.0.0.0:5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress("[::]:5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress(":5000"), host + ":5000");
  EXPECT_EQ(ReachableAddress("127.0.0.1:5000"), "127.0.0.1:5000");
  EXPECT_EQ(ReachableAddress("[::1]:5000"), "[::1]:5000");
  EXPECT_EQ(ReachableAddress("trainer-0.svc:5000"), "trainer-0.svc:5000");
}

v1::TopologyResponse AskTopology(v1::DeltaTracker::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::TopologyResponse response;
  const grpc::Status status =
      stub.Topology(&context, v1::TopologyRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

TEST(ShardTopologyTest, ServiceAnswersTopologyAndChunksSayTheirColumns) {
  std::unique_ptr<EmbeddingBagCollection> ebc = MakeModule();
  std::vector<EmbeddingModule*> modules = {ebc.get()};
  TrackerOptions options;
  options.modules = DescribeModules(modules);
  std::unique_ptr<Tracker> tracker = *Tracker::Create(options);
  ServiceHostOptions host_options;
  host_options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<ServiceHost>> host =
      ServiceHost::Start(tracker.get(), host_options);
  ASSERT_TRUE(host.ok()) << host.status();
  std::unique_ptr<v1::DeltaTracker::Stub> stub =
      v1::DeltaTracker::NewStub(grpc::CreateChannel(
          (*host)->address(), grpc::InsecureChannelCredentials()));

  // As tracker_server answers: one process, tables whole, sizes unknown.
  v1::TopologyResponse topology = AskTopology(*stub);
  EXPECT_EQ(topology.world_size(), 1);
  EXPECT_EQ(topology.rank(), 0);
  ASSERT_EQ(topology.endpoints_size(), 1);
  EXPECT_EQ(topology.endpoints(0).address(), (*host)->address());
  ASSERT_EQ(topology.shards_size(), 2);
  EXPECT_EQ(topology.shards(0).fqn(), "sparse.ebc.embedding_bags.user");
  EXPECT_EQ(topology.shards(0).sharding_type(), "TABLE_WISE");
  EXPECT_EQ(topology.shards(0).table_rows(), 0);

  // As a trainer's rank 0 of 2 whose "item" is column-wise: columns [2, 4)
  // here, [0, 2) on rank 1.
  ServiceTopology set = DescribeTopology(0, 1, {}, modules, {});
  set.world_size = 2;
  set.endpoints = {(*host)->address(), "127.0.0.1:1"};
  set.shards[1] = {
      "sparse.ebc.embedding_bags.item", "COLUMN_WISE", 0, 0, 50, 2, 2, 50, 4};
  set.shards.push_back(
      {"sparse.ebc.embedding_bags.item", "COLUMN_WISE", 1, 0, 50, 0, 2, 50, 4});
  set.plan = "world_size: 2";
  (*host)->SetTopology(set);
  topology = AskTopology(*stub);
  EXPECT_EQ(topology.world_size(), 2);
  ASSERT_EQ(topology.endpoints_size(), 2);
  EXPECT_EQ(topology.endpoints(1).rank(), 1);
  EXPECT_EQ(topology.endpoints(1).address(), "127.0.0.1:1");
  ASSERT_EQ(topology.shards_size(), 3);
  EXPECT_EQ(topology.shards(0).table_rows(), 200);
  EXPECT_EQ(topology.shards(2).rank(), 1);
  EXPECT_EQ(topology.plan(), "world_size: 2");

  ASSERT_TRUE(tracker
                  ->RecordTables({{"sparse.ebc.embedding_bags.user",
                                   at::tensor({3, 7}, at::kLong), at::Tensor()},
                                  {"sparse.ebc.embedding_bags.item",
                                   at::tensor({1}, at::kLong), at::Tensor()}})
                  .ok());
  tracker->Step();
  v1::GetDeltaRequest request;
  request.set_consumer("default");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  std::unique_ptr<grpc::ClientReader<v1::DeltaChunk>> reader =
      stub->GetDelta(&context, request);
  v1::DeltaChunk chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    if (chunk.fqn() == "sparse.ebc.embedding_bags.item") {
      EXPECT_EQ(chunk.col_offset(), 2);
      EXPECT_EQ(chunk.table_cols(), 4);
      ++chunks;
    } else if (chunk.fqn() == "sparse.ebc.embedding_bags.user") {
      EXPECT_EQ(chunk.col_offset(), 0);
      EXPECT_EQ(chunk.table_cols(), 0);  // full width
      ++chunks;
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, 2);
  (*host)->Shutdown();
}

}  // namespace
}  // namespace deltastream
