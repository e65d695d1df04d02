#include "clients/command_line.h"

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace deltastream {

std::string CommandLineError(int argc, char** argv, bool allow_positional) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      if (allow_positional) continue;
      return absl::StrCat("unexpected argument '", arg, "'");
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() &&
          equals == absl::string_view::npos) {
        continue;
      }
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", name);
    if (equals == absl::string_view::npos) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) return absl::StrCat("--", name, " needs a value");
      arg = argv[++i];
    } else {
      arg = arg.substr(equals + 1);
    }
    std::string error;
    if (!flag->ParseFrom(arg, &error)) {
      return absl::StrCat("--", name, ": ", error);
    }
  }
  return "";
}

}  // namespace deltastream
