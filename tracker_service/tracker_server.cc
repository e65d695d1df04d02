// The standalone (sidecar) tracker server, for producers that are not
// in-process (for example a Python trainer): records come in over gRPC.
//
//   tracker_server --listen=127.0.0.1:50051 --mode=embedding \
//       --consumers=predictor,checkpoint [--delete_on_read] [--auto_compact]
//
// Prints "listening on HOST:PORT" once serving (port 0 picks a free port) and
// shuts down cleanly on SIGTERM or SIGINT.

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/tracker.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "address to serve on, HOST:PORT (port 0: any free port)");
ABSL_FLAG(
    std::string, mode, "id_only",
    "id_only, embedding, momentum_last, momentum_diff or rowwise_adagrad");
ABSL_FLAG(std::string, consumers, "default", "comma-separated consumer names");
ABSL_FLAG(bool, delete_on_read, true, "delete what every consumer has read");
ABSL_FLAG(bool, auto_compact, true, "compact after every step");
ABSL_FLAG(bool, acknowledged_reads, false,
          "a read is final only when the consumer commits it");
ABSL_FLAG(int64_t, memory_cap_bytes, 0,
          "bytes the store may hold (0: unbounded); see docs");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "largest request accepted");
ABSL_FLAG(int, max_concurrent_streams, 64, "concurrent streams per client");
ABSL_FLAG(std::string, db, "", "RocksDB path for snapshots (not yet)");
ABSL_FLAG(int, snapshot_interval_s, 0, "seconds between snapshots (not yet)");
ABSL_FLAG(std::string, auth_token_file, "", "token file (not yet)");
ABSL_FLAG(std::string, tls_cert, "", "TLS certificate (not yet)");
ABSL_FLAG(std::string, tls_key, "", "TLS key (not yet)");

namespace deltastream {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tracker_server: %s\n", message.c_str());
  return 2;
}

int Main() {
  // Deltas are tens of MiB of fresh buffers per read. glibc returns every block
  // over its mmap threshold to the kernel on free, so each read would fault
  // its pages in again (microseconds each on VMs). Keep freed memory for
  // reuse: the server's footprint then stays at its peak, as a cache would.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  // Flags of the contract that later work implements: refuse rather than
  // run without what the operator asked for.
  const std::pair<const char*, bool> not_yet[] = {
      {"db", !absl::GetFlag(FLAGS_db).empty()},
      {"snapshot_interval_s", absl::GetFlag(FLAGS_snapshot_interval_s) != 0},
      {"auth_token_file", !absl::GetFlag(FLAGS_auth_token_file).empty()},
      {"tls_cert", !absl::GetFlag(FLAGS_tls_cert).empty()},
      {"tls_key", !absl::GetFlag(FLAGS_tls_key).empty()},
  };
  for (const auto& [flag, given] : not_yet) {
    if (given) {
      return Fail(std::string("--") + flag +
                  " is not supported by this build yet; refusing to run "
                  "without it rather than ignore it");
    }
  }
  TrackerOptions options;
  absl::StatusOr<TrackingMode> mode =
      ParseTrackingMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return Fail(std::string(mode.status().message()));
  options.mode = *mode;
  options.consumers =
      absl::StrSplit(absl::GetFlag(FLAGS_consumers), ',', absl::SkipEmpty());
  options.delete_on_read = absl::GetFlag(FLAGS_delete_on_read);
  options.auto_compact = absl::GetFlag(FLAGS_auto_compact);
  options.acknowledged_reads = absl::GetFlag(FLAGS_acknowledged_reads);
  options.memory_cap_bytes = absl::GetFlag(FLAGS_memory_cap_bytes);
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  if (!tracker.ok()) return Fail(std::string(tracker.status().message()));

  // Signals are taken by a thread of their own (blocked everywhere else).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  DeltaTrackerService service(tracker->get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail("cannot listen on " + absl::GetFlag(FLAGS_listen));
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  std::printf("listening on %s:%d\n",
              listen.substr(0, listen.rfind(':')).c_str(), port);
  std::fflush(stdout);

  std::thread stopper([&server, &signals] {
    int signal = 0;
    sigwait(&signals, &signal);
    std::fprintf(stderr, "tracker_server: signal %d, shutting down\n", signal);
    server->Shutdown();
  });
  server->Wait();
  stopper.join();
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "standalone delta tracker server; see --helpfull");
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
