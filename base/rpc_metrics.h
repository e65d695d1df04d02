#ifndef DELTASTREAM_BASE_RPC_METRICS_H_
#define DELTASTREAM_BASE_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>

namespace deltastream {

// RPC counts and latencies of a gRPC server, by method and status code, as
// a server interceptor (the names of go-grpc-prometheus, which dashboards
// know):
//   grpc_server_started_total{grpc_service, grpc_method}
//   grpc_server_handled_total{grpc_service, grpc_method, grpc_code}
//   grpc_server_handling_seconds{grpc_service, grpc_method, grpc_code}
//     (histogram; for a stream, its whole duration)
// grpc_service is the full service name ("deltastream.v1.ReplicaLookup"),
// grpc_code the canonical code's name ("OK", "NOT_FOUND"). A method the
// binary does not serve (a name a client made up, answered UNIMPLEMENTED)
// counts as grpc_service="unknown", grpc_method="unknown": clients cannot
// add series.
//
// Usage, before the server starts:
//   RpcMetrics rpc_metrics(*registry);
//   std::vector<std::unique_ptr<
//       grpc::experimental::ServerInterceptorFactoryInterface>> factories;
//   factories.push_back(rpc_metrics.NewInterceptorFactory());
//   builder.experimental().SetInterceptorCreators(std::move(factories));
//
// Thread safety: safe for any number of concurrent RPCs. The RpcMetrics
// and the registry must outlive the server.
class RpcMetrics {
 public:
  // Adds the three families to `registry` (not owned).
  explicit RpcMetrics(prometheus::Registry& registry);
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  // A factory creating one interceptor per RPC that records into these
  // families (for ServerBuilder::experimental().SetInterceptorCreators).
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

  // Records a started RPC; `full_method` is "/package.Service/Method".
  void Started(const char* full_method);
  // Records a finished RPC with its code and duration.
  void Handled(const char* full_method, grpc::StatusCode code, double seconds);

 private:
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& handling_seconds_;
};

// The canonical name of a gRPC status code ("OK", "DEADLINE_EXCEEDED").
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_RPC_METRICS_H_
