#ifndef DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_
#define DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "clients/predictor.h"
#include "proto/predictor.grpc.pb.h"

namespace deltastream {

// The predictor's lookup API (proto/predictor.proto, service ReplicaLookup):
// translates requests to the replica's calls and statuses to gRPC's; the
// semantics live in Replica and Predictor.
//
// Lookup: UNAVAILABLE before the replica holds a version; the replica's
// errors (NOT_FOUND for a table it does not hold, INVALID_ARGUMENT for IDs
// that are not int64 [n]) otherwise. Thread-safe: gRPC calls it from many
// threads.
class ReplicaLookupService final : public v1::ReplicaLookup::Service {
 public:
  // `predictor` is not owned and must outlive the service.
  explicit ReplicaLookupService(const Predictor* predictor)
      : predictor_(predictor) {}

  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status GetDense(grpc::ServerContext*, const v1::GetDenseRequest*,
                        v1::GetDenseResponse* response) override;
  grpc::Status Status(grpc::ServerContext*, const v1::PredictorStatusRequest*,
                      v1::PredictorStatus* response) override;

 private:
  const Predictor* const predictor_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_REPLICA_LOOKUP_SERVICE_H_
