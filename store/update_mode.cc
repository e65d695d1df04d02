#include "store/update_mode.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

absl::string_view UpdateModeName(UpdateMode mode) {
  switch (mode) {
    case UpdateMode::kNone:
      return "none";
    case UpdateMode::kFirst:
      return "first";
    case UpdateMode::kLast:
      return "last";
  }
  return "unknown";
}

absl::StatusOr<UpdateMode> ParseUpdateMode(absl::string_view name) {
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    if (name == UpdateModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown update mode '", name, "': expected none, first or last"));
}

}  // namespace deltastream
