// Exactness, end to end: the real trainer (with its in-process tracker
// service), predictors and a checkpoint job, each its own process on
// loopback. After a few hundred steps, the trainer's final tables (its own
// full checkpoint, written at SIGTERM) must equal, bit for bit:
//   - every predictor's replica (read through its lookup API), and its dense
//     parameters the trainer's;
//   - the checkpoint chain (base + increments, LoadChain).
// The first test kills the trainer (SIGKILL) mid-run and restarts it from its
// last snapshot and checkpoint, and kills and restarts the predictor; the
// apply log must show nothing missed and nothing applied twice. The second
// runs 2 predictors and 1 checkpoint job reading at different rates with
// delete-on-read, and checks that the store stays bounded by the slowest
// consumer's lag. Others bootstrap a predictor from the chain, and stream
// float64 tables.
#include <ATen/core/Tensor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"
#include "proto/predictor.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "trainer/checkpoint.h"
#include "trainer/model_verification.h"

namespace deltastream {
namespace {

int64_t TrainerBatch(const std::string& target) {
  auto client = DeltaClient::Create(target);
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  return status.ok() ? status->current_batch() : -1;
}

// Waits until the trainer at `target` is past `batch`.
bool WaitForBatch(const std::string& target, int64_t batch,
                  int timeout_s = 120) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (TrainerBatch(target) >= batch) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Waits until the chain in `dir` has its full link (the checkpoint job
// writes it from its first read, 800000 rows: it may finish after the
// trainer ran on).
bool WaitForFullLink(const std::string& dir, int timeout_s = 120) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
    if (links.ok() && !links->empty() && links->front().full) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A predictor's lookup API.
class PredictorClient {
 public:
  explicit PredictorClient(int port)
      : stub_(v1::ReplicaLookup::NewStub(
            grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                grpc::InsecureChannelCredentials()))) {}

  v1::PredictorStatus Status() {
    grpc::ClientContext context;
    v1::PredictorStatus status;
    stub_->Status(&context, {}, &status);
    return status;
  }

  // Waits until the replica is at `version` or later.
  bool WaitForVersion(int64_t version, int timeout_s = 60) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Status().version() >= version) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  std::unique_ptr<v1::ReplicaLookup::Stub> stub_;
};

// The trainer's final model: its newest full checkpoint.
CheckpointModel FinalModel(const std::string& run_dir) {
  std::optional<std::string> path =
      LatestCheckpoint(run_dir + "/checkpoints").value();
  EXPECT_TRUE(path.has_value());
  absl::StatusOr<CheckpointModel> model =
      ReadCheckpointModel(path.value_or(""));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : CheckpointModel();
}

// The predictor's apply log ("<from> <to> <rows> <dense> <all_rows> <run>"
// per applied version): increments follow each other with no gap and no
// overlap; a full read (bootstrap, resync) starts the count again.
void ExpectApplyLogContiguous(const std::string& path, int64_t final_batch) {
  std::istringstream log(ReadText(path));
  std::string line;
  int64_t applied_to = -1, lines = 0, full_reads = 0;
  while (std::getline(log, line)) {
    std::istringstream fields(line);
    int64_t from = 0, to = 0, rows = 0, dense = 0, all_rows = 0;
    std::string run;
    ASSERT_TRUE(fields >> from >> to >> rows >> dense >> all_rows >> run)
        << line;
    ++lines;
    EXPECT_EQ(dense, 1) << "a version without dense parameters: " << line;
    if (all_rows == 1) {
      ++full_reads;
    } else {
      EXPECT_EQ(from, applied_to) << "gap or overlap at: " << line;
    }
    // A full read may cover no new batch (right after a restart).
    if (all_rows == 1) {
      EXPECT_GE(to, from) << line;
    } else {
      EXPECT_GT(to, from) << line;
    }
    applied_to = to;
  }
  EXPECT_GE(full_reads, 1);
  EXPECT_GT(lines, full_reads);
  EXPECT_EQ(applied_to, final_batch);
}

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = TestTempDir() + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
  }

  // The trainer on the embedded defaults (DLRM, 8 tables of 100000 x 16,
  // row-wise Adagrad), or on `model`, with the given tracker settings.
  std::vector<std::string> TrainerFlags(const std::string& tracker,
                                        const std::string& model = "") {
    const std::string config = work_ + "/trainer.textproto";
    WriteText(config, model + "\ntracker { mode: \"rowwise_adagrad\" " +
                          tracker +
                          " drain_seconds: 60 }\n"
                          "checkpoints { every_steps: 40 }\n"
                          "log_every_steps: 100\n");
    return {"--config=" + config, "--steps=-1",
            "--checkpoint_dir=" + work_ + "/run"};
  }

  std::vector<std::string> PredictorFlags(const std::string& target,
                                          const std::string& consumer,
                                          int every_ms) {
    return {"--target=" + target, "--consumer=" + consumer,
            "--every_ms=" + std::to_string(every_ms),
            "--apply_log=" + work_ + "/" + consumer + ".applied"};
  }

  std::string JobCommand(const std::string& target, int every_ms) {
    return RunfilePath("clients/checkpoint_job") + " --target=" + target +
           " --consumer=checkpoint --dir=" + work_ +
           "/chain --every_ms=" + std::to_string(every_ms);
  }

  std::string work_;
};

TEST_F(EndToEndTest, ReplicaAndChainEqualTheTrainerAcrossCrashes) {
  std::vector<std::string> trainer_flags = TrainerFlags(
      "consumers: \"predictor\" consumers: \"checkpoint\" "
      "acknowledged_reads: true");
  auto trainer =
      std::make_unique<ServerProcess>(trainer_flags, "trainer/trainer");
  ASSERT_GT(trainer->port(), 0);
  std::string target = trainer->target();
  auto predictor = std::make_unique<ServerProcess>(
      PredictorFlags(target, "predictor", 100), "clients/predictor");
  ASSERT_GT(predictor->port(), 0);
  auto job =
      std::make_unique<Background>(JobCommand(target, 300), work_ + "/job1");

  // Run 1: killed without warning after its snapshot at step 80.
  ASSERT_TRUE(WaitForBatch(target, 110));
  trainer->Stop(SIGKILL);
  job->Stop(SIGKILL);

  // Run 2, on the same address, restores step 80: the predictor, which
  // keeps running, holds changes of steps the trainer lost and must resync;
  // the job (restarted: it ends when the trainer goes away) drops the links
  // the trainer lost.
  trainer_flags.push_back("--listen=" + target);
  trainer = std::make_unique<ServerProcess>(trainer_flags, "trainer/trainer");
  ASSERT_GT(trainer->port(), 0);
  ASSERT_EQ(trainer->target(), target);
  job = std::make_unique<Background>(JobCommand(target, 300), work_ + "/job2");
  ASSERT_TRUE(WaitForBatch(target, 200));
  // The predictor restarts again mid-run, on the same trainer.
  predictor->Stop(SIGKILL);
  predictor = std::make_unique<ServerProcess>(
      PredictorFlags(target, "predictor", 100), "clients/predictor");
  ASSERT_GT(predictor->port(), 0);
  ASSERT_TRUE(WaitForBatch(target, 300));

  // SIGTERM: the trainer finishes its step, writes its checkpoint, and keeps
  // serving until both consumers have read (and committed) its final batch.
  EXPECT_EQ(trainer->Stop(SIGTERM), 0);
  job->Stop(SIGTERM);
  const CheckpointModel model = FinalModel(work_ + "/run");
  ASSERT_GE(model.step, 300);
  ASSERT_EQ(model.tables.size(), 8u);

  PredictorClient lookup(predictor->port());
  ASSERT_TRUE(lookup.WaitForVersion(model.step));
  absl::StatusOr<Verified> replica = VerifyReplica(model, predictor->target());
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(replica->rows, 800000);
  EXPECT_GT(replica->dense_parameters, 0);
  const v1::PredictorStatus status = lookup.Status();
  EXPECT_GT(status.freshness_samples(), 0);
  EXPECT_GT(status.freshness_p99_ms(), 0);
  ExpectApplyLogContiguous(work_ + "/predictor.applied", model.step);
  absl::StatusOr<Verified> chain = VerifyChain(model, work_ + "/chain");
  EXPECT_TRUE(chain.ok()) << chain.status() << "\n" << job->out() << job->err();
}

TEST_F(EndToEndTest, PredictorBootstrappedFromTheChainEqualsTheTrainer) {
  // A predictor (re)starting with an empty replica loads the checkpoint
  // job's chain instead of a full read of the trainer, then follows the
  // trainer from its consumer's cursor.
  ServerProcess trainer(
      TrainerFlags("consumers: \"predictor\" consumers: \"checkpoint\" "
                   "acknowledged_reads: true"),
      "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string target = trainer.target();
  Background job(JobCommand(target, 300), work_ + "/job");
  ASSERT_TRUE(WaitForBatch(target, 60));
  ASSERT_TRUE(WaitForFullLink(work_ + "/chain")) << job.err();
  std::vector<std::string> flags = PredictorFlags(target, "predictor", 100);
  flags.push_back("--bootstrap_chain=" + work_ + "/chain");
  ServerProcess predictor(flags, "clients/predictor", work_ + "/predictor.err");
  ASSERT_GT(predictor.port(), 0);
  // Once bootstrapped, it follows the trainer for another 60 steps at least.
  PredictorClient lookup(predictor.port());
  ASSERT_TRUE(lookup.WaitForVersion(0));
  const int64_t bootstrapped = TrainerBatch(target);
  ASSERT_TRUE(WaitForBatch(target, std::max<int64_t>(bootstrapped, 90) + 60));

  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
  job.Stop(SIGTERM);
  const CheckpointModel model = FinalModel(work_ + "/run");
  ASSERT_GE(model.step, 150);
  ASSERT_TRUE(lookup.WaitForVersion(model.step));
  const std::string log = ReadText(work_ + "/predictor.err");
  EXPECT_NE(log.find("rows from the chain in"), std::string::npos) << log;
  EXPECT_EQ(log.find("full read"), std::string::npos) << log;
  EXPECT_EQ(lookup.Status().resyncs(), 0);
  absl::StatusOr<Verified> replica = VerifyReplica(model, predictor.target());
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(replica->rows, 800000);
  ExpectApplyLogContiguous(work_ + "/predictor.applied", model.step);
}

TEST_F(EndToEndTest, DoubleTablesStreamBitForBit) {
  // Tables configured as "double" travel as float64 (proto/tensor.proto):
  // replicas in memory and in RocksDB, and the chain, equal the trainer.
  ServerProcess trainer(
      TrainerFlags("consumers: \"memory\" consumers: \"rocksdb\" "
                   "consumers: \"checkpoint\" acknowledged_reads: true",
                   "model { tables { name: \"d\" num_embeddings: 20000 "
                   "embedding_dim: 8 dtype: \"double\" } tables { name: \"f\" "
                   "num_embeddings: 20000 embedding_dim: 8 } }"),
      "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string target = trainer.target();
  ServerProcess memory(PredictorFlags(target, "memory", 100),
                       "clients/predictor");
  std::vector<std::string> rocksdb_flags =
      PredictorFlags(target, "rocksdb", 100);
  rocksdb_flags.push_back("--replica_db=" + work_ + "/replica");
  ServerProcess rocksdb(rocksdb_flags, "clients/predictor");
  ASSERT_GT(memory.port(), 0);
  ASSERT_GT(rocksdb.port(), 0);
  Background job(JobCommand(target, 300), work_ + "/job");
  ASSERT_TRUE(WaitForBatch(target, 150));

  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
  job.Stop(SIGTERM);
  const CheckpointModel model = FinalModel(work_ + "/run");
  ASSERT_GE(model.step, 150);
  int double_tables = 0;
  for (const auto& [name, table] : model.tables) {
    double_tables += table.scalar_type() == at::kDouble;
  }
  EXPECT_EQ(double_tables, 1);
  for (ServerProcess* predictor : {&memory, &rocksdb}) {
    PredictorClient lookup(predictor->port());
    ASSERT_TRUE(lookup.WaitForVersion(model.step));
    absl::StatusOr<Verified> replica =
        VerifyReplica(model, predictor->target());
    ASSERT_TRUE(replica.ok()) << replica.status();
    EXPECT_EQ(replica->rows, 40000);
  }
  absl::StatusOr<Verified> chain = VerifyChain(model, work_ + "/chain");
  EXPECT_TRUE(chain.ok()) << chain.status() << "\n" << job.out() << job.err();
}

TEST_F(EndToEndTest, ConsumersAtDifferentRatesKeepTheStoreBounded) {
  std::vector<std::string> trainer_flags = TrainerFlags(
      "consumers: \"fast\" consumers: \"slow\" consumers: \"checkpoint\" "
      "acknowledged_reads: true");
  ServerProcess trainer(trainer_flags, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string target = trainer.target();
  ServerProcess fast(PredictorFlags(target, "fast", 50), "clients/predictor");
  ServerProcess slow(PredictorFlags(target, "slow", 1000), "clients/predictor");
  ASSERT_GT(fast.port(), 0);
  ASSERT_GT(slow.port(), 0);
  Background job(JobCommand(target, 2000), work_ + "/job");

  // Sample the store while the trainer runs 300 steps.
  auto client = DeltaClient::Create(target);
  int64_t samples = 0, worst_bytes = 0, worst_lag = 0;
  while (true) {
    absl::StatusOr<v1::StatusResponse> status = client->Status();
    ASSERT_TRUE(status.ok()) << status.status();
    int64_t slowest_lag = 0;
    std::string lags;
    for (const v1::ConsumerStatus& consumer : status->consumers()) {
      slowest_lag = std::max(slowest_lag, consumer.lag_steps());
      lags +=
          " " + consumer.name() + ":" + std::to_string(consumer.lag_steps());
    }
    // What the slowest consumer has not read bounds what the store holds
    // (compaction only shrinks it): row-wise Adagrad records per ID 8 bytes
    // and a 4-byte state; a batch looks up 512 IDs in each of 8 tables. On
    // top, each compacted lookup (one per interval between consumers'
    // cursors and pending reads: at most 2 * 3 + 1) keeps a row index of 4
    // bytes per table row while IDs are small (store/row_index.h).
    const int64_t index_bytes = (2 * 3 + 1) * int64_t{8} * 100000 * 4;
    const int64_t bound = index_bytes + (slowest_lag + 2) * 512 * 8 * 12;
    EXPECT_LE(status->bytes(), bound)
        << "at batch " << status->current_batch() << ", lags" << lags;
    worst_bytes = std::max(worst_bytes, status->bytes());
    worst_lag = std::max(worst_lag, slowest_lag);
    ++samples;
    if (status->current_batch() >= 300) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(worst_bytes, 0);
  // The slow readers lag by their period, not by the run.
  EXPECT_LT(worst_lag, 280);
  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
  job.Stop(SIGTERM);
  const CheckpointModel model = FinalModel(work_ + "/run");
  ASSERT_GE(model.step, 300);
  for (ServerProcess* predictor : {&fast, &slow}) {
    PredictorClient lookup(predictor->port());
    ASSERT_TRUE(lookup.WaitForVersion(model.step));
    absl::StatusOr<Verified> replica =
        VerifyReplica(model, predictor->target());
    EXPECT_TRUE(replica.ok()) << replica.status();
  }
  absl::StatusOr<Verified> chain = VerifyChain(model, work_ + "/chain");
  EXPECT_TRUE(chain.ok()) << chain.status() << "\n" << job.out() << job.err();
  std::printf(
      "%lld samples: store at most %lld bytes, slowest lag %lld steps\n",
      static_cast<long long>(samples), static_cast<long long>(worst_bytes),
      static_cast<long long>(worst_lag));
}

}  // namespace
}  // namespace deltastream
