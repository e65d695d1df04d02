#ifndef DELTASTREAM_BASE_AUTH_H_
#define DELTASTREAM_BASE_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// What a call asks to do, for authorization. The tracker service
// (tracker_service/delta_tracker_service.h) and the predictor's lookup API
// (clients/replica_lookup_service.h) check every call with one authorizer.
enum class Action {
  kRecord,      // Record, Step
  kRead,        // GetDelta, Subscribe, Commit, Touch: of one named consumer
  kInspect,     // Status, ListConsumers; a predictor's Lookup, GetDense, Status
  kAdminister,  // consumers add/remove, Compact, Clear, Snapshot
};

// The rule a consumer name in a token file must follow: OK, or
// InvalidArgument whose message starts with `what` and says what is wrong.
// The tracker passes its name rule (tracker_service/names.h ValidateName).
using NameRule = absl::Status (*)(absl::string_view what,
                                  absl::string_view name);

// OK when `token` is 16 to 256 printable ASCII characters without spaces, as
// a token file's tokens and a client's --token_file must be (gRPC aborts
// the process that sends metadata with other bytes); InvalidArgument, one
// line, otherwise.
absl::Status CheckToken(absl::string_view token);

// Bearer tokens with roles, from a token file (--auth_token_file):
//
//   # comment
//   <token> admin
//   <token> producer
//   <token> consumer <name>[,<name>...]     (or * for every consumer)
//
// One grant per line, fields separated by spaces or tabs; a token is 16 to
// 256 printable characters without spaces; a consumer line names one or more
// consumers, each non-empty and following the caller's NameRule, so a line
// that grants no consumer ('a,', ',') is refused like any other malformed
// line.
// Roles: a producer may record and step; a consumer may read, subscribe and
// commit as the consumers it is granted; an admin may do everything. Every
// valid token may inspect (status, consumer list).
//
// Clients send "authorization: Bearer <token>" metadata. Check answers
// UNAUTHENTICATED for a missing or unknown token and PERMISSION_DENIED for a
// token whose role does not allow the action; tokens are compared in constant
// time. Every valid token may inspect, which is all a predictor's lookup API
// asks (the gRPC health service is not checked: probes carry no token).
// Immutable after construction: thread-safe.
class TokenAuthorizer {
 public:
  // InvalidArgument naming the line for a malformed file. `consumer_names`
  // checks every consumer name; null: only that it is non-empty (a server
  // that has no consumers, such as the predictor, grants none).
  static absl::StatusOr<TokenAuthorizer> Parse(absl::string_view text,
                                               NameRule consumer_names);
  // Parse of the file's text; InvalidArgument naming the path when it does
  // not parse, the OS's error (ReadSmallFile's) naming it when it cannot be
  // read.
  static absl::StatusOr<TokenAuthorizer> FromFile(const std::string& path,
                                                  NameRule consumer_names);

  // `consumer` names the consumer a kRead acts as.
  grpc::Status Check(const grpc::ServerContext& context, Action action,
                     absl::string_view consumer = "") const;

 private:
  enum class Role { kProducer, kConsumer, kAdmin };
  struct Grant {
    std::string token;
    Role role;
    std::vector<std::string> consumers;  // kConsumer; {"*"} for all
  };

  explicit TokenAuthorizer(std::vector<Grant> grants)
      : grants_(std::move(grants)) {}

  std::vector<Grant> grants_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_AUTH_H_
