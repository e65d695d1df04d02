// Tokens with roles and TLS against the real tracker_server, through deltactl
// and the client library. The certificates are made here with openssl.

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "clients/delta_client.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kProducer[] = "producer-token-0123456789";
constexpr char kReaderA[] = "reader-a-token-0123456789";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TestTempDir() + "/security." + name;
  std::ofstream(path) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TokenFile() {
  return WriteFile(
      "tokens", absl::StrCat("# role grants\n", kAdmin, " admin\n", kProducer,
                             " producer\n", kReaderA, "\tconsumer a\n"));
}

// A self-signed certificate for 127.0.0.1 and localhost: {cert, key} paths.
std::pair<std::string, std::string> SelfSignedCertificate(
    const std::string& name) {
  const std::string cert = TestTempDir() + "/security." + name + ".cert.pem";
  const std::string key = TestTempDir() + "/security." + name + ".key.pem";
  CommandResult made = RunCommand(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert);
  EXPECT_EQ(made.exit_code, 0) << made.err;
  return {cert, key};
}

class Deltactl {
 public:
  Deltactl(const ServerProcess& server, std::string connection)
      : prefix_(RunfilePath("clients/deltactl") +
                " --timeout_ms=5000 --target=" + server.target() + " " +
                connection + " ") {}
  CommandResult operator()(const std::string& args) const {
    return RunCommand(prefix_ + args);
  }

 private:
  std::string prefix_;
};

void ExpectDenied(const CommandResult& result, const std::string& message) {
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err;
}

TEST(SecurityTest, TokensGrantTheirRolesOnly) {
  ServerProcess server({"--consumers=a,b", "--auth_token_file=" + TokenFile()});
  ASSERT_GT(server.port(), 0);
  const std::string push =
      "push --json_file=" +
      WriteFile("push.json", R"({"tables": {"t": {"ids": [1, 2]}}})");
  auto as = [&](const char* token) {
    return Deltactl(
        server, token == nullptr
                    ? std::string()
                    : "--token_file=" + WriteFile(std::string("tok.") + token,
                                                  std::string(token) + "\n"));
  };
  // No token, or an unknown one: UNAUTHENTICATED for everything.
  ExpectDenied(as(nullptr)("status"), "missing token");
  ExpectDenied(as("not-a-real-token-at-all")("status"), "unknown token");

  const Deltactl producer = as(kProducer);
  EXPECT_EQ(producer(push).exit_code, 0);
  EXPECT_EQ(producer("step").exit_code, 0);
  EXPECT_EQ(producer("status").exit_code, 0);  // any valid token inspects
  ExpectDenied(producer("get --consumer=a"), "may not read");
  ExpectDenied(producer("consumers add x"), "may not administer");

  const Deltactl reader = as(kReaderA);
  CommandResult got = reader("get --json --consumer=a");
  EXPECT_EQ(got.exit_code, 0) << got.err;
  EXPECT_NE(got.out.find("[1,2]"), std::string::npos) << got.out;
  ExpectDenied(reader("get --consumer=b"), "may not read as 'b'");
  ExpectDenied(reader(push), "may not record");
  ExpectDenied(reader("step"), "may not record");
  ExpectDenied(reader("clear"), "may not administer");
  ExpectDenied(reader("snapshot"), "may not administer");

  const Deltactl admin = as(kAdmin);
  EXPECT_EQ(admin("consumers add x").exit_code, 0);
  EXPECT_EQ(admin("get --consumer=b").exit_code, 0);
  EXPECT_EQ(admin("clear").exit_code, 0);

  // The client library sends its token too.
  ClientOptions options;
  options.auth_token = kReaderA;
  auto client = DeltaClient::Create(server.target(), options);
  v1::GetDeltaRequest request;
  request.set_consumer("a");
  EXPECT_TRUE(client->GetDelta(request).ok());
  request.set_consumer("b");
  EXPECT_EQ(client->GetDelta(request).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->Step().status().code(),
            absl::StatusCode::kPermissionDenied);
  // Touch acts as its consumer, as a read does.
  EXPECT_TRUE(client->Touch("a").ok());
  EXPECT_EQ(client->Touch("b").code(), absl::StatusCode::kPermissionDenied);
}

TEST(SecurityTest, MalformedTokenFileIsRefused) {
  CommandResult result =
      RunCommand(RunfilePath("tracker_service/tracker_server") +
                 " --listen=127.0.0.1:0 --auth_token_file=" +
                 WriteFile("bad_tokens", "short admin\n"));
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("line 1"), std::string::npos) << result.err;
}

TEST(SecurityTest, TlsWithASelfSignedCertificate) {
  auto [cert, key] = SelfSignedCertificate("server");
  ServerProcess server({"--tls_cert=" + cert, "--tls_key=" + key,
                        "--auth_token_file=" + TokenFile()});
  ASSERT_GT(server.port(), 0);
  const std::string token = "--token_file=" + WriteFile("tls.token", kAdmin);
  CommandResult ok =
      Deltactl(server, "--tls_ca=" + cert + " " + token)("status --json");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  // Plaintext to a TLS server fails, as does a client that trusts another
  // certificate.
  ExpectDenied(Deltactl(server, token)("status"), "cannot reach");
  auto other = SelfSignedCertificate("other");
  ExpectDenied(
      Deltactl(server, "--tls_ca=" + other.first + " " + token)("status"),
      "cannot reach");

  ClientOptions options;
  options.tls_root_certs_pem = ReadFile(cert);
  options.auth_token = kProducer;
  auto client = DeltaClient::Create(server.target(), options);
  ASSERT_TRUE(client->Record({{{"t", at::arange(3), {}}}}).ok());
  EXPECT_EQ(*client->Step(), 1);
}

// TLS files that gRPC would refuse only while starting (with lines of its
// own, and a failure that read like an address in use) are refused first,
// in one line that names them: exit 2.
TEST(SecurityTest, MismatchedOrMalformedTlsFilesAreNamed) {
  auto [cert, key] = SelfSignedCertificate("pair");
  auto other = SelfSignedCertificate("stranger");
  const std::string garbage = WriteFile("garbage.pem", "not a PEM file\n");
  const std::string server =
      RunfilePath("tracker_service/tracker_server") + " --listen=127.0.0.1:0 ";
  const struct {
    std::string flags;
    std::string says;
  } kRefusals[] = {
      {"--tls_cert=" + cert + " --tls_key=" + other.second,
       "is not the key of the certificate"},
      {"--tls_cert=" + cert + " --tls_key=" + garbage, "holds no PEM private"},
      {"--tls_cert=" + garbage + " --tls_key=" + key, "holds no PEM cert"},
  };
  for (const auto& refusal : kRefusals) {
    const CommandResult result = RunCommand(server + refusal.flags);
    EXPECT_EQ(result.exit_code, 2) << refusal.flags << ": " << result.err;
    EXPECT_NE(result.err.find(refusal.says), std::string::npos) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << result.err;
  }
}

}  // namespace
}  // namespace deltastream
