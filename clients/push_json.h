#ifndef DELTASTREAM_CLIENTS_PUSH_JSON_H_
#define DELTASTREAM_CLIENTS_PUSH_JSON_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "clients/delta_client.h"

namespace deltastream {

// Parses the lookups `deltactl push` records, as JSON:
//
//   {"tables": {"FQN": {"ids": [int64, ...],
//                       "states": [[number, ...], ...]}}}   (states optional)
//
// into one RecordTable per table, in the order of their names: ids int64 [n],
// states (when given) float32 [rows, dim].
//
// Refused, with nothing parsed, as InvalidArgument naming `source` and the
// table: text that is not JSON; any object of the document that repeats a
// key (JSON parsers differ on which one wins, so the input is ambiguous: a
// table named twice, "ids" given twice); IDs that are not integers or lie
// outside int64 (2^63 and above would wrap into negative IDs); states that
// are not rows of numbers of one length, or numbers outside float32's finite
// range.
absl::StatusOr<std::vector<RecordTable>> ParsePushJson(
    const std::string& text, absl::string_view source);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_PUSH_JSON_H_
