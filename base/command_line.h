#ifndef DELTASTREAM_BASE_COMMAND_LINE_H_
#define DELTASTREAM_BASE_COMMAND_LINE_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace deltastream {

// Reading a binary's command line into the absl flags linked into it, the
// same way in every binary of the project. absl::ParseCommandLine prints
// several lines and exits 1 on a bad flag, and exits 1 after --help; the
// project's binaries print one line and exit 2 (base/process.h kExitUsage)
// on a bad command line, and exit 0 after printing the help asked for.
//
// Nothing here is thread-safe: call it from main() before other threads
// start (setting a flag races with reading it).

struct CommandLineOptions {
  // Positional arguments (deltactl's commands) are taken; otherwise the first
  // one is an error.
  bool allow_positional = false;
  // One-letter spellings of flags: {"o", "output"} reads `-o json` and
  // `-o=json` as `--output=json`.
  std::vector<std::pair<std::string, std::string>> short_names;
};

struct ParsedCommandLine {
  // The flags given, by their registered names (a short name or a --noNAME
  // spelling resolved), in the order given; a flag given twice is listed
  // twice (its last value wins).
  std::vector<std::string> flags;
  // Positional arguments in order, those after a "--" included.
  std::vector<std::string> positional;
  // --help, -h, --helpfull or --helpshort was given.
  bool help = false;
};

// Reads argv[1..argc): "--name=value", "--name value", "-name" spellings,
// "--noname" for a bool, a short name, "--" ending the flags; "-" alone is
// positional. Each flag must be one the binary defines (absl's own, such as
// --flagfile, are not taken) and its value must parse; flags are set as they
// are read. Returns the flags and positional arguments, or
// InvalidArgumentError with the first problem as one line naming the
// argument ("unknown flag --x", "--timeout_ms: ..."). When help is asked for
// anywhere, returns it without an error so that `cmd --bad --help` still
// prints help.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(
    int argc, char** argv, const CommandLineOptions& options = {});

// The flags the binary defines (absl's own left out), sorted by name.
std::vector<absl::CommandLineFlag*> BinaryFlags();

// One aligned line per flag: "  --name=TYPE  help (default: D)"; a bool
// reads "--name", and the default is left out when it is empty, false or 0.
std::string FlagsHelp(absl::Span<absl::CommandLineFlag* const> flags);

// What main() does first in a binary without commands: ParseCommandLine
// (positional arguments refused). On --help prints the program usage message
// (absl::SetProgramUsageMessage) and FlagsHelp(BinaryFlags()) on stdout and
// returns 0; on a bad command line prints "<program>: <problem>" on stderr
// and returns kExitUsage. Returns std::nullopt when main() should go on, the
// flags set:
//
//   if (std::optional<int> exit_code = HandleCommandLine(argc, argv)) {
//     return *exit_code;
//   }
std::optional<int> HandleCommandLine(int argc, char** argv);

// Whether the command line that ParseCommandLine (or HandleCommandLine) last
// read gave the flag registered as `name`: for a flag whose default means
// "not given" (an override), so that any value given can be checked.
bool FlagGiven(absl::string_view name);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_COMMAND_LINE_H_
