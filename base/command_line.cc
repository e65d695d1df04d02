#include "base/command_line.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/process.h"

namespace deltastream {
namespace {

// absl's own flags (--flagfile, --fromenv, ...) are absl::ParseCommandLine's
// business, which the project's binaries do not call.
bool IsAbslFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

absl::CommandLineFlag* FindBinaryFlag(absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag == nullptr || IsAbslFlag(*flag) || flag->IsRetired() ? nullptr
                                                                   : flag;
}

// The flags of the command line ParseCommandLine read last (FlagGiven).
std::vector<std::string>& GivenFlags() {
  static auto* given = new std::vector<std::string>();
  return *given;
}

bool IsHelp(absl::string_view name) {
  return name == "help" || name == "h" || name == "helpfull" ||
         name == "helpshort";
}

std::string TypeName(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<std::string>()) return "STRING";
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "NUMBER";
  if (flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>() ||
      flag.IsOfType<uint32_t>() || flag.IsOfType<uint64_t>()) {
    return "INT";
  }
  return "VALUE";
}

}  // namespace

absl::StatusOr<ParsedCommandLine> ParseCommandLine(
    int argc, char** argv, const CommandLineOptions& options) {
  ParsedCommandLine parsed;
  std::string error;  // the first problem
  auto fail = [&error](std::string message) {
    if (error.empty()) error = std::move(message);
  };
  bool flags_ended = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (flags_ended || !absl::StartsWith(arg, "-") || arg == "-") {
      if (!options.allow_positional) {
        fail(absl::StrCat("unexpected argument '", arg, "'"));
      }
      parsed.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t equals = arg.find('=');
    absl::string_view name = arg.substr(0, equals);
    if (IsHelp(name)) {
      parsed.help = true;
      continue;
    }
    const bool long_form = absl::StartsWith(argv[i], "--");
    for (const auto& [short_name, long_name] : options.short_names) {
      if (!long_form && name == short_name) name = long_name;
    }
    absl::CommandLineFlag* flag = FindBinaryFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") &&
        equals == absl::string_view::npos) {
      absl::CommandLineFlag* negated = FindBinaryFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        std::string parse_error;
        negated->ParseFrom("false", &parse_error);
        parsed.flags.emplace_back(negated->Name());
        continue;
      }
    }
    if (flag == nullptr) {
      fail(absl::StrCat("unknown flag ", long_form ? "--" : "-", name));
      continue;
    }
    absl::string_view value;
    if (equals != absl::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fail(absl::StrCat("--", flag->Name(), " needs a value"));
      continue;
    }
    parsed.flags.emplace_back(flag->Name());
    std::string parse_error;
    if (!flag->ParseFrom(value, &parse_error)) {
      fail(absl::StrCat("--", flag->Name(), ": ", parse_error));
    }
  }
  GivenFlags() = parsed.flags;
  if (!error.empty() && !parsed.help) {
    return absl::InvalidArgumentError(error);
  }
  return parsed;
}

bool FlagGiven(absl::string_view name) {
  const std::vector<std::string>& given = GivenFlags();
  return std::find(given.begin(), given.end(), name) != given.end();
}

std::vector<absl::CommandLineFlag*> BinaryFlags() {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsAbslFlag(*flag) && !flag->IsRetired()) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return flags;
}

std::string FlagsHelp(absl::Span<absl::CommandLineFlag* const> flags) {
  std::vector<std::pair<std::string, std::string>> lines;
  size_t width = 0;
  for (const absl::CommandLineFlag* flag : flags) {
    std::string spelling = absl::StrCat("--", flag->Name());
    if (!flag->IsOfType<bool>())
      absl::StrAppend(&spelling, "=", TypeName(*flag));
    std::string help = flag->Help();
    const std::string default_value = flag->DefaultValue();
    if (!default_value.empty() && default_value != "false" &&
        default_value != "0") {
      absl::StrAppend(&help, " (default: ", default_value, ")");
    }
    width = std::max(width, spelling.size());
    lines.emplace_back(std::move(spelling), std::move(help));
  }
  std::string out;
  for (const auto& [spelling, help] : lines) {
    absl::StrAppendFormat(&out, "  %-*s  %s\n", static_cast<int>(width),
                          spelling, help);
  }
  return out;
}

std::optional<int> HandleCommandLine(int argc, char** argv) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseCommandLine(argc, argv);
  if (!parsed.ok()) return Fail(kExitUsage, parsed.status());
  if (parsed->help) {
    std::cout << "usage: " << absl::ProgramUsageMessage() << "\n\nflags:\n"
              << FlagsHelp(BinaryFlags());
    return 0;
  }
  return std::nullopt;
}

}  // namespace deltastream
