// The checkpoint job against the real trainer on loopback: it writes a sound
// chain (a full link from a read of every row, then increments with no gap or
// overlap) while the trainer trains. After the trainer is killed (SIGKILL)
// and restarts from its last snapshot and checkpoint, the links holding
// changes the trainer lost (after its restart point) are removed, the
// redelivered batches fill the chain again, and after a SIGTERM (with
// --drain_s the trainer serves until the job has read its last step) the
// chain loads to the trainer's final checkpoint bit for bit: every table and
// the dense parameters. A consumer that read before gets a full base; rows
// dropped under the memory cap make the job write a full link again. A
// broken chain is refused at start (exit 2) and an unreadable one fails it
// (exit 1), before the service is contacted.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/checkpoint_chain.h"
#include "tests/integration/server_process.h"
#include "trainer/checkpoint.h"
#include "trainer/model_verification.h"

namespace deltastream {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

json Chain(const std::string& dir) {
  CommandResult result = RunCommand(RunfilePath("clients/deltactl") +
                                    " chain --json --dir=" + dir);
  return json::parse(result.out.empty() ? "{}" : result.out);
}

std::string Job(const ServerProcess& trainer, const std::string& dir, int count,
                const std::string& flags = "") {
  return RunfilePath("clients/checkpoint_job") +
         " --target=" + trainer.target() + " --dir=" + dir +
         " --every_ms=100 --count=" + std::to_string(count) + " " + flags;
}

// A trainer config file in `work` (created).
std::string WriteConfig(const std::string& work, const std::string& text) {
  std::filesystem::create_directories(work);
  const std::string path = work + "/trainer.textproto";
  std::ofstream(path) << text;
  return path;
}

// The trainer's newest checkpoint: its step and path ({-1, ""}: none yet).
std::pair<int64_t, std::string> NewestCheckpoint(const std::string& dir) {
  const std::optional<std::string> path = LatestCheckpoint(dir).value();
  if (!path.has_value()) return {-1, ""};
  return {CheckpointStep(*path).value_or(-1), *path};
}

// The chain in `dir` against the trainer's final checkpoint, bit for bit
// (trainer/model_verification.h): every row of every table, and the dense
// parameters read at the chain's end.
void ExpectChainIsCheckpoint(const std::string& dir,
                             const std::string& checkpoint) {
  absl::StatusOr<CheckpointModel> model = ReadCheckpointModel(checkpoint);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Verified> verified = VerifyChain(*model, dir);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->tables, static_cast<int64_t>(model->tables.size()));
  absl::StatusOr<LoadedChain> chain = LoadChain(dir);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->tables.size(), model->tables.size());
  // VerifyChain compares dense parameters only when the chain has them at
  // its end: here it must.
  EXPECT_EQ(chain->dense_batch, chain->end_batch);
  EXPECT_GT(verified->dense_parameters, 0);
}

TEST(CheckpointJobTest, SoundChainAcrossATrainerCrash) {
  const std::string work = TestTempDir() + "/checkpoint_job_test";
  std::filesystem::remove_all(work);
  const std::string config = WriteConfig(
      work,
      "tracker { consumers: \"checkpoint\" acknowledged_reads: true }\n"
      "checkpoints { every_steps: 100 }\n"
      "log_every_steps: 0\n");
  const std::string checkpoints = work + "/run/checkpoints";
  std::vector<std::string> flags = {"--config=" + config, "--steps=-1",
                                    "--checkpoint_dir=" + work + "/run"};
  const std::string chain = work + "/chain";
  int64_t chain_end = 0;
  std::string first_run;
  {
    ServerProcess trainer(flags, "trainer/trainer");
    ASSERT_GT(trainer.port(), 0);
    Background job(Job(trainer, chain, 0, "--retry_s=60"), work + "/job1");
    // A few links, then a crash shortly after a checkpoint (and its tracker
    // snapshot) while the chain ends after it: the trainer restarts from
    // there and loses the future the chain holds.
    int64_t checkpoint = -1;
    auto checkpoint_seen = std::chrono::steady_clock::now();
    auto ChainEnd = [&] {
      int64_t end = -1;
      for (const ChainLink& link :
           ListChain(chain).value_or(std::vector<ChainLink>())) {
        end = std::max(end, link.end_batch);
      }
      return end;
    };
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto now = std::chrono::steady_clock::now();
      if (const int64_t newest = NewestCheckpoint(checkpoints).first;
          newest != checkpoint) {
        checkpoint = newest;
        checkpoint_seen = now;
      }
      if (Count(job.out(), " batches ") >= 3 && checkpoint >= 0 &&
          now - checkpoint_seen > std::chrono::milliseconds(300) &&
          ChainEnd() > checkpoint) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    trainer.Stop(SIGKILL);  // the tracker loses what followed its snapshot
    EXPECT_EQ(job.Stop(SIGTERM), 0) << job.err();
    ASSERT_GE(Count(job.out(), " batches "), 3) << job.out() << job.err();
    json view = Chain(chain);
    EXPECT_EQ(view["links"][0]["kind"], "full");
    EXPECT_EQ(view["links"][0]["start_batch"], 0);
    EXPECT_TRUE(view["problems"].empty()) << view.dump();
    for (const json& link : view["links"]) {
      EXPECT_GT(link["dense"].get<int64_t>(), 0) << view.dump();
      EXPECT_FALSE(link["run_id"].get<std::string>().empty()) << view.dump();
    }
    chain_end = view["links"].back()["end_batch"].get<int64_t>();
    first_run = view["links"].back()["run_id"].get<std::string>();
  }
  const int64_t restored_step = NewestCheckpoint(checkpoints).first;
  ASSERT_GE(restored_step, 0);

  flags.push_back("--drain_s=120");
  ServerProcess trainer(flags, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  Background job(Job(trainer, chain, 0, "--retry_s=60"), work + "/job");
  // Two links after the restart, then stop the trainer: it writes its final
  // checkpoint and serves until the job has read through its last step.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (Count(job.out(), " batches ") < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(Count(job.out(), " batches "), 2) << job.out() << job.err();
  EXPECT_EQ(trainer.Stop(SIGTERM), 0);
  EXPECT_EQ(job.Stop(SIGTERM), 0) << job.err();
  const std::string out = job.out();
  json view = Chain(chain);
  EXPECT_TRUE(view["problems"].empty()) << view.dump();
  // Where the second run started (it names it in its links): the model's
  // checkpoint, or an older tracker snapshot.
  int64_t restart = -1;
  for (const json& link : view["links"]) {
    if (link["run_id"] != first_run) {
      restart = link["run_start_batch"].get<int64_t>();
    }
  }
  ASSERT_GE(restart, 0) << view.dump();
  std::printf(
      "chain ended at batch %lld; the trainer restored step %lld, its run "
      "starts at batch %lld; the job after the restart:\n%s",
      static_cast<long long>(chain_end), static_cast<long long>(restored_step),
      static_cast<long long>(restart), out.c_str());
  if (chain_end > restart) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("removing the links after batch ",
                                            restart)));
    EXPECT_THAT(out, HasSubstr("removed incr-"));
  } else {
    EXPECT_THAT(out, ::testing::Not(HasSubstr("removed")));
  }
  std::vector<json> applied;
  for (const json& link : view["links"]) {
    if (!link["superseded"].get<bool>()) applied.push_back(link);
    // Nothing of the first run after the batch the second started from.
    if (link["end_batch"].get<int64_t>() > restart) {
      EXPECT_NE(link["run_id"], first_run) << view.dump();
    }
  }
  ASSERT_FALSE(applied.empty()) << view.dump();
  EXPECT_EQ(applied[0]["kind"], "full");
  for (size_t i = 1; i < applied.size(); ++i) {
    EXPECT_EQ(applied[i]["start_batch"], applied[i - 1]["end_batch"])
        << view.dump();
  }
  if (restart != restored_step) {
    std::printf(
        "the trainer restored its model at step %lld but its tracker at batch "
        "%lld (killed between writing the two): the changes of the batches "
        "between are in the model but were never recorded, so the service "
        "must tell its consumers to resync\n",
        static_cast<long long>(restored_step), static_cast<long long>(restart));
  }
  ExpectChainIsCheckpoint(chain, NewestCheckpoint(checkpoints).second);
}

TEST(CheckpointJobTest, AConsumerThatReadBeforeGetsAFullBase) {
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
  ASSERT_EQ(job.exit_code, 0) << job.err;
  EXPECT_THAT(job.out, HasSubstr("full batches 0.."));
  absl::StatusOr<LoadedChain> chain = LoadChain(work);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->links.size(), 1u);
  EXPECT_TRUE(chain->links[0].full);
  // Every row of every table: the defaults are 8 tables of 100000 x 16.
  ASSERT_EQ(chain->tables.size(), 8u);
  for (const auto& [fqn, table] : chain->tables) {
    EXPECT_EQ(table.ids.numel(), 100000) << fqn;
    EXPECT_TRUE(at::equal(table.ids, at::arange(100000, at::kLong))) << fqn;
    EXPECT_EQ(table.values.sizes(), (std::vector<int64_t>{100000, 16})) << fqn;
  }
  EXPECT_FALSE(chain->dense.empty());
  EXPECT_EQ(chain->dense_batch, chain->end_batch);
  EXPECT_FALSE(chain->run_id.empty());
}

// A job whose consumer the trainer does not know adds it, with a warning,
// as the predictor does (it used to exit 1 on "unknown consumer"); a
// consumer removed while the chain holds links is added again and the chain
// goes on with a full link, never with a gap.
TEST(CheckpointJobTest, AConsumerTheTrainerLacksIsAddedAndTheChainStaysWhole) {
  const std::string work = TestTempDir() + "/checkpoint_job_added";
  std::filesystem::remove_all(work);
  ServerProcess trainer({"--steps=-1"}, "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  CommandResult first = RunCommand(Job(trainer, work, 2));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.err, HasSubstr("consumer 'checkpoint' was not on"));
  EXPECT_THAT(first.out, HasSubstr("full batches 0.."));
  EXPECT_THAT(first.out, Not(HasSubstr("resync")));
  absl::StatusOr<LoadedChain> chain = LoadChain(work);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->links.size(), 2u);

  ASSERT_EQ(RunCommand(RunfilePath("clients/deltactl") + " --target=" +
                       trainer.target() + " consumers remove checkpoint")
                .exit_code,
            0);
  CommandResult again = RunCommand(Job(trainer, work, 1));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("consumer 'checkpoint' was not on"));
  EXPECT_THAT(again.out, HasSubstr("resync: the consumer was added"));
  EXPECT_THAT(again.out, HasSubstr("full batches 0.."));
  absl::StatusOr<LoadedChain> grown = LoadChain(work);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_GT(grown->end_batch, chain->end_batch);
  EXPECT_TRUE(grown->links.back().full);
}

// A job that starts on a chain whose applied link fails its checksum (bit
// rot, a torn copy) writes a full link, which supersedes it, rather than
// increments that could never be loaded, also when the damaged link is the
// newest and its description unreadable; a link write a crash cut short
// (its .tmp file) is removed.
TEST(CheckpointJobTest, ADamagedChainGetsAFullLinkAndUnfinishedWritesGo) {
  const std::string work = TestTempDir() + "/checkpoint_job_damaged";
  std::filesystem::remove_all(work);
  ServerProcess trainer({"--steps=-1", "--consumers=checkpoint"},
                        "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  CommandResult first = RunCommand(Job(trainer, work, 2));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  absl::StatusOr<LoadedChain> sound = LoadChain(work);
  ASSERT_TRUE(sound.ok()) << sound.status();
  ASSERT_EQ(sound->links.size(), 2u);
  const std::string damaged = sound->links[1].path;
  {
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-20, std::ios::end);
    const char byte = static_cast<char>(file.get() ^ 0x40);
    file.seekp(-20, std::ios::end);
    file.put(byte);
  }
  ASSERT_FALSE(LoadChain(work).ok());
  const std::string unfinished =
      work + "/full-000000000000-000000000099.ckpt.tmp";
  std::ofstream(unfinished) << "half a link";

  CommandResult again = RunCommand(Job(trainer, work, 1));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("fails its checksum"));
  EXPECT_THAT(again.out, HasSubstr("full batches 0.."));
  EXPECT_FALSE(std::filesystem::exists(unfinished));
  absl::StatusOr<LoadedChain> healed = LoadChain(work);
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_GT(healed->end_batch, sound->end_batch);

  // The newest link's description damaged (its first record, just after the
  // magic and the record's size and checksum): the chain's end is not known,
  // and the job starts with a full link all the same.
  {
    std::fstream file(healed->links.back().path,
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(21);
    const char byte = static_cast<char>(file.get() ^ 0x40);
    file.seekp(21);
    file.put(byte);
  }
  ASSERT_FALSE(LoadChain(work).ok());
  CommandResult third = RunCommand(Job(trainer, work, 1));
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_THAT(third.err, HasSubstr("the chain's end is not known"));
  EXPECT_THAT(third.out, HasSubstr("full batches 0.."));
  absl::StatusOr<LoadedChain> healed_again = LoadChain(work);
  ASSERT_TRUE(healed_again.ok()) << healed_again.status();
  EXPECT_GE(healed_again->end_batch, healed->end_batch);
}

// Flips a byte of the description (the first record, just after the magic and
// the record's size and checksum) of the link at `path`: ReadChainLinkInfo
// fails with DataLoss.
void DamageDescription(const std::string& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(21);
  const char byte = static_cast<char>(file.get() ^ 0x40);
  file.seekp(21);
  file.put(byte);
}

// A link of another trainer run: one small table.
ChainLink WriteOldRunLink(const std::string& dir, bool full, int64_t start,
                          int64_t end) {
  ChainLinkContent content;
  content.full = full;
  content.start_batch = start;
  content.end_batch = end;
  content.consumer = "checkpoint";
  content.tables["old.table"] = {at::arange(4, at::kLong),
                                 at::ones({4, 2}, at::kFloat)};
  content.run_id = "an-older-run";
  absl::StatusOr<ChainLink> link = WriteChainLinkContent(dir, content);
  EXPECT_TRUE(link.ok()) << link.status();
  return link.value_or(ChainLink());
}

// A chain whose newest link's description is damaged and whose range ends
// past the batch the trainer is at (it restarted behind it): the job, not
// knowing where the chain ends, writes a full link and removes the links
// after that link's end, which overlap it, so that the chain loads and the
// job starts again. A damaged link that is not the newest leaves the chain's
// end known: the trainer's restart removes the links after its start.
TEST(CheckpointJobTest, LinksPastAFullLinkWrittenOnAnUnknownEndGo) {
  const std::string work = TestTempDir() + "/checkpoint_job_unknown_end";
  std::filesystem::remove_all(work);
  // Far past any batch the trainer reaches in this test.
  constexpr int64_t kFar = 1000000000;
  const std::string chain = work + "/chain";
  WriteOldRunLink(chain, /*full=*/true, 0, 1);
  const ChainLink damaged = WriteOldRunLink(chain, /*full=*/false, 1, kFar);
  DamageDescription(damaged.path);
  ASSERT_FALSE(ReadChainLinkInfo(damaged.path).ok());

  ServerProcess trainer({"--steps=-1", "--consumers=checkpoint"},
                        "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  CommandResult first = RunCommand(Job(trainer, chain, 1));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.err, HasSubstr("the chain's end is not known"));
  EXPECT_THAT(first.out, HasSubstr("full batches 0.."));
  EXPECT_THAT(first.out,
              HasSubstr("removed incr-000000000001-001000000000.ckpt"))
      << first.out;
  EXPECT_FALSE(std::filesystem::exists(damaged.path));
  EXPECT_TRUE(ChainProblems(ListChain(chain).value()).empty());
  absl::StatusOr<LoadedChain> loaded = LoadChain(chain);
  EXPECT_TRUE(loaded.ok()) << loaded.status() << "\n" << first.out;
  if (loaded.ok()) {
    ASSERT_EQ(loaded->links.size(), 1u);
    EXPECT_TRUE(loaded->links[0].full);
    EXPECT_LT(loaded->end_batch, kFar);
  }

  // The job starts again on the chain and continues it.
  CommandResult second = RunCommand(Job(trainer, chain, 1));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.out, HasSubstr("increment batches"));
  EXPECT_THAT(second.out, ::testing::Not(HasSubstr("removed")));
  absl::StatusOr<LoadedChain> continued = LoadChain(chain);
  ASSERT_TRUE(continued.ok()) << continued.status();
  ASSERT_TRUE(loaded.ok());
  EXPECT_GT(continued->end_batch, loaded->end_batch);
  EXPECT_EQ(continued->run_id, loaded->run_id);

  // The damaged link not the newest: the chain ends at kFar in the older run,
  // which the trainer's run (from batch 0) lost; its links go, then a full
  // link.
  const std::string second_chain = work + "/second_chain";
  WriteOldRunLink(second_chain, /*full=*/true, 0, 100);
  DamageDescription(
      WriteOldRunLink(second_chain, /*full=*/false, 100, 200).path);
  WriteOldRunLink(second_chain, /*full=*/false, 200, kFar);
  CommandResult third = RunCommand(Job(trainer, second_chain, 1));
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_THAT(third.out, HasSubstr("removing the links after batch"));
  EXPECT_THAT(third.out, HasSubstr("full batches 0.."));
  absl::StatusOr<LoadedChain> restarted = LoadChain(second_chain);
  ASSERT_TRUE(restarted.ok()) << restarted.status() << "\n" << third.out;
  EXPECT_EQ(ListChain(second_chain).value_or(std::vector<ChainLink>()).size(),
            1u);
}

TEST(CheckpointJobTest, RowsDroppedUnderTheMemoryCapMakeAFullLink) {
  const std::string work = TestTempDir() + "/checkpoint_job_resync";
  std::filesystem::remove_all(work);
  // A cap every recorded batch exceeds: the job's unread rows are dropped.
  const std::string config = WriteConfig(
      work,
      "tracker { consumers: \"checkpoint\" acknowledged_reads: true "
      "memory_cap_bytes: 1 }\n"
      "log_every_steps: 0\n");
  ServerProcess trainer({"--config=" + config, "--steps=-1"},
                        "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string chain = work + "/chain";
  CommandResult job = RunCommand(Job(trainer, chain, 2, "--dense=false"));
  ASSERT_EQ(job.exit_code, 0) << job.err;
  EXPECT_THAT(job.out, HasSubstr("resync: the tracker dropped"));
  EXPECT_EQ(Count(job.out, "full batches 0.."), 2) << job.out;
  json view = Chain(chain);
  EXPECT_TRUE(view["problems"].empty()) << view.dump();
  ASSERT_EQ(view["links"].size(), 2u) << view.dump();
  EXPECT_TRUE(view["links"][0]["superseded"].get<bool>()) << view.dump();
  EXPECT_FALSE(view["links"][1]["superseded"].get<bool>()) << view.dump();
  EXPECT_EQ(view["links"][1]["dense"], 0) << view.dump();
  absl::StatusOr<LoadedChain> loaded = LoadChain(chain);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->links.size(), 1u);
  EXPECT_TRUE(loaded->dense.empty());
}

// What the chain's directory holds is read before the service is contacted,
// and its error gives the exit code as any start-up's does
// (StartFailureExitCode): a broken chain is refused again on every restart
// (2, which systemd's RestartPreventExitStatus and a podFailurePolicy do not
// restart), a link that cannot be read may read on the next (1). Nothing is
// removed either way.
TEST(CheckpointJobTest, ABrokenChainIsRefusedAtStartAnUnreadableOneRetried) {
  const std::string work = TestTempDir() + "/checkpoint_job_refused";
  std::filesystem::remove_all(work);
  const std::string broken = work + "/broken";
  std::filesystem::create_directories(broken);
  std::ofstream(broken + "/full-000000000000-000000000004.ckpt") << "x";
  std::ofstream(broken + "/incr-000000000006-000000000008.ckpt") << "x";
  // Nothing listens on port 1: the job must fail before it would retry.
  const std::string job = RunfilePath("clients/checkpoint_job") +
                          " --target=127.0.0.1:1 --retry_s=0 --dir=";
  CommandResult refused = RunCommand(job + broken);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("is broken: batches 4..5 missing"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(broken),
                          std::filesystem::directory_iterator()),
            2);

  // A file where the directory should be: ENOTDIR, refused again too.
  CommandResult not_a_directory =
      RunCommand(job + broken + "/full-000000000000-000000000004.ckpt");
  EXPECT_EQ(not_a_directory.exit_code, 2) << not_a_directory.err;
  EXPECT_THAT(not_a_directory.err, HasSubstr("cannot list the checkpoint"));

  // The newest link cannot be read: an OS error, not damage, so no full
  // link replaces it. EIO from a sysfs file that answers every read so (its
  // size is 4096); where there is none, a symlink loop (ELOOP), whose code
  // is EIO's (Unknown).
  const std::string unreadable = work + "/unreadable";
  std::filesystem::create_directories(unreadable);
  const std::string link = unreadable + "/full-000000000000-000000000004.ckpt";
  const char* eio = "/sys/devices/software/power/autosuspend_delay_ms";
  bool reads_eio = false;
  if (int fd = open(eio, O_RDONLY); fd >= 0) {
    char byte;
    reads_eio = read(fd, &byte, 1) < 0 && errno == EIO;
    close(fd);
  }
  std::filesystem::create_symlink(reads_eio ? eio : link.c_str(), link);
  CommandResult failed = RunCommand(job + unreadable);
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_THAT(failed.err,
              HasSubstr(reads_eio ? "Input/output error" : "Too many levels"));
  EXPECT_TRUE(std::filesystem::is_symlink(link));
}

}  // namespace
}  // namespace deltastream
