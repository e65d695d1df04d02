#include "tracker_service/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deltastream {

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be 1 to ", kMaxNameBytes, " bytes, got ", name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '-' && c != '.') {
      // CHexEscape: the name may hold anything, the message stays one line.
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s '%s' may only hold letters, digits, '_', '-' and '.'", what,
          absl::CHexEscape(name)));
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream
