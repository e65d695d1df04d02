// The real tracker_server on a loopback port, driven by the real deltactl and
// by the client library.

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "clients/delta_client.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using nlohmann::json;

std::string Deltactl(const ServerProcess& server, const std::string& args) {
  return RunfilePath("clients/deltactl") + " --target=" + server.target() +
         " " + args;
}

json Json(const CommandResult& result) {
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return json::parse(result.out, nullptr, false);
}

// An error is one line on stderr with a non-zero exit, never a stack trace.
void ExpectCleanError(const CommandResult& result, const std::string& message,
                      int exit_code = 1) {
  EXPECT_EQ(result.exit_code, exit_code) << result.out << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << result.err;
  EXPECT_EQ(result.err.find("terminate"), std::string::npos) << result.err;
}

TEST(ServerCliTest, EveryCommandAgainstARealServer) {
  ServerProcess server(
      {"--mode=embedding", "--consumers=predictor,checkpoint"});
  ASSERT_GT(server.port(), 0);
  const std::string file = TestTempDir() + "/push.json";
  std::ofstream(file) << R"({"tables": {"sparse.t1": {"ids": [3, 1, 3],
      "states": [[1, 1], [2, 2], [9, 9]]}, "sparse.t2": {"ids": [7],
      "states": [[5, 5]]}}})";
  json pushed =
      Json(RunCommand(Deltactl(server, "push --json --json_file=" + file)));
  EXPECT_EQ(pushed["batch"], 0);
  // From stdin, into the same batch.
  EXPECT_EQ(RunCommand("echo '{\"tables\": {\"sparse.t1\": {\"ids\": [4], "
                       "\"states\": [[4, 4]]}}}' | " +
                       Deltactl(server, "push --json_file=-"))
                .exit_code,
            0);
  // The batch is still open: a read sees nothing of it.
  json before =
      Json(RunCommand(Deltactl(server, "get --json --consumer=predictor")));
  for (auto& [fqn, table] : before["tables"].items()) {
    EXPECT_TRUE(table["ids"].empty()) << before.dump();
  }
  EXPECT_EQ(Json(RunCommand(Deltactl(server, "step --json")))["batch"], 1);

  json delta =
      Json(RunCommand(Deltactl(server, "get --json --consumer=predictor")));
  EXPECT_EQ(delta["consumer"], "predictor");
  EXPECT_EQ(delta["batch"], 1);
  EXPECT_EQ(delta["tables"]["sparse.t1"]["ids"], json({1, 3, 4}));
  EXPECT_EQ(delta["tables"]["sparse.t1"]["states"],
            json({{2.0, 2.0}, {1.0, 1.0}, {4.0, 4.0}}));
  EXPECT_EQ(delta["tables"]["sparse.t2"]["ids"], json({7}));
  // Only one table for the other consumer; the rest waits for it.
  json t2 = Json(RunCommand(
      Deltactl(server, "get --json --consumer=checkpoint --fqn=sparse.t2")));
  EXPECT_EQ(t2["tables"].size(), 1u);

  json status = Json(RunCommand(Deltactl(server, "status --json")));
  EXPECT_EQ(status["mode"], "embedding");
  EXPECT_EQ(status["current_batch"], 1);
  // Compacted to unique rows, kept for the checkpoint, which has not read it.
  // The tables are StatusResponse.tables: a list, each with its fqn.
  EXPECT_EQ(status["tables"][0]["fqn"], "sparse.t1");
  EXPECT_EQ(status["tables"][0]["ids"], 3);
  EXPECT_EQ(RunCommand(Deltactl(server, "status")).exit_code, 0);

  EXPECT_EQ(Json(RunCommand(Deltactl(
                server, "consumers add replica2 --json")))["consumers"],
            json({"checkpoint", "predictor", "replica2"}));
  EXPECT_EQ(Json(RunCommand(Deltactl(
                server, "consumers remove replica2 --json")))["consumers"],
            json({"checkpoint", "predictor"}));
  EXPECT_EQ(RunCommand(Deltactl(server, "compact --json")).exit_code, 0);
  json cleared =
      Json(RunCommand(Deltactl(server, "clear --json --consumer=checkpoint")));
  EXPECT_EQ(cleared["bytes"], 0);  // nobody needs anything now
  EXPECT_EQ(RunCommand(Deltactl(server, "clear")).exit_code, 0);
  ExpectCleanError(RunCommand(Deltactl(server, "snapshot")),
                   "no snapshot database (start it with --db=PATH)");

  EXPECT_EQ(server.Stop(SIGTERM), 0);  // a clean exit
}

// get --out writes the delta as .npz, which NumPy loads without this project.
TEST(ServerCliTest, GetWritesANumpyFile) {
  ServerProcess server({"--mode=embedding", "--consumers=c,d"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  ASSERT_TRUE(
      client
          ->Record({{{"sparse.t1", at::tensor({4, 2}, at::kLong),
                      at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2})}}})
          .ok());
  ASSERT_TRUE(client->Step().ok());
  const std::string file = TestTempDir() + "/delta.npz";
  CommandResult wrote =
      RunCommand(Deltactl(server, "get --consumer=c --out=" + file));
  EXPECT_EQ(wrote.exit_code, 0) << wrote.err;
  EXPECT_NE(wrote.out.find("2 rows of 1 tables"), std::string::npos)
      << wrote.out;
  CommandResult loaded = RunCommand(
      "/usr/bin/python3 -c \"import numpy as np; f = np.load('" + file +
      "'); print(f['sparse.t1/ids'].tolist(), "
      "f['sparse.t1/states'].tolist(), int(f['__delta__/end_batch']))\"");
  EXPECT_EQ(loaded.exit_code, 0) << loaded.err;
  EXPECT_EQ(loaded.out, "[2, 4] [[3.0, 4.0], [1.0, 2.0]] 1\n");
  ExpectCleanError(
      RunCommand(Deltactl(server, "get --consumer=c --out=/nonexistent/d.npz")),
      "/nonexistent/d.npz", 2);
  // IDs only, on request.
  json ids_only = Json(
      RunCommand(Deltactl(server, "get --json --consumer=d --states=false")));
  EXPECT_EQ(ids_only["tables"]["sparse.t1"]["ids"], json({2, 4}));
  EXPECT_FALSE(ids_only["tables"]["sparse.t1"].contains("states"))
      << ids_only.dump();
  // A file that cannot be written is found before the read: the rows stay
  // the consumer's to read (its cursor did not move).
  ASSERT_TRUE(client
                  ->Record({{{"sparse.t1", at::tensor({7}, at::kLong),
                              at::tensor({5.0f, 6.0f}).reshape({1, 2})}}})
                  .ok());
  ASSERT_TRUE(client->Step().ok());
  const CommandResult refused =
      RunCommand(Deltactl(server, "get --consumer=c --out=/nonexistent/e.npz"));
  ExpectCleanError(refused, "nothing was read", 2);
  json kept = Json(RunCommand(Deltactl(server, "get --json --consumer=c")));
  EXPECT_EQ(kept["tables"]["sparse.t1"]["ids"], json({7})) << kept.dump();
}

// -o json is --json; -o yaml holds the same tree (read with PyYAML); -o wide
// adds columns; --target falls back on $DELTACTL_TARGET; a command's result
// follows its proto message (every StatusResponse field, by its name).
TEST(ServerCliTest, OutputFormatsAndTheTargetFromTheEnvironment) {
  ServerProcess server({"--mode=id_only", "--consumers=c,d"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  ASSERT_TRUE(
      client->Record({{{"sparse.t1", at::tensor({4, 2}, at::kLong)}}}).ok());
  ASSERT_TRUE(client->Step().ok());

  // Status without the lag in seconds, which grows between two calls.
  auto status_of = [](json status) {
    for (json& consumer : status["consumers"]) consumer.erase("lag_seconds");
    return status;
  };
  const json status =
      status_of(Json(RunCommand(Deltactl(server, "status -o json"))));
  EXPECT_EQ(status,
            status_of(Json(RunCommand(Deltactl(server, "status --json")))));
  for (const char* field :
       {"mode", "current_batch", "delete_on_read", "auto_compact",
        "acknowledged_reads", "consumers", "tables", "bytes",
        "memory_cap_bytes", "cap_compactions", "cap_drops", "dropped_ids",
        "dropped_bytes", "db", "run_id", "run_start_batch",
        "serves_live_rows"}) {
    EXPECT_TRUE(status.contains(field)) << field << " in " << status.dump();
  }
  EXPECT_EQ(status["consumers"][0]["name"], "c");
  EXPECT_EQ(status["consumers"][0]["lag_steps"], 1);

  // YAML holds the same tree as JSON: status, and one delta read by two
  // consumers.
  const std::string yaml_to_json =
      " | /usr/bin/python3 -c 'import json, sys, yaml; "
      "print(json.dumps(yaml.safe_load(sys.stdin)))'";
  EXPECT_EQ(status_of(Json(
                RunCommand(Deltactl(server, "status -o yaml") + yaml_to_json))),
            status);
  const json as_json =
      Json(RunCommand(Deltactl(server, "get -o json --consumer=c")));
  json as_yaml = Json(
      RunCommand(Deltactl(server, "get -o yaml --consumer=d") + yaml_to_json));
  EXPECT_EQ(as_yaml["tables"], as_json["tables"]);
  EXPECT_EQ(as_yaml["tables"]["sparse.t1"]["ids"], json({2, 4}));
  EXPECT_EQ(as_yaml["consumer"], "d");

  // wide: more columns than text.
  const CommandResult text = RunCommand(Deltactl(server, "status"));
  const CommandResult wide = RunCommand(Deltactl(server, "status -o wide"));
  EXPECT_EQ(wide.exit_code, 0) << wide.err;
  EXPECT_NE(wide.out.find("LAG_SECONDS"), std::string::npos) << wide.out;
  EXPECT_EQ(text.out.find("LAG_SECONDS"), std::string::npos) << text.out;

  // The target from the environment, and --target before it.
  const std::string deltactl = RunfilePath("clients/deltactl");
  const CommandResult from_environment = RunCommand(
      "DELTACTL_TARGET=" + server.target() + " " + deltactl + " step --json");
  EXPECT_EQ(Json(from_environment)["batch"], 2);
  ExpectCleanError(
      RunCommand("DELTACTL_TARGET=" + server.target() + " " + deltactl +
                 " --target=127.0.0.1:1 --timeout_ms=2000 step"),
      "cannot reach 127.0.0.1:1");
}

TEST(ServerCliTest, ErrorsAreOneLineAndNonZero) {
  ServerProcess server({"--mode=id_only"});
  ASSERT_GT(server.port(), 0);
  ExpectCleanError(RunCommand(Deltactl(server, "get --consumer=nobody")),
                   "unknown consumer 'nobody'");
  ExpectCleanError(
      RunCommand("echo '{bad' | " + Deltactl(server, "push --json_file=-")),
      "bad JSON");
  ExpectCleanError(
      RunCommand("echo '{\"tables\": {\"t\": {\"ids\": [1.5]}}}' | " +
                 Deltactl(server, "push --json_file=-")),
      "integers");
  ExpectCleanError(RunCommand(Deltactl(
                       server, "get --consumer=default --top_percentage=150")),
                   "(0, 100]", 2);
  ExpectCleanError(RunCommand(Deltactl(server, "frobnicate")),
                   "unknown command", 2);
  ExpectCleanError(RunCommand(RunfilePath("clients/deltactl") +
                              " --target=127.0.0.1:1 --timeout_ms=2000 status"),
                   "cannot reach 127.0.0.1:1");
  // Nothing was recorded by any rejected request.
  EXPECT_EQ(Json(RunCommand(Deltactl(server, "status --json")))["bytes"], 0);
}

TEST(ServerCliTest, InconsistentServerFlagsAreRefused) {
  const std::string server =
      RunfilePath("tracker_service/tracker_server") + " --listen=127.0.0.1:0 ";
  ExpectCleanError(RunCommand(server + "--snapshot_interval_s=5"),
                   "--snapshot_interval_s needs --db", 2);
  ExpectCleanError(RunCommand(server + "--tls_cert=/x.pem"),
                   "--tls_cert and --tls_key go together", 2);
  ExpectCleanError(RunCommand(server + "--auth_token_file=/nonexistent"),
                   "cannot read token file '/nonexistent'", 2);
  ExpectCleanError(RunCommand(server + "--mode=sideways"), "sideways", 2);
}

TEST(ServerCliTest, AcknowledgedReadsRepeatUntilCommitted) {
  ServerProcess server({"--acknowledged_reads", "--consumers=c"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  ASSERT_TRUE(
      client->Record({{{"t", at::tensor({5, 6}, at::kLong), {}}}}).ok());
  ASSERT_TRUE(client->Step().ok());
  v1::GetDeltaRequest request;
  request.set_consumer("c");
  auto first = client->GetDelta(request);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = client->GetDelta(request);  // not committed: the same rows
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(at::equal(first->tables["t"].ids, again->tables["t"].ids));
  CommandResult commit = RunCommand(
      Deltactl(server, "commit --consumer=c --end_batch=" +
                           std::to_string(again->header.end_batch())));
  EXPECT_EQ(commit.exit_code, 0) << commit.err;
  auto after = client->GetDelta(request);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tables["t"].ids.numel(), 0);
}

// 16 consumers read a multi-chunk delta at once: every call succeeds and every
// consumer gets every row, reassembled bit for bit.
TEST(ServerCliTest, SixteenConsumersReadChunkedDeltasAtOnce) {
  std::string consumers;
  for (int c = 0; c < 16; ++c)
    consumers += (c ? ",c" : "c") + std::to_string(c);
  ServerProcess server({"--mode=embedding", "--consumers=" + consumers});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  const at::Tensor ids = at::randperm(20000, at::kLong);
  // 5 MiB: over the server's default 4 MiB message limit, so the client sends
  // it in slices, and several chunks come back.
  const at::Tensor states = at::randn({20000, 64});
  ASSERT_TRUE(client->Record({{{"big", ids, states}}}).ok());
  ASSERT_TRUE(client->Step().ok());
  const at::Tensor order = std::get<1>(ids.sort());
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  for (int c = 0; c < 16; ++c) {
    readers.emplace_back([&, c] {
      auto reader = DeltaClient::Create(server.target());
      v1::GetDeltaRequest request;
      request.set_consumer("c" + std::to_string(c));
      request.set_max_chunk_bytes(256 << 10);
      auto delta = reader->GetDelta(request);
      if (!delta.ok()) return;
      const ReceivedTable& big = delta->tables["big"];
      if (at::equal(big.ids, ids.index_select(0, order)) &&
          at::equal(big.states, states.index_select(0, order))) {
        ++ok;
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(ok.load(), 16);
  EXPECT_EQ(client->Status()->bytes(), 0);  // everyone read: deleted
}

// Issue 21, defects 8 and 9: flags a server must not start with are refused
// with one line and exit 2, before anything starts (no gRPC log line).
TEST(ServerCliTest, BadServerFlagsAreOneLineAndExit2) {
  const std::string server =
      RunfilePath("tracker_service/tracker_server") + " --listen=127.0.0.1:0 ";
  const std::string binary =
      RunfilePath("tracker_service/tracker_server") + " ";
  ExpectCleanError(RunCommand(server + "--max_concurrent_streams=0"),
                   "--max_concurrent_streams must be > 0", 2);
  ExpectCleanError(RunCommand(server + "--max_message_bytes=0"),
                   "--max_message_bytes must be > 0", 2);
  ExpectCleanError(RunCommand(server + "--max_message_bytes=-5"),
                   "--max_message_bytes must be > 0", 2);
  ExpectCleanError(RunCommand(server + "--keepalive_ms=0"),
                   "--keepalive_ms: the keepalive interval must be > 0 ms", 2);
  ExpectCleanError(RunCommand(binary + "--listen=127.0.0.1:99999"), "--listen",
                   2);
  ExpectCleanError(RunCommand(binary + "--listen=garbage"), "--listen", 2);
  ExpectCleanError(RunCommand(server + "--consumers="), "--consumers", 2);
  ExpectCleanError(RunCommand(server + "--consumers=a,,b"), "--consumers", 2);
  ExpectCleanError(RunCommand(server + "--consumers='a b'"), "--consumers", 2);
  // A token file that cannot be read stops the start before a database is
  // created.
  const std::string db = testing::TempDir() + "/never_created";
  std::filesystem::remove_all(db);
  ExpectCleanError(
      RunCommand(server + "--db=" + db + " --auth_token_file=/no/such/file"),
      "/no/such/file", 2);
  EXPECT_FALSE(std::filesystem::exists(db));
  // The trainer's service goes through the same checks (ServiceHost).
  const std::string trainer =
      RunfilePath("trainer/trainer") +
      " --steps=1 --checkpoint_dir=" + testing::TempDir() + "/bad_flags ";
  ExpectCleanError(RunCommand(trainer + "--listen=127.0.0.1:99999"),
                   "127.0.0.1:99999", 2);
  ExpectCleanError(RunCommand(trainer + "--listen=garbage"), "garbage", 2);
}

// Issue 21, defect 2: a second server on an address in use does not share it.
TEST(ServerCliTest, SecondServerOnAnAddressInUseExits2) {
  ServerProcess first({"--consumers=c"});
  ASSERT_GT(first.port(), 0);
  CommandResult second =
      RunCommand(RunfilePath("tracker_service/tracker_server") +
                 " --listen=" + first.target() + " --consumers=c");
  EXPECT_EQ(second.exit_code, 2) << second.out << second.err;
  EXPECT_EQ(std::count(second.err.begin(), second.err.end(), '\n'), 1)
      << second.err;
  EXPECT_EQ(second.out.find("listening"), std::string::npos) << second.out;
  // The first still serves.
  EXPECT_TRUE(DeltaClient::Create(first.target())->Status().ok());
  // So does a trainer: refused with one line and exit 2, not started beside
  // it (its service starts through the same ServiceHost).
  CommandResult trainer = RunCommand(
      RunfilePath("trainer/trainer") + " --steps=1 --listen=" + first.target() +
      " --checkpoint_dir=" + testing::TempDir() + "/in_use");
  EXPECT_EQ(trainer.exit_code, 2) << trainer.out << trainer.err;
  EXPECT_EQ(std::count(trainer.err.begin(), trainer.err.end(), '\n'), 1)
      << trainer.err;
  EXPECT_NE(trainer.err.find("in use"), std::string::npos) << trainer.err;
  EXPECT_TRUE(DeltaClient::Create(first.target())->Status().ok());
}

// Issue 21, defect 3: a poison record (states [n, 0], non-finite states,
// negative IDs) is refused with INVALID_ARGUMENT; every consumer's reads are
// those they would have been without it.
TEST(ServerCliTest, PoisonRecordsAreRefusedAndReadsStayWhole) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  ASSERT_TRUE(
      client->Record({{{"t", at::tensor({1, 2}, at::kLong), at::ones({2, 3})}}})
          .ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const RecordTable& bad : std::vector<RecordTable>{
           {"t", at::tensor({3, 4}, at::kLong), at::ones({2, 0})},
           {"u", at::tensor({3, 4}, at::kLong), at::ones({2, 0})},
           {"t", at::tensor({3}, at::kLong), at::full({1, 3}, nan)},
           {"t", at::tensor({-3}, at::kLong), at::ones({1, 3})},
           {"bad name", at::tensor({3}, at::kLong), at::ones({1, 3})},
       }) {
    auto recorded = client->Record({{bad}});
    EXPECT_EQ(recorded.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.fqn << " " << recorded.status();
  }
  ASSERT_TRUE(client->Step().ok());
  for (const char* consumer : {"a", "b"}) {
    v1::GetDeltaRequest request;
    request.set_consumer(consumer);
    auto delta = client->GetDelta(request);
    ASSERT_TRUE(delta.ok()) << consumer << " " << delta.status();
    ASSERT_EQ(delta->tables.count("u"), 0u);
    EXPECT_TRUE(
        at::equal(delta->tables["t"].ids, at::tensor({1, 2}, at::kLong)));
  }
  // An empty record cannot set a width no row could have (it stuck to the
  // table: every later record was refused, snapshots too).
  auto empty = client->Record(
      {{{"w", at::empty({0}, at::kLong), at::empty({0, int64_t{1} << 62})}}});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument)
      << empty.status();
  EXPECT_TRUE(
      client->Record({{{"w", at::tensor({5}, at::kLong), at::ones({1, 4})}}})
          .ok());
  v1::GetDeltaRequest negative_chunks;
  negative_chunks.set_consumer("a");
  negative_chunks.set_max_chunk_bytes(-1);
  EXPECT_EQ(client->GetDelta(negative_chunks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 21, defect 4: subscription periods near 2^63 are refused, not
// overflowed into a hot loop of empty pushes.
TEST(ServerCliTest, SubscriptionPeriodsOutOfRangeAreRefused) {
  ServerProcess server({"--consumers=c"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max() - 1;
  for (int field = 0; field < 4; ++field) {
    v1::SubscribeRequest request;
    request.mutable_read()->set_consumer("c");
    if (field == 0) request.set_every_steps(kHuge);
    if (field == 1) request.set_every_ms(kHuge);
    if (field == 2) request.set_dense_every_steps(kHuge);
    if (field == 3) request.set_dense_every_ms(-1);
    int pushes = 0;
    const absl::Status status = client->Subscribe(
        request, [&](ReceivedDelta&&) { return ++pushes < 100; });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << field << " " << status;
    EXPECT_EQ(pushes, 0);
  }
}

// Records `rows` rows of `dim` floats (IDs from `first_id`) into sparse.t1
// and closes the batch.
void RecordAndStep(DeltaClient& client, int64_t first_id, int64_t rows,
                   int64_t dim) {
  ASSERT_TRUE(client
                  .Record({{{"sparse.t1",
                             at::arange(first_id, first_id + rows, at::kLong),
                             at::ones({rows, dim})}}})
                  .ok());
  ASSERT_TRUE(client.Step().ok());
}

bool ResyncRequired(DeltaClient& client, const std::string& consumer) {
  auto status = client.Status();
  if (!status.ok()) return false;
  for (const v1::ConsumerStatus& c : status->consumers()) {
    if (c.name() == consumer) return c.resync_required();
  }
  return false;
}

// Makes `consumer`'s next read say resync_required with no row dropped: the
// server delivers a read of 20 MiB (its cursor moves) in 64 KiB chunks to a
// client that takes no message over 4 KiB, which ends the stream at the
// first; the server's next write fails, and it flags the consumer.
void LoseARead(const ServerProcess& server, const std::string& consumer) {
  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 0, 20000, 256);
  ClientOptions small;
  small.max_receive_message_bytes = 4096;
  auto reader = DeltaClient::Create(server.target(), small);
  v1::GetDeltaRequest request;
  request.set_consumer(consumer);
  request.set_max_chunk_bytes(64 << 10);
  EXPECT_FALSE(reader->GetDelta(request).ok());
  for (int i = 0; i < 200 && !ResyncRequired(*client, consumer); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ResyncRequired(*client, consumer));
}

// get --out=DIR: a directory (or a link to one) cannot be replaced by the
// file, so it is refused before the read, with exit 2 (bad usage) and
// "nothing was read": the consumer's rows are still there. (It was read
// first, then failed to rename: the rows were gone, with no resync.)
TEST(ServerCliTest, GetOutIntoADirectoryIsRefusedBeforeTheRead) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 5, 2, 2);
  const std::string dir = TestTempDir() + "/out_dir";
  std::filesystem::create_directories(dir);
  const std::string link = TestTempDir() + "/out_dir_link";
  std::filesystem::remove(link);
  std::filesystem::create_directory_symlink(dir, link);
  for (const std::string& out : {dir, dir + "/", link}) {
    const CommandResult refused =
        RunCommand(Deltactl(server, "get --consumer=b --out=" + out));
    ExpectCleanError(refused, "is a directory; nothing was read", 2);
    EXPECT_TRUE(refused.out.empty()) << refused.out;
  }
  const CommandResult in_a_file =
      RunCommand(Deltactl(server, "get --consumer=b --out=" + dir + "/x/"));
  ExpectCleanError(in_a_file, "nothing was read", 2);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  json kept = Json(RunCommand(Deltactl(server, "get --json --consumer=b")));
  EXPECT_EQ(kept["tables"]["sparse.t1"]["ids"], json({5, 6})) << kept.dump();
  EXPECT_FALSE(kept["resync_required"].get<bool>()) << kept.dump();
}

// clear moves cursors to the present: rows a consumer has not read are
// dropped for it, with no resync (docs/tracker-semantics.md); its help says
// so, not "drops what has been read".
TEST(ServerCliTest, ClearSkipsToThePresentAndItsHelpSaysSo) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  const CommandResult help = RunCommand(Deltactl(server, "clear --help"));
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("to the present: rows it has not read are dropped "
                          "for it, with no resync"),
            std::string::npos)
      << help.out;
  EXPECT_EQ(help.out.find("has read"), std::string::npos) << help.out;
  const CommandResult all = RunCommand(Deltactl(server, "--help"));
  EXPECT_EQ(all.out.find("has read"), std::string::npos) << all.out;

  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 1, 3, 2);
  EXPECT_EQ(RunCommand(Deltactl(server, "clear --consumer=b")).exit_code, 0);
  json b = Json(RunCommand(Deltactl(server, "get --json --consumer=b")));
  EXPECT_TRUE(b["tables"].empty() || b["tables"]["sparse.t1"]["ids"].empty())
      << b.dump();
  EXPECT_FALSE(b["resync_required"].get<bool>()) << b.dump();
  json a = Json(RunCommand(Deltactl(server, "get --json --consumer=a")));
  EXPECT_EQ(a["tables"]["sparse.t1"]["ids"], json({1, 2, 3})) << a.dump();
}

// chain --dir of a missing path, or of a file, is an error naming it (exit
// 1), not an empty chain; an empty directory is 0 links.
TEST(ServerCliTest, ChainOfAMissingDirectoryIsAnError) {
  const std::string deltactl = RunfilePath("clients/deltactl");
  const std::string missing = TestTempDir() + "/no_such_chain";
  std::filesystem::remove_all(missing);
  ExpectCleanError(RunCommand(deltactl + " chain --dir=" + missing),
                   "cannot list the checkpoint chain '" + missing +
                       "': No such file or directory");
  ExpectCleanError(RunCommand(deltactl + " chain --json --dir=" + missing),
                   "cannot list the checkpoint chain '" + missing + "'");
  const std::string file = TestTempDir() + "/not_a_chain";
  std::ofstream(file) << "x";
  ExpectCleanError(
      RunCommand(deltactl + " chain --dir=" + file),
      "cannot list the checkpoint chain '" + file + "': Not a directory");
  const std::string empty = TestTempDir() + "/empty_chain";
  std::filesystem::create_directories(empty);
  const CommandResult listed = RunCommand(deltactl + " chain --dir=" + empty);
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("0 links, 0.0 MiB, no gaps"), std::string::npos)
      << listed.out;
}

// A read past its deadline says so, not "cannot reach" a server that
// answered, and that the read may have been delivered. A resync the memory
// cap did not cause names no cause (it blamed the cap, "0 rows dropped");
// one it did names the rows.
TEST(ServerCliTest, DeadlinesAndResyncsSayWhatHappened) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 0, 20000, 256);  // 20 MiB: not read in 1 ms
  const CommandResult late =
      RunCommand(Deltactl(server, "get --consumer=a --timeout_ms=1"));
  ExpectCleanError(late, "the deadline passed before the read from " +
                             server.target() + " finished (--timeout_ms=1)");
  EXPECT_NE(late.err.find("may have delivered it"), std::string::npos)
      << late.err;
  EXPECT_NE(late.err.find("resync_required"), std::string::npos) << late.err;
  EXPECT_EQ(late.err.find("cannot reach"), std::string::npos) << late.err;

  LoseARead(server, "b");
  const CommandResult text = RunCommand(Deltactl(server, "get --consumer=b"));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(", RESYNC REQUIRED (changes this consumer never "
                          "received are gone: read all rows)"),
            std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("memory cap"), std::string::npos) << text.out;

  ServerProcess capped(
      {"--mode=embedding", "--consumers=c", "--memory_cap_bytes=4096"});
  ASSERT_GT(capped.port(), 0);
  auto capped_client = DeltaClient::Create(capped.target());
  for (int batch = 0; batch < 3; ++batch) {
    RecordAndStep(*capped_client, batch * 100, 100, 4);
  }
  const CommandResult dropped =
      RunCommand(Deltactl(capped, "get --consumer=c"));
  EXPECT_EQ(dropped.exit_code, 0) << dropped.err;
  EXPECT_NE(dropped.out.find("rows dropped under the memory cap)"),
            std::string::npos)
      << dropped.out;
  EXPECT_EQ(dropped.out.find("(0 rows"), std::string::npos) << dropped.out;
}

// get --out says RESYNC REQUIRED as text get does (the file has it too).
TEST(ServerCliTest, GetOutSaysResyncRequired) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  LoseARead(server, "b");
  const std::string file = TestTempDir() + "/resync.npz";
  const CommandResult wrote =
      RunCommand(Deltactl(server, "get --consumer=b --out=" + file));
  EXPECT_EQ(wrote.exit_code, 0) << wrote.err;
  EXPECT_NE(wrote.out.find("to " + file + ", RESYNC REQUIRED ("),
            std::string::npos)
      << wrote.out;
  // Without a resync, the line is as before.
  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 1, 1, 256);
  const CommandResult plain =
      RunCommand(Deltactl(server, "get --consumer=b --out=" + file));
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("RESYNC"), std::string::npos) << plain.out;
}

// Values out of range are bad usage (exit 2) with one line that names the
// rule, before anything is sent; a file that cannot be read says why.
TEST(ServerCliTest, BadValuesAreRefusedWithTheirRule) {
  // momentum_last: a standalone server's mode with scores, for top-k.
  ServerProcess server({"--mode=momentum_last", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  ExpectCleanError(
      RunCommand(Deltactl(server, "subscribe --consumer=a --every_steps=-1")),
      "--every_steps must be >= 0 (0: every step), got -1", 2);
  ExpectCleanError(
      RunCommand(Deltactl(server, "subscribe --consumer=a --every_ms=-1")),
      "--every_ms must be >= 0 (0: by steps only), got -1", 2);
  ExpectCleanError(
      RunCommand(Deltactl(server, "subscribe --consumer=a --top_count=0")),
      "--top_count must be >= 1, got 0", 2);
  ExpectCleanError(
      RunCommand(Deltactl(server, "get --consumer=a --top_percentage=0")),
      "--top_percentage must be in (0, 100], got 0", 2);
  ExpectCleanError(
      RunCommand(Deltactl(server, "push --json_file=" + TestTempDir())),
      "cannot read '" + TestTempDir() + "': it is a directory");
  ExpectCleanError(
      RunCommand(Deltactl(server, "commit --consumer=a --end_batch=-7")),
      "--end_batch must be >= 0 (a read's end_batch), got -7", 2);
  ExpectCleanError(RunCommand(Deltactl(server, "commit --consumer=a")),
                   "commit needs --consumer=C --end_batch=B", 2);
  // The largest count is taken (the server held it as a double and refused
  // more than 9e15).
  auto client = DeltaClient::Create(server.target());
  RecordAndStep(*client, 3, 2, 2);
  json top = Json(RunCommand(Deltactl(
      server, "get --json --consumer=a --top_count=9223372036854775807")));
  EXPECT_EQ(top["tables"]["sparse.t1"]["ids"], json({3, 4})) << top.dump();
}

// consumers add|remove take the name as the argument or --consumer; both,
// disagreeing, are refused (g was added and --consumer=h ignored).
TEST(ServerCliTest, ConsumersRefuseTwoDifferentNames) {
  ServerProcess server({"--mode=embedding", "--consumers=a,b"});
  ASSERT_GT(server.port(), 0);
  ExpectCleanError(
      RunCommand(Deltactl(server, "consumers add g --consumer=h")),
      "consumers add takes one name: 'g' and --consumer=h disagree", 2);
  ExpectCleanError(
      RunCommand(Deltactl(server, "consumers remove a --consumer=b")),
      "consumers remove takes one name", 2);
  ExpectCleanError(RunCommand(Deltactl(server, "consumers list --consumer=a")),
                   "consumers list takes no name", 2);
  EXPECT_EQ(Json(RunCommand(Deltactl(server, "consumers --json")))["consumers"],
            json({"a", "b"}));
  EXPECT_EQ(Json(RunCommand(Deltactl(
                server, "consumers add --consumer=h --json")))["consumers"],
            json({"a", "b", "h"}));
  EXPECT_EQ(
      Json(RunCommand(Deltactl(
          server, "consumers remove h --consumer=h --json")))["consumers"],
      json({"a", "b"}));
}

}  // namespace
}  // namespace deltastream
