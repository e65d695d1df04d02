// The predictor: keeps a replica of a trainer's model (its embedding tables
// and dense parameters, clients/replica.h) in step with the trainer's tracker
// and serves lookups from it (proto/predictor.proto, service ReplicaLookup).
//
//   predictor --target=HOST:PORT [--consumer=predictor] [--listen=HOST:PORT]
//       [--replica_db=DIR] [--bootstrap_chain=DIR] [--every_ms=100]
//       [--every_steps=0] [--dense_every_steps=0] [--dense_every_ms=0]
//       [--apply_log=FILE] [--token_file=F] [--tls_ca=F]
//       [--auth_token_file=F] [--tls_cert=F --tls_key=F]
//       [--metrics_listen=HOST:PORT]
//       [--log_format=text|json] [--log_level=info]
//
// The lookup API also serves gRPC health (grpc.health.v1.Health: NOT_SERVING
// until the replica is ready, SERVING after, NOT_SERVING again while it
// stops) and reflection; with --tls_cert/--tls_key it serves TLS, and with
// --auth_token_file (the tracker's token file, base/auth.h) every lookup
// API call needs a valid bearer token (health and reflection do not).
// --token_file and --tls_ca are the predictor's side as the tracker's client.
// --metrics_listen serves Prometheus metrics (clients/predictor_metrics.h,
// RPC counts and latencies of the lookup API; docs/operations.md).
//
// Prints "listening on HOST:PORT" as its first stdout line once the lookup
// API is up (port 0 picks a free one); everything else goes to stderr.
//
// How it follows the trainer (bootstrap, staging for dense parameters,
// acknowledged commits, resyncs, backoff): clients/predictor.h; the lookup
// API: clients/replica_lookup_service.h. This file holds the flags and main.
//
// SIGTERM/SIGINT: cancels the subscription or read, stops serving, exits 0
// (a second signal: at once, 128 + the signal). Exit codes: 0 stopped by a
// signal; an error retrying cannot fix gives StartFailureExitCode's code
// (base/process.h), as at start: 2 for what a restart would meet again (the
// tracker serves no live rows, a refused token or consumer name, a damaged
// replica database), 1 for a full or failing disk; 2 bad flags (one line: an
// unknown flag, a value that does not parse or is out of range, a --listen
// address that is malformed or in use, a --target that is not HOST:PORT).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/auth.h"
#include "base/command_line.h"
#include "base/grpc_server.h"
#include "base/host_memory.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/process.h"
#include "base/rpc_metrics.h"
#include "clients/delta_client.h"
#include "clients/fan_in_client.h"
#include "clients/predictor.h"
#include "clients/predictor_metrics.h"
#include "clients/replica.h"
#include "clients/replica_lookup_service.h"

ABSL_FLAG(std::string, target, "", "the trainer's tracker, HOST:PORT");
ABSL_FLAG(std::string, consumer, "predictor", "the predictor's consumer name");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "the lookup API's address, HOST:PORT (port 0: a free one)");
ABSL_FLAG(std::string, replica_db, "",
          "RocksDB directory of the replica (empty: in memory)");
ABSL_FLAG(std::string, bootstrap_chain, "",
          "checkpoint chain directory to bootstrap an empty replica from "
          "(instead of a full read) when it is recent enough; rows the chain "
          "never recorded are missing until they change");
ABSL_FLAG(int64_t, every_ms, 100, "publish interval (0: by steps only)");
ABSL_FLAG(int64_t, every_steps, 0,
          "publish every N batches as well (0: by time only; both 0: every "
          "batch)");
ABSL_FLAG(int64_t, dense_every_steps, 0,
          "dense parameters at most every N batches (both dense_every_* 0: "
          "with every push)");
ABSL_FLAG(int64_t, dense_every_ms, 0, "dense parameters at most every N ms");
ABSL_FLAG(std::string, apply_log, "",
          "append one line per applied version: <from_batch> <to_batch> "
          "<rows> <dense 0|1> <all_rows 0|1> <run_id>");
ABSL_FLAG(std::string, token_file, "", "bearer token (first line)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots: connect with TLS");
ABSL_FLAG(std::string, auth_token_file, "",
          "bearer tokens with roles, as the tracker's (see base/auth.h): "
          "every lookup API call needs a valid one; empty: no "
          "authentication");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve the lookup API with TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace deltastream {
namespace {

void Log(const std::string& line) { LogInfo(line); }

int Main() {
  if (absl::Status logging = InitLogging("predictor"); !logging.ok()) {
    return Fail(kExitUsage, logging.message());
  }
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = std::make_shared<PredictorMetrics>(*registry);
  RpcMetrics rpc_metrics(*registry);
  PredictorOptions options;
  options.on_freshness = [&metrics](double seconds) {
    metrics->ObserveFreshness(seconds);
  };
  options.target = absl::GetFlag(FLAGS_target);
  options.consumer = absl::GetFlag(FLAGS_consumer);
  options.bootstrap_chain = absl::GetFlag(FLAGS_bootstrap_chain);
  options.every_ms = absl::GetFlag(FLAGS_every_ms);
  options.every_steps = absl::GetFlag(FLAGS_every_steps);
  options.dense_every_steps = absl::GetFlag(FLAGS_dense_every_steps);
  options.dense_every_ms = absl::GetFlag(FLAGS_dense_every_ms);
  if (absl::Status valid = ValidatePredictorOptions(options); !valid.ok()) {
    return Fail(kExitUsage, valid.message());
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (absl::Status valid = ValidateListenAddress(listen); !valid.ok()) {
    return Fail(kExitUsage, valid);
  }
  ClientOptions client_options;
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), client_options);
      !read.ok()) {
    return FailStart(read);
  }
  std::unique_ptr<TokenAuthorizer> auth;
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file);
      !path.empty()) {
    // No consumer of the predictor's: consumer names are not checked further.
    absl::StatusOr<TokenAuthorizer> parsed =
        TokenAuthorizer::FromFile(path, nullptr);
    if (!parsed.ok()) {
      return FailStart(parsed.status());
    }
    auth = std::make_unique<TokenAuthorizer>(*std::move(parsed));
  }
  FILE* apply_log = nullptr;
  if (const std::string path = absl::GetFlag(FLAGS_apply_log); !path.empty()) {
    apply_log = std::fopen(path.c_str(), "a");
    if (apply_log == nullptr) {
      const int error = errno;  // before the message's allocations
      const absl::Status status = absl::ErrnoToStatus(
          error, absl::StrCat("cannot append to --apply_log '", path, "'"));
      return FailStart(status);
    }
  }

  // Received deltas reuse freed memory instead of faulting in fresh pages
  // (fan_in_bench: 59% -> 92% of a single-rank read without it).
  KeepHostMemoryForReuse();
  // Signals are taken by a thread of their own: blocked before any other
  // thread starts (gRPC's and RocksDB's inherit the mask).
  const sigset_t signals = BlockTerminationSignals();
  // gRPC's credentials start gRPC's threads: after the signals are blocked.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFromFiles(absl::GetFlag(FLAGS_tls_cert),
                                 absl::GetFlag(FLAGS_tls_key));
  if (!credentials.ok()) {
    return FailStart(credentials.status());
  }

  ReplicaOptions replica_options;
  replica_options.db_path = absl::GetFlag(FLAGS_replica_db);
  absl::StatusOr<std::unique_ptr<Replica>> replica =
      Replica::Open(replica_options);
  if (!replica.ok()) {
    // A damaged replica database is refused (2): a restart would be too.
    return FailStart(replica.status());
  }
  if ((*replica)->Version() >= 0) {
    Log(absl::StrFormat("replica in %s resumes at version %d of run %s",
                        (*replica)->where(), (*replica)->Version(),
                        (*replica)->RunId()));
  }
  Predictor predictor(options,
                      FanInClient::Connect(options.target, client_options),
                      *std::move(replica), apply_log);

  metrics->AttachTo(&predictor);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics_endpoint =
      StartMetricsFromFlags(registry);
  if (!metrics_endpoint.ok()) {
    return Fail(kExitUsage, metrics_endpoint.status().message());
  }
  if (*metrics_endpoint != nullptr) {
    (*metrics_endpoint)->Add(metrics);
    Log(absl::StrCat("metrics on http://", (*metrics_endpoint)->address(),
                     "/metrics"));
  }

  ReplicaLookupService service(&predictor, auth.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(rpc_metrics.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  absl::StatusOr<StartedServer> started =
      StartServer(builder, listen, *credentials);
  if (!started.ok()) return Fail(kExitUsage, started.status());
  std::unique_ptr<grpc::Server> server = std::move(started->server);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(false);
  std::printf("listening on %s\n", started->address.c_str());
  std::fflush(stdout);

  // Health follows readiness: SERVING once the replica is ready, and
  // NOT_SERVING from the moment a stop is asked for (before lookups end, so
  // that health-checking balancers move away first).
  absl::Notification stopped;
  absl::Mutex health_mu;
  bool stopping = false;  // guarded by health_mu
  std::thread health_watch([&] {
    bool serving = false;
    while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      const bool ready = predictor.Status().ready();
      absl::MutexLock lock(&health_mu);
      if (!stopping && ready != serving) {
        health->SetServingStatus(ready);
        serving = ready;
      }
    }
    health->SetServingStatus(false);
  });

  TerminationWatch watch(
      signals,
      [&](int signal) {
        Log(absl::StrCat("signal ", signal, ": stopping"));
        {
          absl::MutexLock lock(&health_mu);
          stopping = true;
          health->SetServingStatus(false);
        }
        predictor.Stop();
      },
      [](int signal) {
        Log(absl::StrCat("signal ", signal, " again: exiting now"));
      });
  std::thread poller([&predictor] { predictor.PollTrainer(); });
  const absl::Status run = predictor.Run();
  predictor.Stop();
  stopped.Notify();
  health_watch.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  poller.join();
  if (apply_log != nullptr) std::fclose(apply_log);
  // Run's errors are those retrying cannot fix: 2 for what a restart would
  // meet again (a tracker without live rows, a refused token or consumer
  // name), 1 for the replica's storage (a full or failing disk).
  if (!run.ok()) return FailStart(run);
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "predictor --target=HOST:PORT [--replica_db=DIR]; see --helpfull");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  return deltastream::Main();
}
