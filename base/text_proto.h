#ifndef DELTASTREAM_BASE_TEXT_PROTO_H_
#define DELTASTREAM_BASE_TEXT_PROTO_H_

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// Parses protobuf text format (the trainer's configs, sharding plans, planner
// constraints) into `message`, which it clears first. InvalidArgument with
// the parser's first error, "line L column C: ..." (1-based), when `text` is
// not a `message` in text format (unknown fields included). The caller
// prefixes what it parsed ("config: ...").
absl::Status ParseTextProto(absl::string_view text,
                            google::protobuf::Message* message);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_TEXT_PROTO_H_
