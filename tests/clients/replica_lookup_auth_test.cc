// The predictor's lookup API (clients/replica_lookup_service.h) with bearer
// tokens (base/auth.h), served over real gRPC on loopback, in plaintext and
// over TLS with a certificate made here by openssl: a call without a valid
// token is refused (UNAUTHENTICATED), with one it is served; the health
// service answers probes that carry no token.
#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "base/auth.h"
#include "base/file_io.h"
#include "base/grpc_server.h"
#include "clients/delta_client.h"
#include "clients/predictor.h"
#include "clients/replica.h"
#include "clients/replica_lookup_service.h"
#include "proto/predictor.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "tests/base/grpc_health.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

constexpr char kToken[] = "lookup-token-0123456789";
constexpr char kTokens[] =
    "# the tracker's token file format\n"
    "lookup-token-0123456789 consumer *\n"
    "admin-token-0123456789 admin\n";

// A predictor whose replica holds version 3 of table "t": ids 1 and 2, rows
// [1, 1] and [2, 2]. Its tracker is never contacted (Run is not called).
std::unique_ptr<Predictor> ReadyPredictor() {
  absl::StatusOr<std::unique_ptr<Replica>> replica =
      Replica::Open(ReplicaOptions());
  EXPECT_TRUE(replica.ok()) << replica.status();
  ReceivedDelta delta;
  delta.tables["t"].ids = at::tensor({int64_t{1}, int64_t{2}});
  delta.tables["t"].values =
      at::tensor({1.0f, 1.0f, 2.0f, 2.0f}).reshape({2, 2});
  EXPECT_TRUE((*replica)->Apply({delta}, 3, "run").ok());
  PredictorOptions options;
  options.target = "127.0.0.1:1";
  return std::make_unique<Predictor>(
      options, DeltaClient::Create(options.target, ClientOptions()),
      *std::move(replica), nullptr);
}

// The lookup API of `predictor` with `auth`, on a free loopback port.
class LookupServer {
 public:
  LookupServer(const Predictor* predictor, const TokenAuthorizer* auth,
               std::shared_ptr<grpc::ServerCredentials> credentials)
      : service_(predictor, auth) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    absl::StatusOr<StartedServer> started =
        StartServer(builder, "127.0.0.1:0", std::move(credentials));
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    server_ = std::move(started->server);
    address_ = started->address;
  }
  ~LookupServer() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
  }
  const std::string& address() const { return address_; }

 private:
  ReplicaLookupService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// A lookup of ids {2, 5} in "t", sending `token` (none when empty).
grpc::Status LookUp(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& token, v1::LookupResponse* response) {
  v1::LookupRequest request;
  request.set_fqn("t");
  EXPECT_TRUE(
      EncodeTensor(at::tensor({int64_t{2}, int64_t{5}}), request.mutable_ids())
          .ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  return v1::ReplicaLookup::NewStub(channel)->Lookup(&context, request,
                                                     response);
}

grpc::Status StatusCall(const std::shared_ptr<grpc::Channel>& channel,
                        const std::string& token) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::PredictorStatus status;
  return v1::ReplicaLookup::NewStub(channel)->Status(
      &context, v1::PredictorStatusRequest(), &status);
}

void ExpectServed(const std::shared_ptr<grpc::Channel>& channel) {
  v1::LookupResponse response;
  const grpc::Status served = LookUp(channel, kToken, &response);
  ASSERT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(response.version(), 3);
  absl::StatusOr<at::Tensor> rows = DecodeTensor(response.rows());
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->size(0), 2);
  EXPECT_EQ((*rows)[0][0].item<float>(), 2.0f);
  ASSERT_EQ(response.missing_ids_size(), 1);
  EXPECT_EQ(response.missing_ids(0), 5);
}

TEST(ReplicaLookupAuthTest, RefusesCallsWithoutAValidTokenServesWithOne) {
  absl::StatusOr<TokenAuthorizer> auth =
      TokenAuthorizer::Parse(kTokens, nullptr);
  ASSERT_TRUE(auth.ok()) << auth.status();
  std::unique_ptr<Predictor> predictor = ReadyPredictor();
  LookupServer server(predictor.get(), &*auth,
                      grpc::InsecureServerCredentials());
  auto channel =
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());

  v1::LookupResponse response;
  grpc::Status refused = LookUp(channel, "", &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(refused.error_message().find("missing token"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(LookUp(channel, "not-a-real-token-at-all", &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(response.rows().data().size(), 0u);  // nothing was served
  EXPECT_EQ(StatusCall(channel, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  ExpectServed(channel);
  EXPECT_TRUE(StatusCall(channel, "admin-token-0123456789").ok());
  // Probes carry no token.
  const HealthAnswer health = CheckHealth(channel);
  EXPECT_EQ(health.code, grpc::StatusCode::OK);
}

TEST(ReplicaLookupAuthTest, TokensOverTls) {
  const std::string dir = TestTempDir() + "/replica_lookup_auth_test";
  const std::string cert = dir + "/cert.pem";
  const std::string key = dir + "/key.pem";
  const std::string make =
      "mkdir -p " + dir +
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 "
      "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost "
      "-keyout " +
      key + " -out " + cert + " 2>/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFromFiles(cert, key);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  absl::StatusOr<TokenAuthorizer> auth =
      TokenAuthorizer::Parse(kTokens, nullptr);
  ASSERT_TRUE(auth.ok()) << auth.status();
  std::unique_ptr<Predictor> predictor = ReadyPredictor();
  LookupServer server(predictor.get(), &*auth, *credentials);

  absl::StatusOr<std::string> roots = ReadSmallFile(cert);
  ASSERT_TRUE(roots.ok()) << roots.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *roots;
  auto tls = grpc::CreateChannel(server.address(), grpc::SslCredentials(ssl));
  v1::LookupResponse response;
  EXPECT_EQ(LookUp(tls, "", &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ExpectServed(tls);
  // Plaintext to a TLS server does not connect.
  auto plain =
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(LookUp(plain, kToken, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace deltastream
