#ifndef DELTASTREAM_TRACKER_SERVICE_AUTH_H_
#define DELTASTREAM_TRACKER_SERVICE_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// What a call asks to do, for authorization.
enum class Action {
  kRecord,      // Record, Step
  kRead,        // GetDelta, Subscribe, Commit: of one named consumer
  kInspect,     // Status, ListConsumers
  kAdminister,  // consumers add/remove, Compact, Clear, Snapshot
};

// Bearer tokens with roles, from a token file (--auth_token_file):
//
//   # comment
//   <token> admin
//   <token> producer
//   <token> consumer <name>[,<name>...]     (or * for every consumer)
//
// One grant per line, fields separated by spaces or tabs; a token is 16 to
// 256 printable characters without spaces; a consumer line names one or more
// consumers, each by the name rule (tracker_service/names.h), so a line that
// grants no consumer ('a,', ',') is refused like any other malformed line.
// Roles: a producer may record and step; a consumer may read, subscribe and
// commit as the consumers it is granted; an admin may do everything. Every
// valid token may inspect (status, consumer list).
//
// Clients send "authorization: Bearer <token>" metadata. Check answers
// UNAUTHENTICATED for a missing or unknown token and PERMISSION_DENIED for a
// token whose role does not allow the action; tokens are compared in constant
// time. Immutable after construction: thread-safe.
class TokenAuthorizer {
 public:
  // InvalidArgument naming the line for a malformed file.
  static absl::StatusOr<TokenAuthorizer> Parse(absl::string_view text);
  static absl::StatusOr<TokenAuthorizer> FromFile(const std::string& path);

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

#endif  // DELTASTREAM_TRACKER_SERVICE_AUTH_H_
