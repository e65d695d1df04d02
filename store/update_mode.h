#ifndef DELTASTREAM_STORE_UPDATE_MODE_H_
#define DELTASTREAM_STORE_UPDATE_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// Which recorded state a row keeps when it is looked up more than once between
// two reads. The store holds one state per row and applies this rule at
// compaction and when a delta is read.
enum class UpdateMode {
  kNone,   // IDs only: no states are stored.
  kFirst,  // The state of the row's first occurrence in batch order.
  kLast,   // The state of the row's last occurrence in batch order.
};

absl::string_view UpdateModeName(UpdateMode mode);

// Parses "none", "first" or "last"; InvalidArgument otherwise.
absl::StatusOr<UpdateMode> ParseUpdateMode(absl::string_view name);

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_UPDATE_MODE_H_
