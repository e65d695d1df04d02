#ifndef DELTASTREAM_BASE_LOG_H_
#define DELTASTREAM_BASE_LOG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace deltastream {

// Levelled, timestamped log lines on stderr, one library for every binary
// (trainer, tracker_server, predictor, checkpoint job).
//
// Two formats, chosen by --log_format (defined here, so every binary that
// links this library takes it):
//   text (default): 2026-11-24T02:40:51.123456Z INFO predictor: message
//   json: {"time":"2026-11-24T02:40:51.123456Z","level":"info",
//          "program":"predictor","message":"message"}   (one object a line)
// Times are UTC with microseconds. Lines below --log_level
// (debug|info|warning|error, default info) are dropped.
//
// Thread safety: every function is safe to call from any thread; each line
// is written with one write(2), so lines of different threads never mix.
// Lines logged before InitLogging() use the text format, level info and the
// program name "deltastream".

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

enum class LogFormat { kText, kJson };

// Reads --log_format and --log_level and names the program in every line.
// InvalidArgument (one line naming the flag and value) when a value is not
// one of the above; the settings are then unchanged. Call from main() after
// the flags are parsed.
absl::Status InitLogging(absl::string_view program);

// Sets the format, the lowest level written and the program name directly
// (tests, and binaries that do not use the flags).
void ConfigureLogging(absl::string_view program, LogFormat format,
                      LogLevel min_level);

// Writes `message` as one line at `level` (newlines in it are escaped).
void Log(LogLevel level, absl::string_view message);
inline void LogDebug(absl::string_view message) {
  Log(LogLevel::kDebug, message);
}
inline void LogInfo(absl::string_view message) {
  Log(LogLevel::kInfo, message);
}
inline void LogWarning(absl::string_view message) {
  Log(LogLevel::kWarning, message);
}
inline void LogError(absl::string_view message) {
  Log(LogLevel::kError, message);
}

// The line Log() writes for these values, without the trailing newline (for
// tests and for binaries that log elsewhere than stderr).
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view program, absl::string_view message);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_LOG_H_
