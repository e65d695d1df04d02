#ifndef DELTASTREAM_TESTS_BASE_GRPC_HEALTH_H_
#define DELTASTREAM_TESTS_BASE_GRPC_HEALTH_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace deltastream {

// What a Kubernetes gRPC probe does: grpc.health.v1.Health/Check of
// `service` ("" : the server) with a 5 s deadline. The messages are encoded
// by hand (Debian ships no generated health stubs): HealthCheckRequest is
// field 1 (string), HealthCheckResponse field 1 (enum: 1 SERVING,
// 2 NOT_SERVING).
struct HealthAnswer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  int serving_status = 0;  // 1 SERVING, 2 NOT_SERVING (when code is OK)
};

inline HealthAnswer CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service = "") {
  grpc::GenericStub stub(channel);
  std::string request(1, '\x0a');
  request += static_cast<char>(service.size());
  request += service;
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &in, &out, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  HealthAnswer answer;
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) return answer;
  answer.code = status.error_code();
  if (status.ok()) {
    grpc::Slice response;
    if (out.TrySingleSlice(&response).ok() && response.size() >= 2 &&
        response.begin()[0] == 0x08) {
      answer.serving_status = response.begin()[1];
    } else if (out.Length() == 0) {
      answer.serving_status = 0;  // UNKNOWN (proto3 default)
    }
  }
  return answer;
}

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_BASE_GRPC_HEALTH_H_
