#ifndef DELTASTREAM_TESTS_INTEGRATION_PREDICTOR_STATUS_H_
#define DELTASTREAM_TESTS_INTEGRATION_PREDICTOR_STATUS_H_

// Asking a running predictor (clients/predictor) how far it is, as the tests
// and benchmarks that start one do.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>

#include "proto/predictor.grpc.pb.h"

namespace deltastream {

// The predictor's answer to ReplicaLookup.Status within 5 s; none when the
// call fails (not up yet, gone, or too slow).
inline std::optional<v1::PredictorStatus> PredictorStatusOf(
    v1::ReplicaLookup::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  v1::PredictorStatus status;
  if (!stub.Status(&context, v1::PredictorStatusRequest(), &status).ok()) {
    return std::nullopt;
  }
  return status;
}

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_INTEGRATION_PREDICTOR_STATUS_H_
