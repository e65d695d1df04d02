// base/command_line.h: flags read as every binary reads them, errors as one
// line, help without an error.
#include "base/command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_FLAG(std::string, name, "", "a string");
ABSL_FLAG(int, count, 3, "an int");
ABSL_FLAG(bool, verbose, false, "a bool");
ABSL_FLAG(std::string, output, "", "output format");

namespace deltastream {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Owns argv for one ParseCommandLine call.
class Argv {
 public:
  Argv(std::initializer_list<std::string> args) : storage_({"program"}) {
    storage_.insert(storage_.end(), args);
    for (std::string& arg : storage_) pointers_.push_back(arg.data());
  }
  int argc() { return static_cast<int>(pointers_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> pointers_;
};

absl::StatusOr<ParsedCommandLine> Parse(
    std::initializer_list<std::string> args,
    const CommandLineOptions& options = {}) {
  Argv argv(args);
  return ParseCommandLine(argv.argc(), argv.argv(), options);
}

class CommandLineTest : public ::testing::Test {
  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(CommandLineTest, ReadsEverySpelling) {
  CommandLineOptions options;
  options.allow_positional = true;
  options.short_names = {{"o", "output"}};
  auto parsed = Parse({"--name=a", "-count", "7", "--verbose", "get", "-o",
                       "yaml", "-", "--", "--not-a-flag"},
                      options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->flags, ElementsAre("name", "count", "verbose", "output"));
  EXPECT_THAT(parsed->positional, ElementsAre("get", "-", "--not-a-flag"));
  EXPECT_FALSE(parsed->help);
  EXPECT_EQ(absl::GetFlag(FLAGS_name), "a");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 7);
  EXPECT_TRUE(absl::GetFlag(FLAGS_verbose));
  EXPECT_EQ(absl::GetFlag(FLAGS_output), "yaml");

  ASSERT_TRUE(Parse({"--noverbose", "-o=json"}, options).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_verbose));
  EXPECT_EQ(absl::GetFlag(FLAGS_output), "json");
}

TEST_F(CommandLineTest, RefusesWithOneLineNamingTheArgument) {
  auto message = [](std::initializer_list<std::string> args) {
    return std::string(Parse(args).status().message());
  };
  EXPECT_EQ(message({"--no_such_flag=1"}), "unknown flag --no_such_flag");
  EXPECT_THAT(message({"--count=x"}), HasSubstr("--count: "));
  EXPECT_EQ(message({"--name"}), "--name needs a value");
  EXPECT_EQ(message({"stray"}), "unexpected argument 'stray'");
  // A short name is only one with a single dash, and only where declared.
  EXPECT_EQ(message({"-o", "json"}), "unknown flag -o");
  // absl's own flags are absl::ParseCommandLine's, which nothing calls.
  EXPECT_EQ(message({"--flagfile=f"}), "unknown flag --flagfile");
  EXPECT_EQ(Parse({"--count=x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CommandLineTest, HelpWinsOverErrors) {
  for (const char* help : {"--help", "-h", "--helpfull", "--helpshort"}) {
    auto parsed = Parse({"--no_such_flag", help});
    ASSERT_TRUE(parsed.ok()) << help << ": " << parsed.status();
    EXPECT_TRUE(parsed->help) << help;
  }
}

TEST_F(CommandLineTest, HelpListsTheBinarysFlagsOnly) {
  std::vector<absl::CommandLineFlag*> flags = BinaryFlags();
  std::vector<std::string> names;
  for (const absl::CommandLineFlag* flag : flags) {
    names.emplace_back(flag->Name());
  }
  // gtest's flags are not absl flags; absl's own are left out.
  EXPECT_THAT(names, ElementsAre("count", "name", "output", "verbose"));
  EXPECT_EQ(FlagsHelp(flags),
            "  --count=INT      an int (default: 3)\n"
            "  --name=STRING    a string\n"
            "  --output=STRING  output format\n"
            "  --verbose        a bool\n");
}

}  // namespace
}  // namespace deltastream
