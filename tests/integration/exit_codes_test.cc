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

}  // namespace
}  // namespace deltastream
