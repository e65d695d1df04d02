#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

ABSL_FLAG(std::string, log_format, "text",
          "log line format on stderr: text or json");
ABSL_FLAG(std::string, log_level, "info",
          "lowest level logged: debug, info, warning or error");

namespace deltastream {
namespace {

struct LogSettings {
  absl::Mutex mu;
  std::string program ABSL_GUARDED_BY(mu) = "deltastream";
  LogFormat format ABSL_GUARDED_BY(mu) = LogFormat::kText;
  std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
};

LogSettings& Settings() {
  static LogSettings* settings = new LogSettings;
  return *settings;
}

const char* LevelName(LogLevel level, bool upper) {
  switch (level) {
    case LogLevel::kDebug:
      return upper ? "DEBUG" : "debug";
    case LogLevel::kInfo:
      return upper ? "INFO" : "info";
    case LogLevel::kWarning:
      return upper ? "WARNING" : "warning";
    case LogLevel::kError:
      return upper ? "ERROR" : "error";
  }
  return "?";
}

// JSON string contents (RFC 8259): quotes, backslashes and control
// characters escaped. In text lines, the same keeps a message on one line.
std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Text lines keep quotes and backslashes as they are: only line breaks and
// other control characters are escaped.
std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view program,
                          absl::string_view message) {
  const std::string stamp =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
  if (format == LogFormat::kJson) {
    return absl::StrCat("{\"time\":\"", stamp, "\",\"level\":\"",
                        LevelName(level, false), "\",\"program\":\"",
                        Escape(program), "\",\"message\":\"", Escape(message),
                        "\"}");
  }
  return absl::StrCat(stamp, " ", LevelName(level, true), " ", program, ": ",
                      OneLine(message));
}

void ConfigureLogging(absl::string_view program, LogFormat format,
                      LogLevel min_level) {
  LogSettings& settings = Settings();
  absl::MutexLock lock(&settings.mu);
  settings.program = std::string(program);
  settings.format = format;
  settings.min_level.store(static_cast<int>(min_level));
}

absl::Status InitLogging(absl::string_view program) {
  const std::string format_flag = absl::GetFlag(FLAGS_log_format);
  LogFormat format;
  if (format_flag == "text") {
    format = LogFormat::kText;
  } else if (format_flag == "json") {
    format = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_format='", format_flag, "' is not one of text, json"));
  }
  const std::string level_flag = absl::GetFlag(FLAGS_log_level);
  LogLevel level;
  if (level_flag == "debug") {
    level = LogLevel::kDebug;
  } else if (level_flag == "info") {
    level = LogLevel::kInfo;
  } else if (level_flag == "warning") {
    level = LogLevel::kWarning;
  } else if (level_flag == "error") {
    level = LogLevel::kError;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level='", level_flag,
                     "' is not one of debug, info, warning, error"));
  }
  ConfigureLogging(program, format, level);
  return absl::OkStatus();
}

void Log(LogLevel level, absl::string_view message) {
  LogSettings& settings = Settings();
  if (static_cast<int>(level) < settings.min_level.load()) return;
  std::string line;
  {
    absl::MutexLock lock(&settings.mu);
    line = FormatLogLine(settings.format, absl::Now(), level, settings.program,
                         message);
  }
  line += '\n';
  // One write: a line is never interleaved with another thread's.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace deltastream
