// The predictor against the real trainer on loopback, through its own lookup
// API (proto/predictor.proto): it becomes ready, follows the trainer's
// batches with a measured freshness, answers lookups; killed (SIGKILL) and
// restarted in memory it bootstraps again, with a RocksDB replica it resumes;
// the apply log never has a gap. A trainer that restarts from an older
// checkpoint makes it resync. Bad flags exit 2.
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/tensor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/predictor.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "tests/integration/predictor_status.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using Stub = v1::ReplicaLookup::Stub;

std::unique_ptr<Stub> Connect(const ServerProcess& predictor) {
  return v1::ReplicaLookup::NewStub(grpc::CreateChannel(
      predictor.target(), grpc::InsecureChannelCredentials()));
}

// Polls the predictor's status until `condition` holds (up to 120 s).
std::optional<v1::PredictorStatus> WaitFor(
    Stub& stub,
    const std::function<bool(const v1::PredictorStatus&)>& condition) {
  for (int i = 0; i < 1200; ++i) {
    std::optional<v1::PredictorStatus> status = PredictorStatusOf(stub);
    if (status.has_value() && condition(*status)) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::optional<v1::PredictorStatus> last = PredictorStatusOf(stub);
  ADD_FAILURE() << "timed out; last status: "
                << (last.has_value() ? last->DebugString() : "none");
  return std::nullopt;
}

struct AppliedVersion {
  int64_t from = 0;
  int64_t to = 0;
  int64_t rows = 0;
  bool dense = false;
  bool all_rows = false;
  std::string run_id;
};

std::vector<AppliedVersion> ReadApplyLog(const std::string& path) {
  std::vector<AppliedVersion> log;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    AppliedVersion applied;
    int dense = 0, all_rows = 0;
    fields >> applied.from >> applied.to >> applied.rows >> dense >> all_rows >>
        applied.run_id;
    EXPECT_FALSE(fields.fail()) << "bad apply log line: " << line;
    applied.dense = dense != 0;
    applied.all_rows = all_rows != 0;
    log.push_back(applied);
  }
  return log;
}

// Every applied increment starts where the previous version ended: nothing
// missed, nothing applied twice. A full read (all_rows) replaces everything;
// it may start before (a redelivery) but never after the previous end.
void ExpectNoGap(const std::vector<AppliedVersion>& log) {
  ASSERT_FALSE(log.empty());
  EXPECT_TRUE(log[0].all_rows);
  for (size_t i = 1; i < log.size(); ++i) {
    if (log[i].all_rows) {
      EXPECT_LE(log[i].from, log[i - 1].to) << "line " << i + 1;
    } else {
      EXPECT_EQ(log[i].from, log[i - 1].to) << "line " << i + 1;
      EXPECT_GT(log[i].to, log[i].from) << "line " << i + 1;
    }
  }
}

bool ExitedCleanly(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

// Each test in its own directory, with a trainer config that has the
// predictor as an acknowledged consumer and checkpoints every 20 steps.
class PredictorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = TestTempDir() + "/predictor_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    FILE* f = std::fopen((work_ + "/trainer.textproto").c_str(), "w");
    std::fputs(
        "tracker { consumers: \"predictor\" acknowledged_reads: true }\n"
        "checkpoints { every_steps: 20 }\n"
        "log_every_steps: 0\n",
        f);
    std::fclose(f);
  }

  std::vector<std::string> TrainerFlags(const std::string& listen = "") const {
    std::vector<std::string> flags = {
        "--config=" + work_ + "/trainer.textproto", "--steps=-1",
        "--checkpoint_dir=" + work_ + "/run"};
    if (!listen.empty()) flags.push_back("--listen=" + listen);
    return flags;
  }

  std::vector<std::string> PredictorFlags(
      const ServerProcess& trainer, const std::string& replica_db = "") const {
    std::vector<std::string> flags = {"--target=" + trainer.target(),
                                      "--apply_log=" + apply_log()};
    if (!replica_db.empty()) flags.push_back("--replica_db=" + replica_db);
    return flags;
  }

  std::string apply_log() const { return work_ + "/apply.log"; }

  std::string work_;
};

TEST_F(PredictorTest, FollowsTheTrainerAndBootstrapsAgainAfterAKill) {
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);

  int64_t version_before_kill = 0;
  {
    ServerProcess predictor(PredictorFlags(trainer), "clients/predictor");
    ASSERT_GT(predictor.port(), 0);
    std::unique_ptr<Stub> stub = Connect(predictor);
    std::optional<v1::PredictorStatus> ready =
        WaitFor(*stub, [](const v1::PredictorStatus& s) { return s.ready(); });
    ASSERT_TRUE(ready.has_value());
    EXPECT_EQ(ready->consumer(), "predictor");
    EXPECT_TRUE(ready->has_dense());
    ASSERT_EQ(ready->tables_size(), 8);
    for (const v1::TableRowCount& table : ready->tables()) {
      EXPECT_EQ(table.rows(), 100000) << table.fqn();  // the full read
    }
    // The version advances with the trainer, with freshness measured.
    std::optional<v1::PredictorStatus> moving =
        WaitFor(*stub, [&](const v1::PredictorStatus& s) {
          return s.version() >= ready->version() + 20 &&
                 s.freshness_samples() >= 5;
        });
    ASSERT_TRUE(moving.has_value());
    EXPECT_GT(moving->freshness_p99_ms(), 0);
    EXPECT_GE(moving->freshness_max_ms(), moving->freshness_p99_ms());
    EXPECT_GE(moving->freshness_p99_ms(), moving->freshness_p50_ms());
    EXPECT_GE(moving->trainer_batch(), moving->version());
    EXPECT_GE(moving->applied_deltas(), 2);
    EXPECT_GT(moving->bytes_received(), 0);
    EXPECT_EQ(moving->resyncs(), 0);
    EXPECT_FALSE(moving->run_id().empty());

    // Lookups: rows of the table's width, missing IDs named, unknown tables
    // refused.
    const std::string fqn = moving->tables(0).fqn();
    v1::LookupRequest request;
    request.set_fqn(fqn);
    ASSERT_TRUE(
        EncodeTensor(at::tensor(std::vector<int64_t>{0, 99999, 1000000000},
                                at::TensorOptions(at::kLong)),
                     request.mutable_ids())
            .ok());
    v1::LookupResponse response;
    {
      grpc::ClientContext context;
      ASSERT_TRUE(stub->Lookup(&context, request, &response).ok());
    }
    absl::StatusOr<at::Tensor> rows = DecodeTensor(response.rows());
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(rows->sizes(), (at::IntArrayRef{3, 16}));
    EXPECT_EQ(rows->scalar_type(), at::kFloat);
    ASSERT_EQ(response.missing_ids_size(), 1);
    EXPECT_EQ(response.missing_ids(0), 1000000000);
    EXPECT_GE(response.version(), moving->version());
    EXPECT_GT(at::abs(*rows).sum().item<float>(), 0);
    request.set_fqn("no.such.table");
    {
      grpc::ClientContext context;
      EXPECT_EQ(stub->Lookup(&context, request, &response).error_code(),
                grpc::StatusCode::NOT_FOUND);
    }
    v1::GetDenseResponse dense;
    {
      grpc::ClientContext context;
      ASSERT_TRUE(stub->GetDense(&context, v1::GetDenseRequest(), &dense).ok());
    }
    EXPECT_GT(dense.parameters_size(), 0);
    EXPECT_GE(dense.version(), moving->version());
    version_before_kill = moving->version();
    predictor.Stop(SIGKILL);
  }

  // An in-memory predictor starts empty again: it bootstraps with a full
  // read and goes on from there.
  ServerProcess predictor(PredictorFlags(trainer), "clients/predictor");
  ASSERT_GT(predictor.port(), 0);
  std::unique_ptr<Stub> stub = Connect(predictor);
  std::optional<v1::PredictorStatus> resumed =
      WaitFor(*stub, [&](const v1::PredictorStatus& s) {
        return s.ready() && s.version() > version_before_kill &&
               s.applied_deltas() >= 3;
      });
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->resyncs(), 0);  // a bootstrap, not a resync
  EXPECT_TRUE(ExitedCleanly(predictor.Stop(SIGTERM)));

  const std::vector<AppliedVersion> log = ReadApplyLog(apply_log());
  ExpectNoGap(log);
  int full_reads = 0;
  for (const AppliedVersion& applied : log) {
    full_reads += applied.all_rows;
    EXPECT_TRUE(applied.dense);  // dense parameters with every version
    EXPECT_EQ(applied.run_id, log[0].run_id);
  }
  EXPECT_EQ(full_reads, 2);
  EXPECT_TRUE(ExitedCleanly(trainer.Stop(SIGTERM)));
}

TEST_F(PredictorTest, RocksDbReplicaResumesAfterAKill) {
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string db = work_ + "/replica";
  int64_t version_before_kill = 0;
  {
    ServerProcess predictor(PredictorFlags(trainer, db), "clients/predictor");
    ASSERT_GT(predictor.port(), 0);
    std::unique_ptr<Stub> stub = Connect(predictor);
    std::optional<v1::PredictorStatus> ready =
        WaitFor(*stub, [](const v1::PredictorStatus& s) {
          return s.ready() && s.applied_deltas() >= 3;
        });
    ASSERT_TRUE(ready.has_value());
    version_before_kill = ready->version();
    predictor.Stop(SIGKILL);
  }
  ServerProcess predictor(PredictorFlags(trainer, db), "clients/predictor");
  ASSERT_GT(predictor.port(), 0);
  std::unique_ptr<Stub> stub = Connect(predictor);
  // Ready at once from disk, at the version it had (or one it had durably
  // applied just before the kill), then on with the trainer.
  std::optional<v1::PredictorStatus> reopened = PredictorStatusOf(*stub);
  ASSERT_TRUE(reopened.has_value());
  EXPECT_GE(reopened->version(), version_before_kill);
  EXPECT_TRUE(reopened->has_dense());
  std::optional<v1::PredictorStatus> moving =
      WaitFor(*stub, [&](const v1::PredictorStatus& s) {
        return s.ready() && s.applied_deltas() >= 2;
      });
  ASSERT_TRUE(moving.has_value());
  EXPECT_EQ(moving->resyncs(), 0);
  EXPECT_TRUE(ExitedCleanly(predictor.Stop(SIGTERM)));

  const std::vector<AppliedVersion> log = ReadApplyLog(apply_log());
  ASSERT_FALSE(log.empty());
  int full_reads = 0;
  for (const AppliedVersion& applied : log) full_reads += applied.all_rows;
  EXPECT_EQ(full_reads, 1);  // the reopened replica did not start over
  for (size_t i = 1; i < log.size(); ++i) {
    // A kill between a durable apply and its log line leaves the log short
    // (from > the previous end) but never overlapping or out of order.
    EXPECT_GE(log[i].from, log[i - 1].to) << "line " << i + 1;
  }
  EXPECT_TRUE(ExitedCleanly(trainer.Stop(SIGTERM)));
}

TEST_F(PredictorTest, ResyncsWhenTheTrainerRestartsBehindIt) {
  std::optional<ServerProcess> trainer;
  trainer.emplace(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer->port(), 0);
  const int port = trainer->port();
  ServerProcess predictor(PredictorFlags(*trainer), "clients/predictor");
  ASSERT_GT(predictor.port(), 0);
  std::unique_ptr<Stub> stub = Connect(predictor);
  std::optional<v1::PredictorStatus> before =
      WaitFor(*stub, [](const v1::PredictorStatus& s) {
        return s.ready() && s.version() >= 30;
      });
  ASSERT_TRUE(before.has_value());

  // Killed, the trainer restarts from its last checkpoint and snapshot
  // (every 20 steps), usually behind what the predictor holds, on the same
  // port.
  trainer->Stop(SIGKILL);
  trainer.reset();
  std::optional<v1::PredictorStatus> at_kill = PredictorStatusOf(*stub);
  ASSERT_TRUE(at_kill.has_value());
  const std::string restart_log = work_ + "/restarted_trainer.err";
  trainer.emplace(TrainerFlags("127.0.0.1:" + std::to_string(port)),
                  "trainer/trainer", restart_log);
  ASSERT_EQ(trainer->port(), port);
  std::optional<v1::PredictorStatus> after =
      WaitFor(*stub, [&](const v1::PredictorStatus& s) {
        return s.ready() && s.run_id() != before->run_id() &&
               s.version() > at_kill->version();
      });
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->reconnects(), 1);
  // Lookups went on meanwhile, and go on.
  v1::LookupRequest request;
  request.set_fqn(after->tables(0).fqn());
  ASSERT_TRUE(EncodeTensor(at::arange(10, at::TensorOptions(at::kLong)),
                           request.mutable_ids())
                  .ok());
  v1::LookupResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Lookup(&context, request, &response).ok());
  EXPECT_EQ(response.missing_ids_size(), 0);
  EXPECT_EQ(response.run_id(), after->run_id());
  EXPECT_TRUE(ExitedCleanly(predictor.Stop(SIGTERM)));

  const std::vector<AppliedVersion> log = ReadApplyLog(apply_log());
  ExpectNoGap(log);
  // The replica must start over when the new run starts before the version
  // it held (the run restored from an older snapshot), or when the trainer
  // says its snapshot and checkpoint disagree (a kill between the two
  // writes); otherwise it goes on from its version.
  int64_t held = -1;
  bool resynced = false;
  for (const AppliedVersion& applied : log) {
    if (applied.run_id == log[0].run_id) held = applied.to;
    resynced =
        resynced || (applied.all_rows && applied.run_id != log[0].run_id);
  }
  const std::string restart = ReadText(restart_log);
  const bool told_to_resync =
      restart.find("told to resync") != std::string::npos;
  const size_t at = restart.find("restored tracker snapshot ");
  ASSERT_NE(at, std::string::npos) << restart;
  int64_t restored_batch = -1;
  ASSERT_EQ(
      std::sscanf(restart.c_str() + at,
                  "restored tracker snapshot %*d (batch %ld", &restored_batch),
      1)
      << restart;
  EXPECT_EQ(resynced, told_to_resync || restored_batch < held)
      << "held version " << held << ", restarted trainer:\n"
      << restart;
  if (resynced) {
    EXPECT_GE(after->resyncs(), 1);
  }
}

// A cause of resyncs that persists (here a memory cap that drops the
// consumer's unread rows every step) paces the reads of every row: 1 s,
// then 2 s, 4 s... after one that no push could follow (they came back to
// back, each pinning the trainer's rows).
TEST_F(PredictorTest, ResyncsThatDoNotHelpArePaced) {
  std::ofstream(work_ + "/trainer.textproto")
      << "tracker { consumers: \"predictor\" acknowledged_reads: true "
         "memory_cap_bytes: 1 }\n"
         "log_every_steps: 0\n";
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string log = work_ + "/predictor.log";
  ServerProcess predictor(PredictorFlags(trainer), "clients/predictor", log);
  ASSERT_GT(predictor.port(), 0);
  std::unique_ptr<Stub> stub = Connect(predictor);
  std::optional<v1::PredictorStatus> resynced = WaitFor(
      *stub, [](const v1::PredictorStatus& s) { return s.resyncs() >= 1; });
  ASSERT_TRUE(resynced.has_value());
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(6));
  std::optional<v1::PredictorStatus> later = PredictorStatusOf(*stub);
  ASSERT_TRUE(later.has_value());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // Waits of 1, 2 and 4 s: at most 3 more in about 6 s (unpaced, a read of
  // every row of this model takes well under a second).
  EXPECT_LE(later->resyncs() - resynced->resyncs(), 3)
      << "in " << seconds << " s";
  EXPECT_TRUE(ExitedCleanly(predictor.Stop(SIGTERM)));
  EXPECT_NE(ReadText(log).find("resync again in 1000 ms"), std::string::npos)
      << ReadText(log);
}

// A consumer name the trainer refuses ends the predictor with the trainer's
// one line (it retried it every second, for good, never ready), and exit 2:
// a restart would be refused again.
TEST_F(PredictorTest, AConsumerNameTheTrainerRefusesEndsIt) {
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const CommandResult result =
      RunCommand("timeout 60 " + RunfilePath("clients/predictor") +
                 " --target=" + trainer.target() + " --consumer='no good'");
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("consumer name"), std::string::npos) << result.err;
}

TEST(PredictorFlagsTest, BadFlagsExitTwo) {
  const std::string predictor = RunfilePath("clients/predictor");
  for (const std::string& args :
       {std::string("--target=127.0.0.1:1 --no_such_flag=1"),
        std::string("--target=127.0.0.1:1 --every_ms=soon"),
        std::string("--target=127.0.0.1:1 --every_ms=-5"),
        std::string("--target=127.0.0.1:1 --every_ms=40000000000"),
        std::string("--target=127.0.0.1:1 --dense_every_steps=2000000000000"),
        std::string("--consumer=predictor"),
        std::string("--target=127.0.0.1:1 stray")}) {
    CommandResult result = RunCommand(predictor + " " + args);
    EXPECT_EQ(result.exit_code, 2) << args << ": " << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << args << ": " << result.err;
    EXPECT_TRUE(result.out.empty()) << args;
  }
}

TEST(PredictorFlagsTest, ASecondPredictorOnAnAddressInUseExitsTwo) {
  // The first one serves lookups while it keeps trying to reach a trainer
  // that is not there.
  ServerProcess first({"--target=127.0.0.1:1"}, "clients/predictor");
  ASSERT_GT(first.port(), 0);
  const CommandResult second =
      RunCommand(RunfilePath("clients/predictor") +
                 " --target=127.0.0.1:1 --listen=127.0.0.1:" +
                 std::to_string(first.port()));
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_EQ(std::count(second.err.begin(), second.err.end(), '\n'), 1)
      << second.err;
  EXPECT_TRUE(second.out.empty()) << second.out;
  // The first still answers.
  std::unique_ptr<Stub> stub = Connect(first);
  EXPECT_TRUE(PredictorStatusOf(*stub).has_value());
}

}  // namespace
}  // namespace deltastream
