#include "base/rpc_metrics.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "base/metrics.h"

namespace deltastream {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/pkg.Service/Method" -> {"pkg.Service", "Method"} when the binary
// knows that method: a protobuf service linked into it (the generated
// descriptors: the tracker, the predictor's lookup API, reflection) or
// gRPC's health service (which gRPC serves without protobuf's descriptors).
// Any other name a client sends (answered UNIMPLEMENTED) is {"unknown",
// "unknown"}: label values a client chooses would add series without end.
std::pair<std::string, std::string> SplitMethod(absl::string_view full) {
  if (!full.empty() && full.front() == '/') full.remove_prefix(1);
  const size_t slash = full.rfind('/');
  if (slash != absl::string_view::npos) {
    const absl::string_view service = full.substr(0, slash);
    const absl::string_view method = full.substr(slash + 1);
    const bool health = service == "grpc.health.v1.Health" &&
                        (method == "Check" || method == "Watch");
    const google::protobuf::ServiceDescriptor* described =
        health ? nullptr
               : google::protobuf::DescriptorPool::generated_pool()
                     ->FindServiceByName(std::string(service));
    if (health ||
        (described != nullptr &&
         described->FindMethodByName(std::string(method)) != nullptr)) {
      return {std::string(service), std::string(method)};
    }
  }
  return {"unknown", "unknown"};
}

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method),
        start_(std::chrono::steady_clock::now()) {
    metrics_->Started(method_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) final {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start_)
                                 .count();
      metrics_->Handled(method_, methods->GetSendStatus().error_code(),
                        seconds);
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* const metrics_;
  const char* const method_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics* metrics)
      : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) final {
    if (info->method() == nullptr) return nullptr;
    return new RpcMetricsInterceptor(metrics_, info->method());
  }

 private:
  RpcMetrics* const metrics_;
};

}  // namespace

RpcMetrics::RpcMetrics(prometheus::Registry& registry)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("RPCs started on the server")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("RPCs completed on the server, by status code")
                   .Register(registry)),
      handling_seconds_(prometheus::BuildHistogram()
                            .Name("grpc_server_handling_seconds")
                            .Help("RPC duration on the server (a stream: its "
                                  "whole life), by status code")
                            .Register(registry)) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::NewInterceptorFactory() {
  return std::make_unique<RpcMetricsInterceptorFactory>(this);
}

void RpcMetrics::Started(const char* full_method) {
  auto [service, method] = SplitMethod(full_method);
  started_.Add({{"grpc_service", service}, {"grpc_method", method}})
      .Increment();
}

void RpcMetrics::Handled(const char* full_method, grpc::StatusCode code,
                         double seconds) {
  auto [service, method] = SplitMethod(full_method);
  const prometheus::Labels labels = {{"grpc_service", service},
                                     {"grpc_method", method},
                                     {"grpc_code", GrpcCodeName(code)}};
  handled_.Add(labels).Increment();
  handling_seconds_.Add(labels, SecondsBuckets()).Observe(seconds);
}

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace deltastream
