// A trainer started from a checkpoint chain (checkpoints.restore_chain, with
// no checkpoint of its own) against the real processes on loopback: a first
// trainer trains a finite Criteo file while clients:checkpoint_job writes a
// chain and --drain_s keeps it serving until the job has read its last step;
// a second trainer, with an empty checkpoint dir, restores the chain. Its
// model is the chain bit for bit (the data is fast-forwarded past the chain's
// steps and ends there, so it trains nothing and its final checkpoint is the
// restored model), and its tracker, which recorded none of the chain's
// changes, tells every consumer behind the chain's end to resync on its next
// read (once: the read after that is an ordinary one).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "clients/checkpoint_chain.h"
#include "tests/integration/server_process.h"
#include "trainer/checkpoint.h"
#include "trainer/model_verification.h"

namespace deltastream {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr int kBatchSize = 8;
// Training batches of the data; one more before them is held out (AUC).
constexpr int kSteps = 12;

// Criteo lines: one held-out batch, then kSteps batches to train. IDs of
// cat_0 and cat_1 spread over their tables (the other features' tables are
// not in the model).
std::string CriteoData() {
  std::vector<std::string> lines;
  for (int i = 0; i < (kSteps + 1) * kBatchSize; ++i) {
    std::vector<std::string> fields = {std::to_string(i % 3 == 0 ? 1 : 0)};
    for (int d = 0; d < 13; ++d) fields.push_back(std::to_string((i + d) % 7));
    fields.push_back(absl::StrCat(absl::Hex((i * 7919 + 13) % 5000)));
    fields.push_back(absl::StrCat(absl::Hex((i * 104729 + 7) % 3000)));
    for (int c = 2; c < 26; ++c) fields.push_back("a");
    lines.push_back(absl::StrJoin(fields, "\t"));
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

// A plan for two ranks over tables c0 and c1 of `rows` x `dim` (dim even):
// c0 split by rows, c1 by columns with rank 1's block first.
std::string TwoRankPlan(int64_t rows, int64_t dim) {
  const int64_t half_rows = rows / 2, half_dim = dim / 2;
  return absl::StrFormat(
      "world_size: 2\n"
      "tables { table: \"c0\" sharding_type: ROW_WISE num_embeddings: %d "
      "embedding_dim: %d\n"
      "  shards { rank: 0 row_offset: 0 rows: %d col_offset: 0 cols: %d }\n"
      "  shards { rank: 1 row_offset: %d rows: %d col_offset: 0 cols: %d } }\n"
      "tables { table: \"c1\" sharding_type: COLUMN_WISE num_embeddings: %d "
      "embedding_dim: %d\n"
      "  shards { rank: 1 row_offset: 0 rows: %d col_offset: 0 cols: %d }\n"
      "  shards { rank: 0 row_offset: 0 rows: %d col_offset: %d cols: %d } }\n",
      rows, dim, half_rows, dim, half_rows, rows - half_rows, dim, rows, dim,
      rows, half_dim, rows, half_dim, dim - half_dim);
}

// One read of `consumer` (deltactl get --json): its header fields.
json Get(const ServerProcess& trainer, const std::string& consumer) {
  CommandResult result = RunCommand(RunfilePath("clients/deltactl") +
                                    " --target=" + trainer.target() +
                                    " get --json --consumer=" + consumer);
  EXPECT_EQ(result.exit_code, 0) << consumer << ": " << result.err;
  return json::parse(result.out.empty() ? "{}" : result.out);
}

// The end batch of the chain in `dir` (-1: no link yet).
int64_t ChainEnd(const std::string& dir) {
  int64_t end = -1;
  for (const ChainLink& link :
       ListChain(dir).value_or(std::vector<ChainLink>())) {
    end = std::max(end, link.end_batch);
  }
  return end;
}

TEST(RestoreChainTest, ModelIsTheChainAndConsumersBehindItResync) {
  const auto started = std::chrono::steady_clock::now();
  const std::string work = TestTempDir() + "/restore_chain_test";
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  WriteText(work + "/data.tsv", CriteoData());
  const std::string config = work + "/trainer.textproto";
  WriteText(config,
            "model { kind: \"dlrm\"\n"
            "  tables { name: \"c0\" num_embeddings: 1000 embedding_dim: 4 "
            "feature_names: \"cat_0\" }\n"
            "  tables { name: \"c1\" num_embeddings: 1000 embedding_dim: 4 "
            "feature_names: \"cat_1\" } }\n"
            "data { batch_size: " +
                std::to_string(kBatchSize) +
                " eval_batches: 1 criteo { paths: [\"" + work +
                "/data.tsv\"] } }\n"
                "log_every_steps: 0\n");
  const std::string chain = work + "/chain";

  // (1) The chain: the trainer trains every batch of the data, then serves
  // until the job has read through its last step.
  {
    ServerProcess trainer({"--config=" + config, "--steps=-1",
                           "--consumers=checkpoint", "--drain_s=60"},
                          "trainer/trainer", work + "/first.err");
    ASSERT_GT(trainer.port(), 0) << ReadText(work + "/first.err");
    Background job(RunfilePath("clients/checkpoint_job") +
                       " --target=" + trainer.target() + " --dir=" + chain +
                       " --every_ms=100 --count=0 --retry_s=60",
                   work + "/job");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ChainEnd(chain) < kSteps &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(trainer.Stop(SIGTERM), 0) << ReadText(work + "/first.err");
    EXPECT_EQ(job.Stop(SIGTERM), 0) << job.err();
    ASSERT_EQ(ChainEnd(chain), kSteps)
        << job.out() << job.err() << ReadText(work + "/first.err");
  }
  absl::StatusOr<LoadedChain> loaded = LoadChain(chain);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->end_batch, kSteps);
  ASSERT_EQ(loaded->dense_batch, kSteps);

  // (2) A trainer with no checkpoint of its own starts from the chain; two
  // consumers start behind its end (a configured consumer's cursor is at
  // the start).
  const std::string run = work + "/run";
  ServerProcess trainer({"--config=" + config, "--steps=-1",
                         "--checkpoint_dir=" + run, "--restore_chain=" + chain,
                         "--consumers=predictor,ranker", "--drain_s=60"},
                        "trainer/trainer", work + "/second.err");
  ASSERT_GT(trainer.port(), 0) << ReadText(work + "/second.err");
  // The chain's changes are in the model but not in the tracker: a
  // consumer behind the chain's end is told to resync on its next read...
  const json first = Get(trainer, "predictor");
  EXPECT_EQ(first.value("resync_required", false), true) << first.dump();
  EXPECT_EQ(first.value("end_batch", int64_t{-1}), kSteps) << first.dump();
  EXPECT_EQ(first.value("run_start_batch", int64_t{-1}), kSteps)
      << first.dump();
  // ... once: its read (not acknowledged) took it to the end.
  const json second = Get(trainer, "predictor");
  EXPECT_EQ(second.value("resync_required", true), false) << second.dump();
  EXPECT_EQ(second.value("start_batch", int64_t{-1}), kSteps) << second.dump();
  EXPECT_EQ(second.value("end_batch", int64_t{-1}), kSteps) << second.dump();
  // Every consumer behind it, not only the first to read.
  const json other = Get(trainer, "ranker");
  EXPECT_EQ(other.value("resync_required", false), true) << other.dump();
  // Every consumer has read the final batch: the drain ends, and so does
  // the trainer.
  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
  const std::string log = ReadText(work + "/second.err");
  EXPECT_THAT(log, HasSubstr("restored checkpoint chain " + chain));
  const std::string told =
      absl::StrCat("the model is at the chain's end batch ", kSteps,
                   " but the tracker at batch 0");
  EXPECT_THAT(log, HasSubstr(told)) << log;
  EXPECT_THAT(log, HasSubstr(absl::StrCat("data ended after step ", kSteps)))
      << log;

  // (3) It trained nothing after the restore: its final checkpoint is the
  // restored model, which is the chain bit for bit (every table and the
  // dense parameters).
  const std::optional<std::string> checkpoint =
      LatestCheckpoint(run + "/checkpoints").value_or(std::nullopt);
  ASSERT_TRUE(checkpoint.has_value()) << log;
  EXPECT_EQ(CheckpointStep(*checkpoint).value_or(-1), kSteps) << *checkpoint;
  absl::StatusOr<CheckpointModel> model = ReadCheckpointModel(*checkpoint);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Verified> verified = VerifyChain(*model, chain);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->version, kSteps);
  EXPECT_EQ(verified->tables, 2);
  EXPECT_GT(verified->dense_parameters, 0);

  // (4) Two ranks restore the same chain under a plan that splits c0 by
  // rows and c1 by columns (rank 1's block first): each takes its block of
  // the chain's rows, and their final checkpoint is the chain bit for bit.
  const std::string two_ranks =
      RunfilePath("trainer/trainer") +
      " --nproc_per_node=2 --listen=127.0.0.1:0 --steps=-1 --restore_chain=" +
      chain;
  const std::string plan = work + "/plan.txt";
  WriteText(plan, TwoRankPlan(1000, 4));
  const std::string sharded = work + "/sharded";
  const CommandResult restored =
      RunCommand(two_ranks + " --config=" + config + " --plan=" + plan +
                 " --checkpoint_dir=" + sharded);
  ASSERT_EQ(restored.exit_code, 0) << restored.err;
  const std::optional<std::string> sharded_checkpoint =
      LatestCheckpoint(sharded + "/checkpoints").value_or(std::nullopt);
  ASSERT_TRUE(sharded_checkpoint.has_value()) << restored.err;
  absl::StatusOr<CheckpointModel> sharded_model =
      ReadCheckpointModel(*sharded_checkpoint);
  ASSERT_TRUE(sharded_model.ok()) << sharded_model.status();
  absl::StatusOr<Verified> sharded_verified =
      VerifyChain(*sharded_model, chain);
  ASSERT_TRUE(sharded_verified.ok()) << sharded_verified.status();
  EXPECT_EQ(sharded_verified->version, kSteps);
  EXPECT_EQ(sharded_verified->tables, 2);
  EXPECT_GT(sharded_verified->dense_parameters, 0);

  // (5) A chain that does not fit the model's tables is refused on every
  // rank before training (exit 2, nothing saved), also where each rank's
  // block would take a part of it: rows past a row-wise table's end (IDs
  // up to 999 in a table of 500) and columns past a column-wise table's
  // width (4 in a table of 2, split 1 and 1) would be dropped.
  const struct {
    int64_t rows, dim;
    const char* says;
  } kMisfits[] = {{500, 4, "of 500 x 4 does not fit"},
                  {1000, 2, "of 1000 x 2 does not fit"}};
  for (const auto& misfit : kMisfits) {
    const std::string name =
        absl::StrCat(work, "/misfit-", misfit.rows, "x", misfit.dim);
    std::string text = ReadText(config);
    text = absl::StrReplaceAll(
        text,
        {{"num_embeddings: 1000",
          absl::StrCat("num_embeddings: ", misfit.rows)},
         {"embedding_dim: 4", absl::StrCat("embedding_dim: ", misfit.dim)}});
    WriteText(name + ".textproto", text);
    WriteText(name + ".plan", TwoRankPlan(misfit.rows, misfit.dim));
    const CommandResult refused = RunCommand(two_ranks + " --config=" + name +
                                             ".textproto --plan=" + name +
                                             ".plan --checkpoint_dir=" + name);
    EXPECT_EQ(refused.exit_code, 2) << refused.err;
    EXPECT_THAT(refused.err, HasSubstr(misfit.says)) << refused.err;
    EXPECT_EQ(LatestCheckpoint(name + "/checkpoints").value_or("unreadable"),
              std::nullopt)
        << refused.err;
  }
  std::printf(
      "restore_chain test: %.1f s\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count());
}

}  // namespace
}  // namespace deltastream
