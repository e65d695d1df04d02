#ifndef DELTASTREAM_CLIENTS_COMMAND_LINE_H_
#define DELTASTREAM_CLIENTS_COMMAND_LINE_H_

#include <string>

namespace deltastream {

// Checks every argument of a command line against the absl flags linked into
// the binary before absl::ParseCommandLine sees them (absl's parser prints
// several lines and exits 1 on a bad flag; the clients exit 2 with one line):
// each flag is known and its value parses. Positional arguments are refused
// unless `allow_positional` (deltactl's commands); a "--" ends the flags.
// Returns the first problem as one line, or "" when there is none.
//
// Parses values into the flags as a side effect (ParseCommandLine sets them
// again). Call from main() before other threads start.
std::string CommandLineError(int argc, char** argv,
                             bool allow_positional = false);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_COMMAND_LINE_H_
