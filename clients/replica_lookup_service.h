#ifndef DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_
#define DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "base/auth.h"
#include "clients/predictor.h"
#include "proto/predictor.grpc.pb.h"

namespace deltastream {

// The predictor's lookup API (proto/predictor.proto, service ReplicaLookup):
// translates requests to the replica's calls and statuses to gRPC's; the
// semantics live in Replica and Predictor.
//
// Lookup: UNAVAILABLE before the replica holds a version; the replica's
// errors (NOT_FOUND for a table it does not hold, INVALID_ARGUMENT for IDs
// that are not int64 [n]) otherwise. With an authorizer every call needs a
// valid bearer token (any role: Action::kInspect): UNAUTHENTICATED for a
// missing or unknown one, checked before anything else. The gRPC health and
// reflection services beside it are not checked (probes carry no token).
// Thread-safe: gRPC calls it from many threads.
class ReplicaLookupService final : public v1::ReplicaLookup::Service {
 public:
  // `predictor` and `auth` (null: no tokens checked) are not owned and must
  // outlive the service.
  explicit ReplicaLookupService(const Predictor* predictor,
                                const TokenAuthorizer* auth = nullptr)
      : predictor_(predictor), auth_(auth) {}

  grpc::Status Lookup(grpc::ServerContext* context,
                      const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status GetDense(grpc::ServerContext* context,
                        const v1::GetDenseRequest*,
                        v1::GetDenseResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::PredictorStatusRequest*,
                      v1::PredictorStatus* response) override;

 private:
  // OK without an authorizer; otherwise its verdict on `context`'s token.
  grpc::Status Authorize(const grpc::ServerContext& context) const;

  const Predictor* const predictor_;
  const TokenAuthorizer* const auth_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_
