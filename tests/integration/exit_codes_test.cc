// Every binary reads its command line the same way (base/command_line.h):
// --help prints its flags on stdout and exits 0; an unknown flag, a bad value
// or a stray argument is one line on stderr and exit 2 (base/process.h),
// before the binary starts anything.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

// Binaries, with a flag each defines that takes an integer (verify_model
// has none).
constexpr struct {
  const char* path;
  const char* int_flag;
} kBinaries[] = {
    {"tracker_service/tracker_server", "max_message_bytes"},
    {"trainer/trainer", "steps"},
    {"trainer/verify_model", nullptr},
    {"trainer/planner/planner", "world_size"},
    {"clients/predictor", "every_ms"},
    {"clients/checkpoint_job", "every_ms"},
    {"clients/deltactl", "timeout_ms"},
};

void ExpectUsageError(const std::string& command, const std::string& says) {
  const CommandResult result = RunCommand(command);
  EXPECT_EQ(result.exit_code, 2) << command << ": " << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << command << ": " << result.err;
  EXPECT_THAT(result.err, HasSubstr(says)) << command;
  EXPECT_TRUE(result.out.empty()) << command << ": " << result.out;
}

TEST(ExitCodesTest, HelpIsZeroAndBadUsageIsTwoInEveryBinary) {
  for (const auto& binary : kBinaries) {
    const std::string path = RunfilePath(binary.path);
    const CommandResult help = RunCommand(path + " --help");
    EXPECT_EQ(help.exit_code, 0) << binary.path << ": " << help.err;
    EXPECT_THAT(help.out, HasSubstr("usage:")) << binary.path;
    EXPECT_THAT(help.out, HasSubstr("--")) << binary.path;
    EXPECT_TRUE(help.err.empty()) << binary.path << ": " << help.err;

    ExpectUsageError(path + " --no_such_flag=1", "unknown flag --no_such_flag");
    if (binary.int_flag != nullptr) {
      ExpectUsageError(path + " --" + binary.int_flag + "=many",
                       std::string("--") + binary.int_flag + ": ");
    }
    if (std::string(binary.path) != "clients/deltactl") {  // takes commands
      ExpectUsageError(path + " stray", "unexpected argument 'stray'");
    }
  }
}

// verify_model with nothing to compare (neither --predictors nor --chain,
// or only empty ones) used to print the checkpoint's summary and exit 0,
// which a script reads as "verified"; an empty entry in --predictors was
// dropped. Both are refused with one line and exit 2 before the checkpoint
// is read; a comparison that runs still says what it compared.
TEST(ExitCodesTest, VerifyModelRefusesARunThatComparesNothing) {
  const std::string run = TestTempDir() + "/verify_run";
  const CommandResult trained =
      RunCommand(RunfilePath("trainer/trainer") +
                 " --steps=1 --checkpoint_dir=" + run + " >/dev/null");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::string verify = RunfilePath("trainer/verify_model") +
                             " --checkpoint_dir=" + run + "/checkpoints";
  for (const char* flags :
       {"", " --predictors=", " --chain=", " --predictors= --chain="}) {
    ExpectUsageError(verify + flags,
                     "nothing to compare with the trainer's checkpoint: pass "
                     "--predictors=HOST:PORT,... and/or --chain=DIR");
  }
  for (const char* flags :
       {" --predictors=127.0.0.1:1,,", " --predictors=,127.0.0.1:1",
        " --predictors=127.0.0.1:1,,127.0.0.1:2 --chain=/nonexistent"}) {
    ExpectUsageError(verify + flags, "--predictors: an empty HOST:PORT");
  }
  // A port past 65535 would reach another port (gRPC: 99999 is 34463).
  ExpectUsageError(verify + " --predictors=127.0.0.1:99999",
                   "--predictors: target '127.0.0.1:99999'");
  ExpectUsageError(RunfilePath("trainer/verify_model") + " --chain=/x",
                   "--checkpoint or --checkpoint_dir is required");
  // Something to compare: the comparison runs and says so (here: no chain
  // there, a copy that cannot be read, exit 1).
  const CommandResult compared =
      RunCommand(verify + " --chain=" + run + "/no_chain");
  EXPECT_EQ(compared.exit_code, 1) << compared.err;
  EXPECT_THAT(compared.out, HasSubstr("trainer checkpoint at step 1"));
  EXPECT_THAT(compared.out, HasSubstr("matches the trainer: NO"));
}

}  // namespace
}  // namespace deltastream
