// The trainer binary as a user runs it: trains on the embedded defaults with
// the tracker service in-process; deltactl reads deltas while it trains
// (IDs, live values); SIGTERM ends it cleanly with a final checkpoint and
// snapshot; a restart resumes the model, the data and the consumers' cursors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using nlohmann::json;

std::string Deltactl(const ServerProcess& trainer, const std::string& args) {
  return RunfilePath("clients/deltactl") + " --target=" + trainer.target() +
         " " + args;
}

int64_t CurrentBatch(const ServerProcess& trainer) {
  CommandResult status = RunCommand(Deltactl(trainer, "status --json"));
  if (status.exit_code != 0) return -1;
  return json::parse(status.out)["current_batch"].get<int64_t>();
}

// Waits until the trainer has closed `batch` steps.
bool WaitForBatch(const ServerProcess& trainer, int64_t batch) {
  for (int i = 0; i < 600; ++i) {
    if (CurrentBatch(trainer) >= batch) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(TrainerTest, ServesDeltasWhileTrainingAndResumesAfterSigterm) {
  const std::string dir = TestTempDir() + "/trainer_test";
  std::filesystem::remove_all(dir);
  const std::vector<std::string> flags = {
      "--steps=-1", "--checkpoint_dir=" + dir,
      "--consumers=predictor,checkpoint", "--mode=rowwise_adagrad"};
  int64_t stopped_at = 0;
  {
    ServerProcess trainer(flags, "trainer/trainer");
    ASSERT_GT(trainer.port(), 0) << "trainer did not start";
    ASSERT_TRUE(WaitForBatch(trainer, 20));
    CommandResult got =
        RunCommand(Deltactl(trainer, "get --consumer=predictor --json"));
    ASSERT_EQ(got.exit_code, 0) << got.err;
    json delta = json::parse(got.out);
    ASSERT_EQ(delta["tables"].size(), 8u);
    const json& table =
        delta["tables"]
             ["sparse_arch.embedding_bag_collection.embedding_bags.t0"];
    ASSERT_GT(table["ids"].size(), 100u);
    ASSERT_EQ(table["values"].size(), table["ids"].size());
    EXPECT_EQ(table["values"][0].size(), 16u);
    // Row-wise Adagrad's state grows for every row read: its change is > 0.
    ASSERT_EQ(table["states"].size(), table["ids"].size());
    EXPECT_GT(table["states"][0][0].get<double>(), 0);
    const int64_t read_through = delta["batch"].get<int64_t>();
    EXPECT_GE(read_through, 20);

    EXPECT_EQ(trainer.Stop(SIGTERM), 0) << "trainer did not exit cleanly";
    stopped_at = read_through;
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/db"));
  bool has_checkpoint = false;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir + "/checkpoints")) {
    has_checkpoint =
        has_checkpoint ||
        absl::StartsWith(entry.path().filename().string(), "checkpoint-");
  }
  ASSERT_TRUE(has_checkpoint);

  // Restart: the model, the tracker and the consumers resume.
  ServerProcess trainer(flags, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const int64_t resumed = CurrentBatch(trainer);
  EXPECT_GT(resumed, stopped_at);
  ASSERT_TRUE(WaitForBatch(trainer, resumed + 5));
  CommandResult got =
      RunCommand(Deltactl(trainer, "get --consumer=checkpoint --json"));
  ASSERT_EQ(got.exit_code, 0) << got.err;
  json delta = json::parse(got.out);
  // The checkpoint consumer never read: its delta covers the whole run.
  EXPECT_GT(
      delta["tables"]["sparse_arch.embedding_bag_collection.embedding_bags.t0"]
           ["ids"]
               .size(),
      100u);
  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
}

// A stop waits for the consumers to drain (tracker.drain_seconds); a second
// SIGTERM cuts that wait short and exits at once with 128 + 15.
TEST(TrainerTest, ASecondSigtermEndsTheDrainAtOnce) {
  const std::string log = TestTempDir() + "/drain.err";
  ServerProcess trainer(
      {"--steps=-1", "--consumers=never_reads", "--drain_s=60"},
      "trainer/trainer", log);
  ASSERT_GT(trainer.port(), 0) << "trainer did not start";
  ASSERT_TRUE(WaitForBatch(trainer, 3));
  trainer.Signal(SIGTERM);
  bool stopping = false;
  for (int i = 0; i < 300 && !stopping; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stopping = absl::StrContains(ReadText(log), "stop requested at step");
  }
  ASSERT_TRUE(stopping) << ReadText(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // draining
  const auto start = std::chrono::steady_clock::now();
  const int status = trainer.Stop(SIGTERM);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM)
      << "status " << status << ": " << ReadText(log);
  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_THAT(ReadText(log), ::testing::HasSubstr("exiting now"));
}

TEST(TrainerTest, BadConfigIsAClearErrorWithExitCode2) {
  const std::string config = TestTempDir() + "/bad.textproto";
  FILE* f = std::fopen(config.c_str(), "w");
  std::fputs("model { kind: \"transformer\" }\n", f);
  std::fclose(f);
  CommandResult result =
      RunCommand(RunfilePath("trainer/trainer") + " --config=" + config);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, ::testing::HasSubstr("model.kind"));
  f = std::fopen(config.c_str(), "w");
  std::fputs("steps: 3\nunknown_field: 1\n", f);
  std::fclose(f);
  result = RunCommand(RunfilePath("trainer/trainer") + " --config=" + config);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, ::testing::HasSubstr("line 2"));
}

}  // namespace
}  // namespace deltastream
