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
#include "absl/strings/str_join.h"
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
  std::printf(
      "restore_chain test: %.1f s\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count());
}

}  // namespace
}  // namespace deltastream
