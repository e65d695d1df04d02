// base/metrics.h, base/rpc_metrics.h and base/log.h: an endpoint scraped
// over real HTTP, its address rules, RPC metrics of a real gRPC server on
// loopback, and the two log formats.
#include "base/metrics.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/grpc_server.h"
#include "base/log.h"
#include "base/rpc_metrics.h"
#include "tests/base/grpc_health.h"
#include "tests/base/http_scrape.h"

namespace deltastream {
namespace {

TEST(MetricsEndpointTest, ServesItsRegistryOverHttp) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("deltastream_test_events_total")
      .Help("events")
      .Register(*registry)
      .Add({{"table", "t0"}})
      .Increment(3);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  EXPECT_EQ((*endpoint)->address(),
            "127.0.0.1:" + std::to_string((*endpoint)->port()));
  const std::string scrape = ScrapeMetrics((*endpoint)->port());
  EXPECT_NE(scrape.find("200 OK"), std::string::npos) << scrape;
  EXPECT_NE(scrape.find("# TYPE deltastream_test_events_total counter"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("deltastream_test_events_total{table=\"t0\"} 3"),
            std::string::npos)
      << scrape;
}

TEST(MetricsEndpointTest, ServesAddedCollectablesWhileTheyLive) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("localhost:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  auto extra = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("deltastream_test_level")
      .Help("a level")
      .Register(*extra)
      .Add({})
      .Set(7);
  (*endpoint)->Add(extra);
  EXPECT_NE(ScrapeMetrics((*endpoint)->port()).find("deltastream_test_level 7"),
            std::string::npos);
  extra.reset();
  EXPECT_EQ(ScrapeMetrics((*endpoint)->port()).find("deltastream_test_level"),
            std::string::npos);
}

TEST(MetricsEndpointTest, RefusesAnAddressInUseWithOneLine) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Start((*first)->address(), registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find((*first)->address()),
            std::string::npos);
  EXPECT_EQ(second.status().message().find('\n'), std::string::npos);
}

TEST(MetricsEndpointTest, RefusesMalformedAddresses) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const std::string address :
       {"", "9090", ":9090", "127.0.0.1:x", "127.0.0.1:70000"}) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
        MetricsEndpoint::Start(address, registry);
    ASSERT_FALSE(endpoint.ok()) << address;
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
}

TEST(RpcMetricsTest, CountsRpcsByMethodAndCode) {
  auto registry = std::make_shared<prometheus::Registry>();
  RpcMetrics rpc_metrics(*registry);
  // A real server with the health and reflection services (reflection, a
  // sync service, is what lets the server start: health alone has none to
  // be served from): a Check of an unknown service answers NOT_FOUND, of
  // the server ("") OK.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      factories;
  factories.push_back(rpc_metrics.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(factories));
  absl::StatusOr<StartedServer> started =
      StartServer(builder, "127.0.0.1:0", grpc::InsecureServerCredentials());
  ASSERT_TRUE(started.ok()) << started.status();
  auto channel =
      grpc::CreateChannel(started->address, grpc::InsecureChannelCredentials());
  auto call = [&](const std::string& service) {
    return CheckHealth(channel, service).code;
  };
  EXPECT_EQ(call(""), grpc::StatusCode::OK);
  EXPECT_EQ(call(""), grpc::StatusCode::OK);
  EXPECT_EQ(call("no.such.Service"), grpc::StatusCode::NOT_FOUND);
  // Methods a client makes up are one series, not one each.
  for (const char* made_up :
       {"/x.Y/Random1", "/x.Y/Random2", "/grpc.health.v1.Health/Nope"}) {
    grpc::ClientContext context;
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    const grpc::Status status =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel.get(),
            grpc::internal::RpcMethod(made_up,
                                      grpc::internal::RpcMethod::NORMAL_RPC),
            &context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << made_up;
  }
  started->server->Shutdown(std::chrono::system_clock::now() +
                            std::chrono::seconds(2));

  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string scrape = ScrapeMetrics((*endpoint)->port());
  EXPECT_NE(scrape.find("grpc_server_started_total{grpc_method=\"Check\","
                        "grpc_service=\"grpc.health.v1.Health\"} 3"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("grpc_server_handled_total{grpc_code=\"OK\","
                        "grpc_method=\"Check\",grpc_service=\"grpc.health.v1."
                        "Health\"} 2"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("grpc_server_handled_total{grpc_code=\"NOT_FOUND\","
                        "grpc_method=\"Check\",grpc_service=\"grpc.health.v1."
                        "Health\"} 1"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("grpc_server_handling_seconds_count{grpc_code=\"OK\","
                        "grpc_method=\"Check\",grpc_service=\"grpc.health.v1."
                        "Health\"} 2"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("grpc_server_handled_total{grpc_code=\"UNIMPLEMENTED\","
                        "grpc_method=\"unknown\",grpc_service=\"unknown\"} 3"),
            std::string::npos)
      << scrape;
  EXPECT_EQ(scrape.find("Random"), std::string::npos) << scrape;
  EXPECT_EQ(scrape.find("Nope"), std::string::npos) << scrape;
}

TEST(LogTest, TextLinesCarryTimeLevelAndProgram) {
  const absl::Time time = absl::FromUnixMicros(1795488000123456);
  EXPECT_EQ(FormatLogLine(LogFormat::kText, time, LogLevel::kWarning,
                          "predictor", "two\nlines"),
            "2026-11-24T02:40:00.123456Z WARNING predictor: two\\nlines");
}

TEST(LogTest, JsonLinesAreOneEscapedObject) {
  const absl::Time time = absl::FromUnixMicros(1795488000000001);
  EXPECT_EQ(
      FormatLogLine(LogFormat::kJson, time, LogLevel::kError, "job",
                    "say \"hi\"\\\n\x01"),
      "{\"time\":\"2026-11-24T02:40:00.000001Z\",\"level\":\"error\","
      "\"program\":\"job\",\"message\":\"say \\\"hi\\\"\\\\\\n\\u0001\"}");
}

}  // namespace
}  // namespace deltastream
