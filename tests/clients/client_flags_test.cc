// The client binaries refuse bad command lines and bad push input with one
// line on stderr and the documented exit code, before any server is
// contacted (the target, 127.0.0.1:1, has nobody listening).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kNobody[] = "--target=127.0.0.1:1";

void ExpectOneLineRefusal(const std::string& command, int exit_code,
                          const std::string& says = "") {
  const CommandResult result = RunCommand(command);
  EXPECT_EQ(result.exit_code, exit_code) << command << ": " << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << command << ": " << result.err;
  EXPECT_TRUE(result.out.empty()) << command << ": " << result.out;
  if (!says.empty()) {
    EXPECT_THAT(result.err, HasSubstr(says)) << command;
  }
}

TEST(DeltactlFlagsTest, BadFlagsExitTwo) {
  const std::string deltactl = RunfilePath("clients/deltactl") + " ";
  ExpectOneLineRefusal(deltactl + kNobody + " --no_such_flag=1 status", 2,
                       "unknown flag --no_such_flag");
  ExpectOneLineRefusal(deltactl + kNobody + " --timeout_ms=0 status", 2,
                       "--timeout_ms");
  ExpectOneLineRefusal(deltactl + "--target= status", 2, "--target");
  ExpectOneLineRefusal(
      deltactl + kNobody + " --count=-1 subscribe --consumer=c", 2, "--count");
  ExpectOneLineRefusal(deltactl + kNobody + " --interval_ms=0 watch", 2,
                       "--interval_ms");
}

// Each command takes its own flags, the output flags and (when it talks to
// a server) the connection flags; `<command> --help` lists exactly those.
TEST(DeltactlFlagsTest, EachCommandTakesItsOwnFlags) {
  const std::string deltactl = RunfilePath("clients/deltactl") + " ";
  const struct {
    const char* args;
    const char* says;
  } kRefusals[] = {
      {"step --consumer=c", "--consumer does not apply to step"},
      {"--every_ms=5 get --consumer=c", "--every_ms does not apply to get"},
      {"chain --dir=/tmp", "--target does not apply to chain"},
      {"status -o xml", "expected text, wide, json or yaml"},
      {"status --json -o yaml", "--json and -o yaml disagree"},
      {"step now", "unexpected argument 'now' to step"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"", "no command"},
      {"get", "get needs --consumer"},
      {"get --consumer=c --top_percentage=10 --top_count=5",
       "get takes --top_percentage or --top_count, not both"},
      {"subscribe --consumer=c --top_count=5 --top_percentage=1",
       "subscribe takes --top_percentage or --top_count, not both"},
      {"consumers rename x", "consumers takes list, add or remove"},
  };
  for (const auto& refusal : kRefusals) {
    ExpectOneLineRefusal(deltactl + kNobody + " " + refusal.args, 2,
                         refusal.says);
  }
  // A failed request is 1, the same flags through $DELTACTL_TARGET.
  ExpectOneLineRefusal(
      "DELTACTL_TARGET=127.0.0.1:1 " + deltactl + "--timeout_ms=2000 status", 1,
      "cannot reach 127.0.0.1:1");

  const CommandResult get = RunCommand(deltactl + "get --help");
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_TRUE(get.err.empty()) << get.err;
  for (const char* flag : {"--consumer=", "--top_count=", "--out=", "--json",
                           "--output=", "--target=", "--tls_ca="}) {
    EXPECT_THAT(get.out, HasSubstr(flag)) << get.out;
  }
  for (const char* flag : {"--every_ms", "--dir", "--json_file", "--end_"}) {
    EXPECT_THAT(get.out, Not(HasSubstr(flag))) << get.out;
  }
  // Help wins over a bad flag; `help chain` is `chain --help`; chain
  // connects nowhere.
  const CommandResult chain = RunCommand(deltactl + "chain --bad --help");
  EXPECT_EQ(chain.exit_code, 0) << chain.err;
  EXPECT_EQ(chain.out, RunCommand(deltactl + "help chain").out);
  EXPECT_THAT(chain.out, HasSubstr("--dir="));
  EXPECT_THAT(chain.out, Not(HasSubstr("--target")));
  const CommandResult all = RunCommand(deltactl + "--help");
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("subscribe"));
  EXPECT_THAT(all.out, Not(HasSubstr("--consumer")));
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TestTempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DeltactlPushTest, RefusesIdsThatDoNotFitInt64) {
  const std::string file =
      WriteFile("big_ids.json",
                R"({"tables": {"t": {"ids": [1, 9223372036854775808]}}})");
  ExpectOneLineRefusal(RunfilePath("clients/deltactl") + " " + kNobody +
                           " push --json_file=" + file,
                       1, "ID 9223372036854775808 is outside int64");
}

TEST(DeltactlPushTest, RefusesRepeatedKeys) {
  const std::string file = WriteFile(
      "repeated.json", R"({"tables": {"t": {"ids": [1]}, "t": {"ids": [2]}}})");
  ExpectOneLineRefusal(RunfilePath("clients/deltactl") + " " + kNobody +
                           " push --json_file=" + file,
                       1, "\"t\" appears twice");
}

TEST(CheckpointJobFlagsTest, BadFlagsExitTwo) {
  const std::string job = RunfilePath("clients/checkpoint_job") + " ";
  const std::string dir = "--dir=" + TestTempDir() + "/chain_flags";
  ExpectOneLineRefusal(job + kNobody + " " + dir + " --no_such_flag=1", 2,
                       "unknown flag");
  ExpectOneLineRefusal(job + kNobody + " " + dir + " --every_ms=-1", 2,
                       "must be >= 0");
  ExpectOneLineRefusal(job + kNobody, 2, "--dir");
  ExpectOneLineRefusal(job + "--target= " + dir, 2, "--target");
  ExpectOneLineRefusal(job + kNobody + " " + dir + " stray", 2,
                       "unexpected argument");
}

// What a client would send or connect to is checked before it is tried: a
// token file whose token gRPC cannot send (it aborted the process), TLS
// roots that hold no certificate (gRPC logged its own lines and every call
// failed as an unreachable server), a port past 65535 (gRPC connected to
// the port modulo 65536).
TEST(ClientFlagsTest, TokensRootsAndTargetsAreCheckedBeforeAnyCall) {
  const std::string dir = TestTempDir() + "/client_flags_credentials";
  std::filesystem::create_directories(dir);
  WriteText(dir + "/control.tok",
            "abc\x01"
            "def-0123456789\n");
  WriteText(dir + "/accent.tok",
            "abc\xc3\xa9"
            "def-0123456789\n");
  WriteText(dir + "/garbage.pem", "not a certificate\n");
  const std::vector<std::string> binaries = {
      RunfilePath("clients/deltactl") + " %s status",
      RunfilePath("clients/checkpoint_job") + " %s --dir=" + dir + "/chain",
      RunfilePath("clients/predictor") + " %s --listen=127.0.0.1:0"};
  for (const std::string& binary : binaries) {
    const auto with = [&](const std::string& flags) {
      std::string command = binary;
      command.replace(command.find("%s"), 2, flags);
      return command;
    };
    ExpectOneLineRefusal(
        with(std::string(kNobody) + " --token_file=" + dir + "/control.tok"), 2,
        "printable ASCII");
    ExpectOneLineRefusal(
        with(std::string(kNobody) + " --token_file=" + dir + "/accent.tok"), 2,
        "printable ASCII");
    ExpectOneLineRefusal(
        with(std::string(kNobody) + " --tls_ca=" + dir + "/garbage.pem"), 2,
        "holds no PEM certificate");
    ExpectOneLineRefusal(with("--target=127.0.0.1:99999"), 2,
                         "127.0.0.1:99999");
  }
}

// A replica database whose path cannot be made (a missing parent, a file
// on the way) is refused as a restart would refuse it again: 2 (RocksDB's
// I/O error was Internal, 1).
TEST(PredictorFlagsTest, AReplicaDatabaseThatCannotBeMadeExitsTwo) {
  const std::string dir = TestTempDir() + "/predictor_flags_replica";
  std::filesystem::create_directories(dir);
  WriteText(dir + "/file", "");
  for (const std::string& path : {dir + "/missing/a/b", dir + "/file/db"}) {
    ExpectOneLineRefusal(RunfilePath("clients/predictor") + " " + kNobody +
                             " --listen=127.0.0.1:0 --replica_db=" + path,
                         2, path);
  }
}

TEST(CheckpointJobFlagsTest, RetriesAnUnreachableTrainerByDefault) {
  Background job(RunfilePath("clients/checkpoint_job") + " " + kNobody +
                     " --every_ms=50 --dir=" + TestTempDir() + "/chain_retry",
                 TestTempDir() + "/job_retry");
  // It says it retries (or fails, without retries) once it started; up to
  // 60 s on a busy machine.
  for (int i = 0; i < 600 && job.err().find("retrying") == std::string::npos &&
                  job.err().find("cannot reach") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(job.err(), HasSubstr("retrying for 60s"));
  // Still retrying a second later (it would have exited 1 at once without
  // retries): a SIGTERM ends it cleanly.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(job.Stop(SIGTERM), 0) << job.err();
}

}  // namespace
}  // namespace deltastream
