// The trainer binary as a user runs it: trains on the embedded defaults with
// the tracker service in-process; deltactl reads deltas while it trains
// (IDs, live values) and cannot step it; SIGTERM ends it cleanly with a final
// checkpoint and snapshot; a restart resumes the model, the data and the
// consumers' cursors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

constexpr char kT0[] = "sparse_arch.embedding_bag_collection.embedding_bags.t0";

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
    // The 1000 rows of each table with the largest change: a whole read,
    // rows, values and states of every table, as JSON takes seconds.
    CommandResult got = RunCommand(
        Deltactl(trainer, "get --consumer=predictor --top_count=1000 --json"));
    ASSERT_EQ(got.exit_code, 0) << got.err;
    json delta = json::parse(got.out);
    ASSERT_EQ(delta["tables"].size(), 8u);
    const json& table = delta["tables"][kT0];
    ASSERT_GT(table["ids"].size(), 100u);
    ASSERT_EQ(table["values"].size(), table["ids"].size());
    EXPECT_EQ(table["values"][0].size(), 16u);
    // Row-wise Adagrad's state grows for every row read: its change is > 0.
    ASSERT_EQ(table["states"].size(), table["ids"].size());
    EXPECT_GT(table["states"][0][0].get<double>(), 0);
    const int64_t read_through = delta["batch"].get<int64_t>();
    EXPECT_GE(read_through, 20);
    // The training thread is the tracker's one producer: a step from outside
    // would split a training step.
    CommandResult stepped = RunCommand(Deltactl(trainer, "step"));
    EXPECT_NE(stepped.exit_code, 0);
    EXPECT_THAT(stepped.err,
                testing::HasSubstr("Record and Step are not served"));

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

  // Restart: the model, the tracker and the consumers resume. This time a
  // stop exits with a code of its own, as a Kubernetes Job's pod's does.
  std::vector<std::string> resumed_flags = flags;
  resumed_flags.push_back("--stopped_exit_code=3");
  ServerProcess trainer(resumed_flags, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const int64_t resumed = CurrentBatch(trainer);
  EXPECT_GT(resumed, stopped_at);
  ASSERT_TRUE(WaitForBatch(trainer, resumed + 5));
  // One table's IDs: the whole run's rows of every table, as JSON, take
  // tens of seconds.
  CommandResult got = RunCommand(
      Deltactl(trainer, std::string("get --consumer=checkpoint --fqn=") + kT0 +
                            " --values=false --states=false --json"));
  ASSERT_EQ(got.exit_code, 0) << got.err;
  json delta = json::parse(got.out);
  // The checkpoint consumer never read: its delta covers the whole run.
  EXPECT_GT(delta["tables"][kT0]["ids"].size(), 100u);
  const int status = trainer.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
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

// Every name in --consumers counts, as in tracker_server (docs/service.md):
// each follows the tracker's name rule (tracker_service/names.h) or the
// flag is refused, exit 2 and one line naming it, before any step; an empty
// name (a leading, trailing or doubled comma) is refused, not dropped. An
// empty --consumers= is "not given", as every string override is: the
// config's consumers.
TEST(TrainerTest, EveryConsumerNameCounts) {
  const std::string trainer = RunfilePath("trainer/trainer");
  const std::string too_long(257, 'x');
  const std::pair<std::string, std::string> kRefusals[] = {
      {"a,,b", "--consumers: consumer name must be 1 to 256 bytes, got 0"},
      {",a", "--consumers: consumer name must be 1 to 256 bytes, got 0"},
      {"a,", "--consumers: consumer name must be 1 to 256 bytes, got 0"},
      {",", "--consumers: consumer name must be 1 to 256 bytes, got 0"},
      {"a," + too_long,
       "--consumers: consumer name must be 1 to 256 bytes, got 257"},
      {"a,b:c",
       "--consumers: consumer name 'b:c' may only hold letters, digits"},
  };
  for (const auto& [consumers, says] : kRefusals) {
    const CommandResult result =
        RunCommand(trainer + " --steps=1 --consumers=" + consumers);
    EXPECT_EQ(result.exit_code, 2) << consumers << ": " << result.err;
    EXPECT_THAT(result.err, ::testing::HasSubstr(says)) << consumers;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << consumers << ": " << result.err;
    EXPECT_TRUE(result.out.empty()) << consumers << ": " << result.out;
  }
  for (const auto& [flag, expected] :
       {std::pair<std::string, std::vector<std::string>>{"--consumers=a,b",
                                                         {"a", "b"}},
        {"--consumers=", {"default"}}}) {
    ServerProcess served({"--steps=-1", flag}, "trainer/trainer");
    ASSERT_GT(served.port(), 0) << flag << ": the trainer did not start";
    // The service answers once the trainer has restored and started.
    ASSERT_TRUE(WaitForBatch(served, 1)) << flag;
    const CommandResult status = RunCommand(Deltactl(served, "status --json"));
    ASSERT_EQ(status.exit_code, 0) << flag << ": " << status.err;
    const json parsed = json::parse(status.out);
    std::vector<std::string> names;
    for (const json& consumer : parsed["consumers"]) {
      names.push_back(consumer["name"].get<std::string>());
    }
    EXPECT_EQ(names, expected) << flag;
  }
}

// --nproc_per_node forks every local rank at once: past the planner's
// largest world (kMaxWorldSize, 4096) or below 0 it is refused before
// anything starts, exit 2 and one line naming the flag and its bound, and no
// rank is started. (--listen leaves no port for rank 4096 and up: had the
// bound gone, the launcher's port check would still refuse these counts
// rather than fork that many ranks.)
TEST(TrainerTest, NprocPerNodeIsBoundedByThePlannersLargestWorld) {
  const std::string trainer = RunfilePath("trainer/trainer");
  for (const char* ranks : {"4097", "100000", "-1"}) {
    const CommandResult result = RunCommand(
        trainer + " --listen=127.0.0.1:62000 --nproc_per_node=" + ranks);
    EXPECT_EQ(result.exit_code, 2) << ranks << ": " << result.err;
    EXPECT_THAT(result.err,
                ::testing::HasSubstr(
                    std::string("trainer: --nproc_per_node must be in [0, "
                                "4096] (the planner's largest world), got ") +
                    ranks))
        << ranks;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << ranks << ": " << result.err;
    EXPECT_THAT(result.err, ::testing::Not(::testing::HasSubstr("launcher")))
        << ranks << ": " << result.err;
    EXPECT_TRUE(result.out.empty()) << ranks << ": " << result.out;
  }
}

// A rank launched into a world past the planner's largest (torchrun's
// WORLD_SIZE) is refused at once, exit 2 naming the variable, instead of
// waiting the rendezvous' whole timeout (5 minutes) for ranks that never
// come.
TEST(TrainerTest, WorldSizeIsBoundedByThePlannersLargestWorld) {
  const std::string trainer = RunfilePath("trainer/trainer");
  const auto started = std::chrono::steady_clock::now();
  const CommandResult result = RunCommand(
      "RANK=0 WORLD_SIZE=4097 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=62001 " +
      trainer + " --listen=127.0.0.1:0");
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_THAT(result.err,
              ::testing::HasSubstr("WORLD_SIZE must be in [1, 4096], got 4097"))
      << result.err;
  EXPECT_LT(std::chrono::steady_clock::now() - started,
            std::chrono::seconds(20));
}

// What a restart may not meet (an I/O error: reading /proc/self/mem's first
// page fails with EIO) exits 1, so that a scheduler tries again; a
// scheduler does not restart exit 2 (deploy/k8s/trainer.yaml, systemd).
TEST(TrainerTest, AnIoErrorAtStartIsAFailureNotARefusal) {
  const std::string trainer = RunfilePath("trainer/trainer");
  const CommandResult config = RunCommand(trainer + " --config=/proc/self/mem");
  EXPECT_EQ(config.exit_code, 1) << config.err;
  EXPECT_THAT(config.err, ::testing::HasSubstr("Input/output error"));

  // A checkpoint whose manifest cannot be read is neither incomplete (the
  // run would start again from an older step, or from 0) nor refused.
  const std::string dir = TestTempDir() + "/unreadable";
  std::filesystem::remove_all(dir);
  const std::string run = trainer + " --checkpoint_dir=" + dir;
  ASSERT_EQ(RunCommand(run + " --steps=4").exit_code, 0);
  const std::string manifest =
      dir + "/checkpoints/checkpoint-000000000004/manifest.json";
  std::filesystem::rename(manifest, manifest + ".saved");
  std::filesystem::create_symlink("/proc/self/mem", manifest);
  const CommandResult unreadable = RunCommand(run + " --steps=6");
  EXPECT_EQ(unreadable.exit_code, 1) << unreadable.err;
  EXPECT_THAT(unreadable.err, ::testing::HasSubstr("Input/output error"));
  EXPECT_THAT(unreadable.err, ::testing::Not(::testing::HasSubstr("step 1")));
  std::filesystem::remove(manifest);
  std::filesystem::rename(manifest + ".saved", manifest);
  const CommandResult resumed = RunCommand(run + " --steps=6");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, ::testing::HasSubstr("(step 4,")) << resumed.err;
}

// The rotation of checkpoints removes incomplete ones, never one it cannot
// read: that may be the newest a restart would find.
TEST(TrainerTest, TheRotationKeepsACheckpointItCannotRead) {
  const std::string dir = TestTempDir() + "/rotation";
  std::filesystem::remove_all(dir);
  const std::string trainer =
      RunfilePath("trainer/trainer") + " --checkpoint_dir=" + dir;
  WriteText(TestTempDir() + "/keep2.textproto",
            "checkpoints { every_steps: 2 keep: 2 }\n");
  WriteText(TestTempDir() + "/keep1.textproto",
            "checkpoints { every_steps: 2 keep: 1 }\n");
  ASSERT_EQ(RunCommand(trainer + " --steps=4 --config=" + TestTempDir() +
                       "/keep2.textproto")
                .exit_code,
            0);
  const std::string second = dir + "/checkpoints/checkpoint-000000000002";
  std::filesystem::remove(second + "/manifest.json");
  std::filesystem::create_symlink("/proc/self/mem", second + "/manifest.json");
  // The restart reads the newest complete checkpoint (step 4) and no older
  // one; its rotation then reads them all.
  const CommandResult rotated = RunCommand(
      trainer + " --steps=2 --config=" + TestTempDir() + "/keep1.textproto");
  ASSERT_EQ(rotated.exit_code, 0) << rotated.err;
  EXPECT_THAT(rotated.err, ::testing::HasSubstr("(step 4,")) << rotated.err;
  EXPECT_TRUE(
      std::filesystem::exists(dir + "/checkpoints/checkpoint-000000000006"));
  EXPECT_FALSE(
      std::filesystem::exists(dir + "/checkpoints/checkpoint-000000000004"));
  EXPECT_TRUE(std::filesystem::exists(second)) << "removed as incomplete";
}

// A step already checkpointed is not saved again at the end: the save of a
// same-step checkpoint takes the complete one apart first, so a crash
// during it would lose the newest checkpoint.
TEST(TrainerTest, TheLastStepIsCheckpointedOnce) {
  const std::string dir = TestTempDir() + "/once";
  std::filesystem::remove_all(dir);
  const std::string config = TestTempDir() + "/every5.textproto";
  WriteText(config, "checkpoints { every_steps: 5 }\n");
  const std::string trainer = RunfilePath("trainer/trainer") +
                              " --config=" + config +
                              " --checkpoint_dir=" + dir;
  CommandResult result = RunCommand(trainer + " --steps=10");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(Count(result.err, "checkpoint-000000000010 ("), 1) << result.err;
  EXPECT_EQ(Count(result.err, "checkpoint of step 10 already written"), 1)
      << result.err;
  EXPECT_TRUE(std::filesystem::exists(
      dir + "/checkpoints/checkpoint-000000000010/manifest.json"));
}

// A restart whose tracker holds fewer batches than the model's step (no
// snapshot for it: a resharded restart, or a lost database) starts its run
// at the model's step, not at the tracker's: the batches before it are the
// model's history, which consumers (a checkpoint chain) keep.
TEST(TrainerTest, ARunStartsAtTheModelsStep) {
  const std::string dir = TestTempDir() + "/run_start";
  std::filesystem::remove_all(dir);
  const CommandResult first = RunCommand(RunfilePath("trainer/trainer") +
                                         " --steps=6 --checkpoint_dir=" + dir +
                                         " --listen=127.0.0.1:0");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::filesystem::remove_all(dir + "/db");  // the tracker's snapshots
  ServerProcess trainer({"--steps=-1", "--checkpoint_dir=" + dir},
                        "trainer/trainer");
  ASSERT_GT(trainer.port(), 0) << "trainer did not start";
  const CommandResult status = RunCommand(Deltactl(trainer, "status --json"));
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_EQ(json::parse(status.out)["run_start_batch"].get<int64_t>(), 6)
      << status.out;
}

// A tracker snapshot ahead of the model (its checkpoint lost): the steps the
// model trains again are dropped and the tracker's batches restart at the
// model's step, so that the next restart finds both at one step (a consumer's
// version is a model step).
TEST(TrainerTest, ATrackerAheadOfTheModelRestartsAtTheModelsStep) {
  const std::string trainer =
      RunfilePath("trainer/trainer") +
      " --listen=127.0.0.1:0 --checkpoint_dir=" + TestTempDir() + "/ahead";
  std::filesystem::remove_all(TestTempDir() + "/ahead");
  ASSERT_EQ(RunCommand(trainer + " --steps=6").exit_code, 0);
  std::filesystem::remove_all(TestTempDir() +
                              "/ahead/checkpoints/checkpoint-000000000006");
  const CommandResult again = RunCommand(trainer + " --steps=3");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, ::testing::HasSubstr("its batches restart at 0"));
  const CommandResult next = RunCommand(trainer + " --steps=1");
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_THAT(next.err, ::testing::HasSubstr("(batch 3,")) << next.err;
  EXPECT_THAT(next.err, ::testing::Not(::testing::HasSubstr("warning")))
      << next.err;
}

// Batches larger than the memory the trainer may use (here 6 GB of address
// space) end it with exit 1 and one line, never an abort: the held-out
// batches (built at the start) and a training batch alike.
TEST(TrainerTest, BatchesLargerThanMemoryAreAFailureNotACrash) {
  const std::string dir = TestTempDir() + "/huge_batches";
  std::filesystem::create_directories(dir);
  const std::string model =
      "model { num_dense: 3 dense_arch: [8, 4] over_arch: [8, 1] "
      "tables { name: \"t0\" num_embeddings: 1000 embedding_dim: 4 "
      "feature_names: \"cat_0\" } }\n";
  const struct {
    const char* name;
    const char* data;
    const char* says;
  } kCases[] = {
      {"held_out",
       "data { batch_size: 1000 eval_batches: 1 synthetic { min_length: "
       "2000000 max_length: 2000000 } }",
       "the held-out batches: out of memory"},
      {"training",
       "data { batch_size: 1 eval_batches: 0 synthetic { min_length: "
       "2147483648 max_length: 2147483648 } }",
       "step 1: out of memory"},
  };
  for (const auto& c : kCases) {
    const std::string config = dir + "/" + c.name + ".textproto";
    WriteText(config, model + c.data + "\n");
    const CommandResult result =
        RunCommand("ulimit -v 6000000; exec " + RunfilePath("trainer/trainer") +
                   " --steps=2 --listen=127.0.0.1:0 --config=" + config +
                   " --checkpoint_dir=" + dir + "/" + c.name);
    EXPECT_EQ(result.exit_code, 1) << c.name << ": " << result.err;
    EXPECT_THAT(result.err, ::testing::HasSubstr(c.says)) << c.name;
  }
}

// What would fail a run later, or be ignored, is refused before any step:
// exit 2 and one line naming it (exit 1 for data with nothing to train).
TEST(TrainerTest, BadFlagsAndInputsAreRefusedBeforeTraining) {
  const std::string trainer = RunfilePath("trainer/trainer");
  const std::string dir = TestTempDir() + "/refusals";
  std::filesystem::create_directories(dir);
  WriteText(dir + "/skip.textproto",
            "tracker { fqns_to_skip: \"sparse_arch.t0\" }\n");
  WriteText(dir + "/empty.plan", "");
  WriteText(dir + "/three.plan",
            "world_size: 3 tables { table: \"t0\" sharding_type: "
            "TABLE_WISE }\n");
  WriteText(dir + "/overlap.plan",
            "world_size: 2 tables { table: \"t0\" sharding_type: ROW_WISE "
            "shards { rank: 0 row_offset: 0 rows: 60000 cols: 16 } "
            "shards { rank: 1 row_offset: 50000 rows: 50000 cols: 16 } }\n");
  WriteText(dir + "/empty.tsv", "");
  WriteText(dir + "/criteo.textproto",
            "model { kind: \"dlrm\" tables { name: \"c0\" num_embeddings: "
            "100 embedding_dim: 4 feature_names: \"cat_0\" } }\n"
            "data { batch_size: 8 criteo { paths: [\"" +
                dir + "/empty.tsv\", \"" + dir + "/absent.tsv\"] } }\n");
  std::filesystem::create_directories(dir + "/taken");
  WriteText(dir + "/taken/checkpoints", "a file where a directory goes");
  const struct {
    std::string args;
    std::string says;
  } kRefusals[] = {
      {"--steps=0", "--steps must be >= 1, or -1"},
      {"--drain_s=-3", "--drain_s must be finite and >= 0"},
      {"--drain_s=nan", "--drain_s must be finite and >= 0"},
      {"--drain_s=inf", "--drain_s must be finite and >= 0"},
      {"--collective_timeout_s=0", "--collective_timeout_s"},
      {"--max_restarts=-1", "--max_restarts must be >= 0"},
      {"--master_port=70000", "--master_port"},
      {"--stopped_exit_code=1", "--stopped_exit_code must be 0 or in 3..125"},
      {"--stopped_exit_code=130", "--stopped_exit_code must be 0 or in 3..125"},
      {"--peer_failure_exit_code=2",
       "--peer_failure_exit_code must be 0 or in 3..125"},
      {"--stopped_exit_code=3 --peer_failure_exit_code=3",
       "--stopped_exit_code and --peer_failure_exit_code must differ"},
      {"--nproc_per_node=2 --plan=" + dir + "/absent.plan",
       "absent.plan': No such file"},
      {"--nproc_per_node=2 --plan=" + dir + "/empty.plan", "plans no tables"},
      {"--nproc_per_node=2 --plan=" + dir + "/three.plan",
       "is for world size 3, --nproc_per_node starts 2 ranks"},
      {"--nproc_per_node=2 --plan=" + dir + "/overlap.plan",
       "table 't0' shard 1 overlaps shard 0"},
      {"--nproc_per_node=2 --listen=127.0.0.1:65535", "no port for local rank"},
      {"--config=" + dir + "/skip.textproto", "'sparse_arch.t0' skips nothing"},
      {"--config=" + dir + "/criteo.textproto", "absent.tsv"},
      {"--steps=2 --checkpoint_dir=" + dir + "/taken",
       "taken/checkpoints': Not a directory"},
  };
  for (const auto& refusal : kRefusals) {
    const CommandResult result = RunCommand(trainer + " " + refusal.args);
    EXPECT_EQ(result.exit_code, 2) << refusal.args << ": " << result.err;
    EXPECT_THAT(result.err, ::testing::HasSubstr(refusal.says)) << refusal.args;
    EXPECT_THAT(result.err, ::testing::Not(::testing::HasSubstr("step 1")))
        << refusal.args;
  }
  WriteText(dir + "/criteo.textproto",
            "model { kind: \"dlrm\" tables { name: \"c0\" num_embeddings: "
            "100 embedding_dim: 4 feature_names: \"cat_0\" } }\n"
            "data { batch_size: 8 criteo { paths: [\"" +
                dir + "/empty.tsv\"] } }\n");
  const CommandResult empty =
      RunCommand(trainer + " --config=" + dir + "/criteo.textproto");
  EXPECT_EQ(empty.exit_code, 1) << empty.err;
  EXPECT_THAT(empty.err, ::testing::HasSubstr("holds no batch"));
}

}  // namespace
}  // namespace deltastream
