#ifndef DELTASTREAM_TRACKER_SERVICE_NAMES_H_
#define DELTASTREAM_TRACKER_SERVICE_NAMES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// The one rule for the names the tracker keeps and the service accepts:
// consumer names and table FQNs are 1 to kMaxNameBytes bytes of ASCII
// letters, digits, '_', '-' and '.'. The rule is the same on every path
// (tracker options, AddConsumer, records, snapshots, requests over the wire,
// token files), so that a name accepted in one place is accepted everywhere.
inline constexpr size_t kMaxNameBytes = 256;

// OK when `name` follows the rule; otherwise InvalidArgument, one line that
// starts with `what` (for example "consumer name") and says what is wrong.
absl::Status ValidateName(absl::string_view what, absl::string_view name);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_NAMES_H_
