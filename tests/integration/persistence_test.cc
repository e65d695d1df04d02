// Snapshots with the real tracker_server: on demand, periodic and at
// shutdown; a server killed with SIGKILL and restarted on the same --db comes
// back with exactly the last snapshot; corrupt or incompatible databases are a
// clear error, never a crash or a silent reset.

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "clients/delta_client.h"
#include "tests/integration/server_process.h"
#include "tests/testing/tensor_values.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

std::string FreshDb(const std::string& name) {
  const std::string path = TestTempDir() + "/persistence." + name;
  fs::remove_all(path);
  return path;
}

// Rows of dim 2 whose values are their IDs, plus `shift`.
at::Tensor StatesFor(const at::Tensor& ids, float shift) {
  return (ids.to(at::kFloat) + shift).unsqueeze(1).repeat({1, 2});
}

void RecordAndStep(DeltaClient& client, const std::string& fqn,
                   std::vector<int64_t> ids, float shift) {
  at::Tensor t = Ids(ids);
  ASSERT_TRUE(client.Record({{{fqn, t, StatesFor(t, shift)}}}).ok());
  ASSERT_TRUE(client.Step().ok());
}

ReceivedDelta Read(DeltaClient& client, const std::string& consumer) {
  v1::GetDeltaRequest request;
  request.set_consumer(consumer);
  absl::StatusOr<ReceivedDelta> delta = client.GetDelta(request);
  EXPECT_TRUE(delta.ok()) << delta.status();
  return delta.ok() ? *std::move(delta) : ReceivedDelta();
}

std::vector<int64_t> IdsOf(const ReceivedDelta& delta, const std::string& fqn) {
  auto it = delta.tables.find(fqn);
  if (it == delta.tables.end()) return {};
  at::Tensor ids = it->second.ids.contiguous();
  return {ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()};
}

// A server killed after a snapshot, and the records that followed it, comes
// back with exactly the snapshot: batch, rows and states, consumers (including
// one added at run time) and their cursors.
TEST(PersistenceTest, SigkilledServerRestartsFromItsLastSnapshot) {
  const std::string db = FreshDb("sigkill");
  const std::vector<std::string> flags = {"--mode=embedding", "--consumers=a,b",
                                          "--db=" + db};
  {
    ServerProcess server(flags);
    ASSERT_GT(server.port(), 0);
    auto client = DeltaClient::Create(server.target());
    RecordAndStep(*client, "t", {5, 1, 5}, 0.5f);  // batch 0
    EXPECT_EQ(IdsOf(Read(*client, "a"), "t"), (std::vector<int64_t>{1, 5}));
    RecordAndStep(*client, "t", {2, 1}, 10.0f);  // batch 1
    ASSERT_TRUE(client->AddConsumer("late").ok());
    RecordAndStep(*client, "u", {9}, 0.0f);  // batch 2
    auto snapshot = client->Snapshot();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ(snapshot->generation(), 1u);
    EXPECT_EQ(snapshot->batch(), 3);
    RecordAndStep(*client, "t", {77}, 0.0f);  // after the snapshot: lost
    EXPECT_EQ(server.Stop(SIGKILL), SIGKILL);
  }
  ServerProcess restarted(flags);
  ASSERT_GT(restarted.port(), 0);
  auto client = DeltaClient::Create(restarted.target());
  auto status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->current_batch(), 3);
  EXPECT_EQ(status->last_snapshot().generation(), 1u);
  EXPECT_EQ(*client->ListConsumers(),
            (std::vector<std::string>{"a", "b", "late"}));

  // a read batch 0 before the snapshot: it gets batches 1 and 2.
  ReceivedDelta a = Read(*client, "a");
  EXPECT_EQ(a.header.start_batch(), 1);
  EXPECT_EQ(a.header.end_batch(), 3);
  EXPECT_EQ(IdsOf(a, "t"), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(at::equal(a.tables["t"].states,
                        StatesFor(Ids({1, 2}), 10.0f)));  // first in batch 1
  EXPECT_EQ(IdsOf(a, "u"), (std::vector<int64_t>{9}));
  // b had read nothing: every batch, each row's first state.
  ReceivedDelta b = Read(*client, "b");
  EXPECT_EQ(IdsOf(b, "t"), (std::vector<int64_t>{1, 2, 5}));
  EXPECT_TRUE(
      at::equal(b.tables["t"].states,
                at::cat({StatesFor(Ids({1}), 0.5f), StatesFor(Ids({2}), 10.0f),
                         StatesFor(Ids({5}), 0.5f)})));
  // late joined at batch 2.
  EXPECT_EQ(IdsOf(Read(*client, "late"), "u"), (std::vector<int64_t>{9}));
  EXPECT_EQ(IdsOf(Read(*client, "late"), "t"), std::vector<int64_t>{});
  // Recording goes on from batch 3.
  RecordAndStep(*client, "t", {3}, 0.0f);
  EXPECT_EQ(IdsOf(Read(*client, "a"), "t"), (std::vector<int64_t>{3}));
}

// Periodic snapshots happen on their own; SIGTERM writes a final one.
TEST(PersistenceTest, PeriodicAndShutdownSnapshots) {
  const std::string db = FreshDb("periodic");
  const std::vector<std::string> flags = {"--consumers=c", "--db=" + db,
                                          "--snapshot_interval_s=1"};
  {
    ServerProcess server(flags);
    ASSERT_GT(server.port(), 0);
    auto client = DeltaClient::Create(server.target());
    RecordAndStep(*client, "t", {1, 2}, 0.0f);
    uint64_t generation = 0;
    for (int i = 0; i < 50 && generation == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      generation = client->Status()->last_snapshot().generation();
    }
    EXPECT_GE(generation, 1u) << "no periodic snapshot within 5 s";
    // On demand, from the CLI; status shows it.
    CommandResult snapshot =
        RunCommand(RunfilePath("clients/deltactl") +
                   " --target=" + server.target() + " snapshot --json");
    EXPECT_EQ(snapshot.exit_code, 0) << snapshot.err;
    EXPECT_NE(snapshot.out.find("\"batch\":1"), std::string::npos)
        << snapshot.out;
    CommandResult status =
        RunCommand(RunfilePath("clients/deltactl") +
                   " --target=" + server.target() + " status");
    EXPECT_NE(status.out.find("db " + db + ": snapshot "), std::string::npos)
        << status.out;
    RecordAndStep(*client, "t", {3}, 0.0f);  // only the final snapshot has it
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  ServerProcess restarted(flags);
  ASSERT_GT(restarted.port(), 0);
  auto client = DeltaClient::Create(restarted.target());
  EXPECT_EQ(client->Status()->current_batch(), 2);
  EXPECT_EQ(IdsOf(Read(*client, "c"), "t"), (std::vector<int64_t>{1, 2, 3}));
}

// Acknowledged reads: a pending read survives a restart, so the consumer reads
// the same rows again and commits them: nothing is missed.
TEST(PersistenceTest, PendingAcknowledgedReadSurvivesRestart) {
  const std::string db = FreshDb("acked");
  const std::vector<std::string> flags = {"--consumers=c", "--db=" + db,
                                          "--acknowledged_reads"};
  int64_t end = 0;
  {
    ServerProcess server(flags);
    ASSERT_GT(server.port(), 0);
    auto client = DeltaClient::Create(server.target());
    RecordAndStep(*client, "t", {4, 8}, 0.0f);
    ReceivedDelta first = Read(*client, "c");  // not committed
    end = first.header.end_batch();
    ASSERT_TRUE(client->Snapshot().ok());
    EXPECT_EQ(server.Stop(SIGKILL), SIGKILL);
  }
  ServerProcess restarted(flags);
  auto client = DeltaClient::Create(restarted.target());
  auto status = client->Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->consumers_size(), 1);
  EXPECT_TRUE(status->consumers(0).has_pending_read());
  ReceivedDelta again = Read(*client, "c");
  EXPECT_EQ(IdsOf(again, "t"), (std::vector<int64_t>{4, 8}));
  EXPECT_TRUE(client->Commit("c", end).ok());
  EXPECT_EQ(IdsOf(Read(*client, "c"), "t"), std::vector<int64_t>{});
}

CommandResult StartServer(const std::string& flags) {
  // A server that starts would run forever: every case here must exit.
  return RunCommand("timeout 60 " +
                    RunfilePath("tracker_service/tracker_server") +
                    " --listen=127.0.0.1:0 " + flags);
}

TEST(PersistenceTest, CorruptDatabaseIsAClearErrorAndIsKept) {
  const std::string db = FreshDb("corrupt");
  {
    ServerProcess server({"--mode=embedding", "--db=" + db});
    ASSERT_GT(server.port(), 0);
    auto client = DeltaClient::Create(server.target());
    at::Tensor ids = at::arange(50000, at::kLong);
    ASSERT_TRUE(client->Record({{{"t", ids, at::randn({50000, 32})}}}).ok());
    ASSERT_TRUE(client->Step().ok());
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  std::vector<std::pair<fs::path, int64_t>> sizes;
  for (const auto& entry : fs::directory_iterator(db)) {
    if (entry.path().extension() != ".sst" || entry.file_size() < 65536) {
      continue;
    }
    std::fstream file(entry.path(),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(entry.file_size() / 3);
    file.write("garbage-garbage-garbage-garbage", 31);
    sizes.emplace_back(entry.path(), entry.file_size());
  }
  ASSERT_FALSE(sizes.empty());
  CommandResult result = StartServer("--mode=embedding --db=" + db);
  EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
  EXPECT_NE(result.err.find("Corruption"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(db), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("listening"), std::string::npos);
  for (const auto& [path, size] : sizes) {  // nothing was reset or removed
    EXPECT_TRUE(fs::exists(path));
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), size);
  }
}

TEST(PersistenceTest, IncompatibleDatabasesAreAClearError) {
  const std::string db = FreshDb("embedding_mode");
  {
    ServerProcess server({"--mode=embedding", "--db=" + db});
    ASSERT_GT(server.port(), 0);
    auto client = DeltaClient::Create(server.target());
    RecordAndStep(*client, "t", {1}, 0.0f);
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  CommandResult other_mode = StartServer("--mode=id_only --db=" + db);
  EXPECT_EQ(other_mode.exit_code, 2) << other_mode.err;
  EXPECT_NE(other_mode.err.find("taken in embedding mode"), std::string::npos)
      << other_mode.err;

  const std::string foreign = FreshDb("foreign");
  fs::create_directories(foreign);
  std::ofstream(foreign + "/important.txt") << "not a database";
  CommandResult not_a_db = StartServer("--db=" + foreign);
  EXPECT_EQ(not_a_db.exit_code, 2) << not_a_db.err;
  EXPECT_NE(not_a_db.err.find("holds no RocksDB database"), std::string::npos)
      << not_a_db.err;
  EXPECT_TRUE(fs::exists(foreign + "/important.txt"));
}

}  // namespace
}  // namespace deltastream
