// The predictor: keeps a replica of a trainer's model (its embedding tables
// and dense parameters, clients/replica.h) in step with the trainer's tracker
// and serves lookups from it (proto/predictor.proto, service ReplicaLookup).
//
//   predictor --target=HOST:PORT [--consumer=predictor] [--listen=HOST:PORT]
//       [--replica_db=DIR] [--bootstrap_chain=DIR] [--every_ms=100]
//       [--every_steps=0] [--dense_every_steps=0] [--dense_every_ms=0]
//       [--apply_log=FILE] [--token_file=F] [--tls_ca=F]
//
// Prints "listening on HOST:PORT" as its first stdout line once the lookup
// API is up (port 0 picks a free one); everything else goes to stderr.
//
// How it follows the trainer (bootstrap, staging for dense parameters,
// acknowledged commits, resyncs, backoff): clients/predictor.h; the lookup
// API: clients/replica_lookup_service.h. This file holds the flags and main.
//
// SIGTERM/SIGINT: cancels the subscription, stops serving, exits 0. Exit
// codes: 0 stopped by a signal, 1 an error retrying cannot fix (the tracker
// serves no live rows, a refused token, an unusable replica database), 2 bad
// flags (one line: an unknown flag, a value that does not parse or is out of
// range, a --listen address that is malformed or in use).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/grpc_server.h"
#include "base/process.h"
#include "clients/command_line.h"
#include "clients/delta_client.h"
#include "clients/predictor.h"
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

namespace deltastream {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "predictor: %s\n", line.c_str());
}

int Main() {
  PredictorOptions options;
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
    return Fail(2, read.message());
  }
  FILE* apply_log = nullptr;
  if (const std::string path = absl::GetFlag(FLAGS_apply_log); !path.empty()) {
    apply_log = std::fopen(path.c_str(), "a");
    if (apply_log == nullptr) {
      return Fail(2, absl::StrCat("cannot append to --apply_log '", path, "'"));
    }
  }

  // Signals are taken by a thread of their own: blocked before any other
  // thread starts (gRPC's and RocksDB's inherit the mask).
  const sigset_t signals = BlockTerminationSignals();

  ReplicaOptions replica_options;
  replica_options.db_path = absl::GetFlag(FLAGS_replica_db);
  absl::StatusOr<std::unique_ptr<Replica>> replica =
      Replica::Open(replica_options);
  if (!replica.ok()) return Fail(1, replica.status().message());
  if ((*replica)->Version() >= 0) {
    Log(absl::StrFormat("replica in %s resumes at version %d of run %s",
                        (*replica)->where(), (*replica)->Version(),
                        (*replica)->RunId()));
  }
  Predictor predictor(options,
                      DeltaClient::Create(options.target, client_options),
                      *std::move(replica), apply_log);

  ReplicaLookupService service(&predictor);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  absl::StatusOr<StartedServer> started =
      StartServer(builder, listen, grpc::InsecureServerCredentials());
  if (!started.ok()) return Fail(kExitUsage, started.status());
  std::unique_ptr<grpc::Server> server = std::move(started->server);
  std::printf("listening on %s\n", started->address.c_str());
  std::fflush(stdout);

  std::atomic<bool> signalled{false};
  std::thread stopper([&] {
    const int signal = WaitForTerminationSignal(signals);
    if (!signalled.exchange(true)) {
      Log(absl::StrCat("signal ", signal, ": stopping"));
    }
    predictor.Stop();
  });
  std::thread poller([&predictor] { predictor.PollTrainer(); });
  const absl::Status run = predictor.Run();
  predictor.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  poller.join();
  if (!signalled.exchange(true)) kill(getpid(), SIGTERM);  // wakes `stopper`
  stopper.join();
  if (apply_log != nullptr) std::fclose(apply_log);
  if (!run.ok()) return Fail(1, run.message());
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "predictor --target=HOST:PORT [--replica_db=DIR]; see --helpfull");
  if (const std::string error = deltastream::CommandLineError(argc, argv);
      !error.empty()) {
    return deltastream::Fail(deltastream::kExitUsage, error);
  }
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
