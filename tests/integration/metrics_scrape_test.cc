// The predictor's and the checkpoint job's Prometheus metrics, scraped over
// HTTP as Prometheus scrapes them, while they follow a real trainer on
// loopback; the predictor's gRPC health (NOT_SERVING until ready) and
// reflection; --metrics_listen and --log_format refused with one line.
#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "proto/predictor.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "tests/base/grpc_health.h"
#include "tests/base/http_scrape.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

// The port of "metrics on http://HOST:PORT/metrics" in a log file, waiting
// for the line up to 30 s; 0 when it never comes.
int MetricsPort(const std::string& log_path) {
  const std::regex line("metrics on http://[^ ]*:([0-9]+)/metrics");
  for (int i = 0; i < 300; ++i) {
    std::smatch match;
    const std::string text = ReadText(log_path);
    if (std::regex_search(text, match, line)) return std::stoi(match[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

// Scrapes until `condition` holds on the scrape (up to 60 s); returns the
// last scrape either way (a failure names it).
std::string ScrapeUntil(
    int port, const std::function<bool(const std::string&)>& condition) {
  std::string scrape;
  for (int i = 0; i < 600; ++i) {
    scrape = ScrapeMetrics(port);
    if (condition(scrape)) return scrape;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "timed out; last scrape:\n" << scrape;
  return scrape;
}

double Value(const std::string& scrape, const std::string& series) {
  return SampleValue(scrape, series).value_or(-1);
}

class MetricsScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = TestTempDir() + "/metrics_scrape_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    // A small model: two tables of 1000 x 8.
    std::ofstream(work_ + "/trainer.textproto")
        << "model { tables { name: \"t0\" num_embeddings: 1000 embedding_dim: "
           "8 } tables { name: \"t1\" num_embeddings: 1000 embedding_dim: 8 } "
           "dense_arch: 8 }\n"
           "data { batch_size: 64 }\n"
           "tracker { consumers: \"predictor\" consumers: \"checkpoint\" "
           "acknowledged_reads: true }\n"
           "log_every_steps: 0\n";
  }

  std::vector<std::string> TrainerFlags() const {
    return {"--config=" + work_ + "/trainer.textproto", "--steps=-1"};
  }

  std::string work_;
};

TEST_F(MetricsScrapeTest, PredictorServesMetricsHealthAndReflection) {
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string log = work_ + "/predictor.log";
  ServerProcess predictor({"--target=" + trainer.target(),
                           "--metrics_listen=127.0.0.1:0", "--log_format=json"},
                          "clients/predictor", log);
  ASSERT_GT(predictor.port(), 0);
  const int metrics_port = MetricsPort(log);
  ASSERT_GT(metrics_port, 0) << ReadText(log);

  // Health: SERVING once bootstrapped (it may already be).
  auto channel = grpc::CreateChannel(predictor.target(),
                                     grpc::InsecureChannelCredentials());
  HealthAnswer health;
  for (int i = 0; i < 600 && health.serving_status != 1; ++i) {
    health = CheckHealth(channel);
    ASSERT_EQ(health.code, grpc::StatusCode::OK);
    ASSERT_TRUE(health.serving_status == 1 || health.serving_status == 2)
        << health.serving_status;
    if (health.serving_status != 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_EQ(health.serving_status, 1);

  // A lookup and a refused one, counted by method and code.
  auto stub = v1::ReplicaLookup::NewStub(channel);
  for (const std::string fqn : {"t0", "no_such_table"}) {
    v1::LookupRequest request;
    v1::LookupResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::PredictorStatus status;
    {
      grpc::ClientContext status_context;
      status_context.set_deadline(context.deadline());
      ASSERT_TRUE(
          stub->Status(&status_context, v1::PredictorStatusRequest(), &status)
              .ok());
    }
    ASSERT_GT(status.tables_size(), 0);
    request.set_fqn(fqn == "t0" ? status.tables(0).fqn() : fqn);
    ASSERT_TRUE(EncodeTensor(at::tensor(std::vector<int64_t>{0, 1},
                                        at::TensorOptions(at::kLong)),
                             request.mutable_ids())
                    .ok());
    stub->Lookup(&context, request, &response);
  }

  const std::string scrape =
      ScrapeUntil(metrics_port, [](const std::string& s) {
        return Value(s, "deltastream_predictor_freshness_seconds_count") >= 3;
      });
  EXPECT_EQ(Value(scrape, "deltastream_predictor_ready"), 1);
  EXPECT_GE(Value(scrape, "deltastream_predictor_applies_total"), 3);
  EXPECT_GT(Value(scrape, "deltastream_predictor_rows_applied_total"), 0);
  EXPECT_GT(Value(scrape, "deltastream_predictor_received_bytes_total"), 0);
  EXPECT_EQ(Value(scrape, "deltastream_predictor_resyncs_total"), 0);
  EXPECT_GE(Value(scrape, "deltastream_predictor_lag_steps"), 0);
  EXPECT_NE(scrape.find("# TYPE deltastream_predictor_freshness_seconds "
                        "histogram"),
            std::string::npos);
  EXPECT_GE(
      Value(scrape,
            "deltastream_predictor_freshness_seconds_bucket{le=\"+Inf\"}"),
      3);
  EXPECT_NE(scrape.find("deltastream_predictor_table_rows{table="),
            std::string::npos);
  EXPECT_EQ(Value(scrape,
                  "grpc_server_handled_total{grpc_code=\"OK\",grpc_method="
                  "\"Lookup\",grpc_service=\"deltastream.v1.ReplicaLookup\"}"),
            1)
      << scrape;
  EXPECT_EQ(Value(scrape,
                  "grpc_server_handled_total{grpc_code=\"NOT_FOUND\","
                  "grpc_method=\"Lookup\",grpc_service="
                  "\"deltastream.v1.ReplicaLookup\"}"),
            1)
      << scrape;
  EXPECT_GE(Value(scrape,
                  "grpc_server_handling_seconds_count{grpc_code=\"OK\","
                  "grpc_method=\"Status\",grpc_service=\"deltastream.v1."
                  "ReplicaLookup\"}"),
            2);

  // Reflection lists the lookup API (as grpcurl asks it): the service is
  // registered and answers.
  {
    grpc::GenericStub generic(channel);
    // ServerReflectionRequest{list_services: ""} is field 7.
    const std::string request("\x3a\x00", 2);
    grpc::Slice slice(request);
    grpc::ByteBuffer in(&slice, 1), out;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::CompletionQueue queue;
    call = generic.PrepareCall(
        &context,
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        &queue);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(queue.Next(&tag, &ok) && ok);
    call->Write(in, reinterpret_cast<void*>(2));
    ASSERT_TRUE(queue.Next(&tag, &ok) && ok);
    call->Read(&out, reinterpret_cast<void*>(3));
    ASSERT_TRUE(queue.Next(&tag, &ok) && ok);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(out.Dump(&slices).ok());
    std::string answer;
    for (const grpc::Slice& s : slices) {
      answer.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    EXPECT_NE(answer.find("deltastream.v1.ReplicaLookup"), std::string::npos);
    EXPECT_NE(answer.find("grpc.health.v1.Health"), std::string::npos);
    context.TryCancel();
    grpc::Status finished;
    call->Finish(&finished, reinterpret_cast<void*>(4));
    while (queue.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
    }
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
  }

  // The logs are JSON lines with time, level and program.
  const std::string text = ReadText(log);
  EXPECT_NE(text.find("\"level\":\"info\",\"program\":\"predictor\""),
            std::string::npos)
      << text;
  const int stopped = predictor.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(stopped) && WEXITSTATUS(stopped) == 0) << stopped;
}

TEST_F(MetricsScrapeTest, CheckpointJobServesMetrics) {
  ServerProcess trainer(TrainerFlags(), "trainer/trainer");
  ASSERT_GT(trainer.port(), 0);
  const std::string log = work_ + "/job";
  Background job(RunfilePath("clients/checkpoint_job") +
                     " --target=" + trainer.target() + " --dir=" + work_ +
                     "/chain --every_ms=100 --metrics_listen=127.0.0.1:0",
                 log);
  const int metrics_port = MetricsPort(log + ".err");
  ASSERT_GT(metrics_port, 0) << ReadText(log + ".err");
  const std::string scrape =
      ScrapeUntil(metrics_port, [](const std::string& s) {
        return Value(s,
                     "deltastream_checkpoint_links_written_total{kind="
                     "\"increment\"}") >= 2;
      });
  EXPECT_EQ(Value(scrape,
                  "deltastream_checkpoint_links_written_total{kind=\"full\"}"),
            1);
  EXPECT_GT(Value(scrape, "deltastream_checkpoint_written_bytes_total"), 0);
  EXPECT_GT(Value(scrape, "deltastream_checkpoint_written_rows_total"), 0);
  EXPECT_GT(Value(scrape, "deltastream_checkpoint_chain_end_batch"), 0);
  EXPECT_EQ(Value(scrape, "deltastream_checkpoint_resyncs_total"), 0);
  EXPECT_GE(Value(scrape, "deltastream_checkpoint_last_link_age_seconds"), 0);
  EXPECT_GT(Value(scrape, "deltastream_checkpoint_last_link_duration_seconds"),
            0);
  EXPECT_GT(Value(scrape, "deltastream_checkpoint_last_link_timestamp_seconds"),
            0);
  // Text logs: a timestamp, the level, the program.
  EXPECT_TRUE(std::regex_search(
      ReadText(log + ".err"),
      std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z INFO checkpoint_job: ")))
      << ReadText(log + ".err");
}

// A checkpoint job commits only where reads are acknowledged: elsewhere the
// server refused every commit, one FAILED_PRECONDITION a link on its RPC
// metrics, which an error-ratio alert took for a fault.
TEST_F(MetricsScrapeTest, CheckpointJobCommitsOnlyAcknowledgedReads) {
  for (const bool acknowledged : {false, true}) {
    SCOPED_TRACE(acknowledged ? "acknowledged" : "not acknowledged");
    const std::string config = work_ + "/plain.textproto";
    std::ofstream(config) << "tracker { consumers: \"checkpoint\" "
                          << (acknowledged ? "acknowledged_reads: true " : "")
                          << "}\nlog_every_steps: 0\n";
    const std::string log = work_ + "/plain_trainer.log";
    ServerProcess trainer(
        {"--config=" + config, "--steps=-1", "--metrics_listen=127.0.0.1:0"},
        "trainer/trainer", log);
    ASSERT_GT(trainer.port(), 0);
    const int metrics_port = MetricsPort(log);
    ASSERT_GT(metrics_port, 0) << ReadText(log);
    const CommandResult job = RunCommand(
        RunfilePath("clients/checkpoint_job") +
        " --target=" + trainer.target() + " --dir=" + work_ + "/plain_chain_" +
        (acknowledged ? "ack" : "final") + " --every_ms=100 --count=3");
    ASSERT_EQ(job.exit_code, 0) << job.err;
    const std::string scrape = ScrapeMetrics(metrics_port);
    EXPECT_EQ(scrape.find("grpc_code=\"FAILED_PRECONDITION\",grpc_method="
                          "\"Commit\""),
              std::string::npos)
        << scrape;
    EXPECT_EQ(Value(scrape,
                    "grpc_server_handled_total{grpc_code=\"OK\","
                    "grpc_method=\"Commit\",grpc_service="
                    "\"deltastream.v1.DeltaTracker\"}") >= 3,
              acknowledged)
        << scrape;
  }
}

// The trainer serves its steps, its tracker and its service's RPCs.
TEST_F(MetricsScrapeTest, TrainerServesStepTrackerAndRpcMetrics) {
  const std::string log = work_ + "/trainer.log";
  std::vector<std::string> flags = TrainerFlags();
  flags.push_back("--metrics_listen=127.0.0.1:0");
  ServerProcess trainer(flags, "trainer/trainer", log);
  ASSERT_GT(trainer.port(), 0);
  const int metrics_port = MetricsPort(log);
  ASSERT_GT(metrics_port, 0) << ReadText(log);
  // One read through the service, so that an RPC is counted.
  const CommandResult read =
      RunCommand(RunfilePath("clients/deltactl") +
                 " --target=" + trainer.target() + " status --json");
  ASSERT_EQ(read.exit_code, 0) << read.err;
  const std::string scrape =
      ScrapeUntil(metrics_port, [](const std::string& s) {
        return Value(s, "deltastream_trainer_steps_total") >= 5 &&
               s.find("grpc_method=\"Status\"") != std::string::npos;
      });
  EXPECT_GT(Value(scrape, "deltastream_trainer_examples_total"), 0);
  EXPECT_GT(Value(scrape, "deltastream_trainer_step_seconds_count"), 0);
  EXPECT_GT(Value(scrape, "deltastream_tracker_current_batch"), 0);
  EXPECT_NE(scrape.find("deltastream_tracker_consumer_lag_steps{consumer="
                        "\"predictor\"}"),
            std::string::npos)
      << scrape;
}

// The standalone server serves its tracker and RPC metrics, with levelled
// logs.
TEST_F(MetricsScrapeTest, TrackerServerServesTrackerAndRpcMetrics) {
  const std::string log = work_ + "/server.log";
  ServerProcess server({"--consumers=c", "--metrics_listen=127.0.0.1:0"},
                       "tracker_service/tracker_server", log);
  ASSERT_GT(server.port(), 0);
  const int metrics_port = MetricsPort(log);
  ASSERT_GT(metrics_port, 0) << ReadText(log);
  const std::string deltactl =
      RunfilePath("clients/deltactl") + " --target=" + server.target();
  const CommandResult pushed =
      RunCommand("echo '{\"tables\": {\"t\": {\"ids\": [3, 1]}}}' | " +
                 deltactl + " push --json_file=-");
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  ASSERT_EQ(RunCommand(deltactl + " step").exit_code, 0);
  const std::string scrape =
      ScrapeUntil(metrics_port, [](const std::string& s) {
        return Value(s, "deltastream_tracker_current_batch") >= 1;
      });
  EXPECT_EQ(Value(scrape,
                  "deltastream_tracker_consumer_lag_steps{consumer="
                  "\"c\"}"),
            1);
  EXPECT_NE(scrape.find("grpc_server_handled_total"), std::string::npos)
      << scrape;
  EXPECT_TRUE(std::regex_search(
      ReadText(log),
      std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z INFO tracker_server: "
                 "metrics on")))
      << ReadText(log);
}

// The Subscribe calls `scrape` counts as handled (ended), whatever their code.
double SubscribesHandled(const std::string& scrape) {
  double handled = 0;
  std::istringstream lines(scrape);
  std::string line;
  while (std::getline(lines, line)) {
    if (absl::StartsWith(line, "grpc_server_handled_total{") &&
        line.find("grpc_method=\"Subscribe\"") != std::string::npos) {
      handled += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
    }
  }
  return handled;
}

// A subscriber that stops answering without closing its connection (its
// host died, its link was cut; here SIGSTOP, so its kernel still acknowledges
// every TCP segment and no FIN ever comes) is found by the server's keepalive
// pings: its Subscribe call ends, counted as handled, instead of holding a
// server thread until the server stops.
TEST_F(MetricsScrapeTest, TrackerServerDropsASubscriberThatStoppedAnswering) {
  const std::string log = work_ + "/server.log";
  ServerProcess server(
      {"--consumers=s", "--metrics_listen=127.0.0.1:0", "--keepalive_ms=1000"},
      "tracker_service/tracker_server", log);
  ASSERT_GT(server.port(), 0);
  const int metrics_port = MetricsPort(log);
  ASSERT_GT(metrics_port, 0) << ReadText(log);
  Background subscriber(RunfilePath("clients/deltactl") + " --target=" +
                            server.target() + " subscribe --json --consumer=s",
                        work_ + "/subscriber");
  ScrapeUntil(metrics_port, [](const std::string& s) {
    return Value(s,
                 "grpc_server_started_total{grpc_method=\"Subscribe\","
                 "grpc_service=\"deltastream.v1.DeltaTracker\"}") == 1;
  });
  // Still open after several pings, answered.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  ASSERT_EQ(SubscribesHandled(ScrapeMetrics(metrics_port)), 0)
      << subscriber.err();

  subscriber.Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ScrapeUntil(metrics_port,
              [](const std::string& s) { return SubscribesHandled(s) == 1; });
  EXPECT_LT(std::chrono::steady_clock::now() - stopped,
            std::chrono::seconds(15));
  subscriber.Signal(SIGCONT);
  subscriber.Stop(SIGKILL);
}

// The lookup API with --tls_cert/--tls_key and --auth_token_file: health
// over TLS without a token (NOT_SERVING: the trainer it follows is
// unreachable, so it never bootstraps); a call of the lookup API needs the
// token; a plaintext client is refused.
TEST(PredictorTlsTest, ServesHealthOverTlsOnly) {
  const std::string cert = TestTempDir() + "/metrics_scrape.cert.pem";
  const std::string key = TestTempDir() + "/metrics_scrape.key.pem";
  const CommandResult made = RunCommand(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string tokens = TestTempDir() + "/metrics_scrape.tokens";
  std::ofstream(tokens) << "lookup-token-0123456789 consumer *\n";
  ServerProcess predictor({"--target=127.0.0.1:1", "--tls_cert=" + cert,
                           "--tls_key=" + key, "--auth_token_file=" + tokens},
                          "clients/predictor");
  ASSERT_GT(predictor.port(), 0);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadText(cert);
  auto channel =
      grpc::CreateChannel(predictor.target(), grpc::SslCredentials(ssl));
  const HealthAnswer tls = CheckHealth(channel);
  EXPECT_EQ(tls.code, grpc::StatusCode::OK);
  EXPECT_EQ(tls.serving_status, 2);  // NOT_SERVING
  auto stub = v1::ReplicaLookup::NewStub(channel);
  for (const std::string token : {"", "lookup-token-0123456789"}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    v1::PredictorStatus status;
    EXPECT_EQ(stub->Status(&context, v1::PredictorStatusRequest(), &status)
                  .error_code(),
              token.empty() ? grpc::StatusCode::UNAUTHENTICATED
                            : grpc::StatusCode::OK)
        << token;
  }
  const HealthAnswer plain = CheckHealth(grpc::CreateChannel(
      predictor.target(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.code, grpc::StatusCode::UNAVAILABLE);
}

TEST(MetricsFlagsTest, AnAddressInUseOrABadFormatExitsTwoWithOneLine) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const std::string in_use =
      "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  for (const std::string binary :
       {"clients/predictor", "clients/checkpoint_job"}) {
    const std::string command =
        RunfilePath(binary) + " --target=127.0.0.1:1" +
        (binary == "clients/checkpoint_job"
             ? " --dir=" + TestTempDir() + "/unused_chain"
             : "");
    for (const std::string& flags :
         {"--metrics_listen=" + in_use, std::string("--metrics_listen=nohost"),
          std::string("--log_format=xml")}) {
      const CommandResult result = RunCommand(command + " " + flags);
      EXPECT_EQ(result.exit_code, 2)
          << binary << " " << flags << ": " << result.err;
      EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
          << binary << " " << flags << ": " << result.err;
    }
  }
  // The trainer takes the log flags for its libraries' lines: a bad value
  // is refused as anywhere else (it was accepted and did nothing).
  for (const std::string flags :
       {"--log_format=xml", "--log_level=bogus", "--metrics_listen=nohost"}) {
    const CommandResult result =
        RunCommand(RunfilePath("trainer/trainer") + " --steps=1 " + flags);
    EXPECT_EQ(result.exit_code, 2) << "trainer " << flags << ": " << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << "trainer " << flags << ": " << result.err;
  }
  // TLS flags of the predictor: both or neither, readable; a token file
  // that is readable and well formed.
  const std::string bad_tokens = TestTempDir() + "/metrics_scrape.bad_tokens";
  std::ofstream(bad_tokens) << "short admin\n";
  for (const std::string& flags :
       {std::string("--tls_cert=/nonexistent.pem --tls_key=/nonexistent.pem"),
        std::string("--tls_cert=/nonexistent.pem"),
        std::string("--auth_token_file=/nonexistent"),
        "--auth_token_file=" + bad_tokens}) {
    const CommandResult result = RunCommand(RunfilePath("clients/predictor") +
                                            " --target=127.0.0.1:1 " + flags);
    EXPECT_EQ(result.exit_code, 2) << flags << ": " << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << flags << ": " << result.err;
  }
  close(fd);
}

}  // namespace
}  // namespace deltastream
