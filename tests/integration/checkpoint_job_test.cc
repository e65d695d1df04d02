// The checkpoint job against the real trainer on loopback: it writes a sound
// chain (a full link, then increments with no gap or overlap) while the
// trainer trains; after the trainer is killed (SIGKILL) and restarts from its
// last snapshot, the tracker delivers batches the chain already has again,
// and the job writes only what the chain lacks: still no gap, no overlap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using nlohmann::json;

json Chain(const std::string& dir) {
  CommandResult result = RunCommand(RunfilePath("clients/deltactl") +
                                    " chain --json --dir=" + dir);
  return json::parse(result.out.empty() ? "{}" : result.out);
}

std::string Job(const ServerProcess& trainer, const std::string& dir,
                int count) {
  return RunfilePath("clients/checkpoint_job") +
         " --target=" + trainer.target() + " --dir=" + dir +
         " --every_ms=100 --count=" + std::to_string(count);
}

TEST(CheckpointJobTest, SoundChainAcrossATrainerCrash) {
  const std::string work = TestTempDir() + "/checkpoint_job_test";
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  const std::string config = work + "/trainer.textproto";
  {
    FILE* f = std::fopen(config.c_str(), "w");
    std::fputs(
        "tracker { consumers: \"checkpoint\" acknowledged_reads: true }\n"
        "checkpoints { every_steps: 20 }\n"
        "log_every_steps: 0\n",
        f);
    std::fclose(f);
  }
  const std::vector<std::string> flags = {"--config=" + config, "--steps=-1",
                                          "--checkpoint_dir=" + work + "/run"};
  const std::string chain = work + "/chain";
  {
    ServerProcess trainer(flags, "trainer/trainer");
    ASSERT_GT(trainer.port(), 0);
    CommandResult job = RunCommand(Job(trainer, chain, 3));
    ASSERT_EQ(job.exit_code, 0) << job.err;
    json view = Chain(chain);
    ASSERT_EQ(view["links"].size(), 3u) << view.dump();
    EXPECT_EQ(view["links"][0]["kind"], "full");
    EXPECT_EQ(view["links"][0]["start_batch"], 0);
    EXPECT_TRUE(view["problems"].empty()) << view.dump();
    trainer.Stop(SIGKILL);  // the tracker loses what followed its snapshot
  }
  ServerProcess trainer(flags, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  CommandResult job = RunCommand(Job(trainer, chain, 2));
  ASSERT_EQ(job.exit_code, 0) << job.err;
  json view = Chain(chain);
  EXPECT_EQ(view["links"].size(), 5u) << view.dump();
  EXPECT_TRUE(view["problems"].empty()) << view.dump();
  for (size_t i = 1; i < view["links"].size(); ++i) {
    EXPECT_EQ(view["links"][i]["start_batch"],
              view["links"][i - 1]["end_batch"])
        << view.dump();
  }
  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
}

TEST(CheckpointJobTest, AConsumerThatReadBeforeHasNoBase) {
  const std::string work = TestTempDir() + "/checkpoint_job_nobase";
  std::filesystem::remove_all(work);
  ServerProcess trainer({"--steps=-1", "--consumers=checkpoint"},
                        "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(RunCommand(RunfilePath("clients/deltactl") + " --target=" +
                       trainer.target() + " get --consumer=checkpoint")
                .exit_code,
            0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CommandResult job = RunCommand(Job(trainer, work, 1));
  EXPECT_EQ(job.exit_code, 1);
  EXPECT_THAT(job.err, ::testing::HasSubstr("no base"));
}

}  // namespace
}  // namespace deltastream
