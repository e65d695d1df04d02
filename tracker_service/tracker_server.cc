// The standalone (sidecar) tracker server, for producers that are not
// in-process (for example a Python trainer): records come in over gRPC.
//
//   tracker_server --listen=127.0.0.1:50051 --mode=embedding
//       --consumers=predictor,checkpoint [--delete_on_read] [--auto_compact]
//       [--db=/var/lib/deltastream --snapshot_interval_s=60]
//       [--auth_token_file=tokens] [--tls_cert=cert.pem --tls_key=key.pem]
//
// With --db it restores the database's latest snapshot before serving (the
// consumers of --consumers that it lacks are added), snapshots every
// --snapshot_interval_s and on SIGTERM/SIGINT. Prints "listening on
// HOST:PORT" on stdout once serving (port 0 picks a free port); everything
// else goes to stderr. Exits 2 on bad flags or a database it cannot use.

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "store/host_memory.h"
#include "tracker_service/auth.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"

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
ABSL_FLAG(std::string, db, "",
          "RocksDB directory for snapshots; its latest is restored on start");
ABSL_FLAG(int, snapshot_interval_s, 0,
          "seconds between snapshots (0: on demand and at shutdown only)");
ABSL_FLAG(std::string, auth_token_file, "",
          "bearer tokens with roles (see tracker_service/auth.h); empty: no "
          "authentication");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace deltastream {
namespace {

int Fail(absl::string_view message) {
  std::fprintf(stderr, "tracker_server: %s\n", std::string(message).c_str());
  return 2;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Describe(const SnapshotInfo& info) {
  const double seconds = absl::ToDoubleSeconds(info.elapsed);
  return absl::StrFormat(
      "snapshot %d (batch %d, %.1f MiB in %.2f s, %.0f MB/s)", info.generation,
      info.owner_batch, info.payload_bytes / 1048576.0, seconds,
      seconds > 0 ? info.payload_bytes / seconds / 1e6 : 0.0);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert_pem = ReadFile(cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFile(key);
  if (!key_pem.ok()) return key_pem.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  return grpc::SslServerCredentials(ssl);
}

int Main() {
  // Deltas are tens of MiB of fresh buffers per read: reuse them.
  KeepHostMemoryForReuse();

  // Signals are taken by a thread of their own: blocked before any other
  // thread starts (gRPC's and RocksDB's inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  TrackerOptions options;
  absl::StatusOr<TrackingMode> mode =
      ParseTrackingMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return Fail(mode.status().message());
  options.mode = *mode;
  options.consumers =
      absl::StrSplit(absl::GetFlag(FLAGS_consumers), ',', absl::SkipEmpty());
  options.delete_on_read = absl::GetFlag(FLAGS_delete_on_read);
  options.auto_compact = absl::GetFlag(FLAGS_auto_compact);
  options.acknowledged_reads = absl::GetFlag(FLAGS_acknowledged_reads);
  options.memory_cap_bytes = absl::GetFlag(FLAGS_memory_cap_bytes);
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  if (!tracker.ok()) return Fail(tracker.status().message());

  const std::string db = absl::GetFlag(FLAGS_db);
  const int snapshot_interval_s = absl::GetFlag(FLAGS_snapshot_interval_s);
  if (snapshot_interval_s < 0 || (snapshot_interval_s > 0 && db.empty())) {
    return Fail("--snapshot_interval_s needs --db and must be >= 0");
  }
  std::unique_ptr<TrackerSnapshots> snapshots;
  if (!db.empty()) {
    absl::StatusOr<std::unique_ptr<TrackerSnapshots>> opened =
        TrackerSnapshots::Open(db, tracker->get());
    if (!opened.ok()) return Fail(opened.status().message());
    snapshots = *std::move(opened);
    absl::StatusOr<std::optional<SnapshotInfo>> restored = snapshots->Restore();
    if (!restored.ok()) return Fail(restored.status().message());
    if (restored->has_value()) {
      std::fprintf(stderr, "tracker_server: restored %s from %s\n",
                   Describe(**restored).c_str(), db.c_str());
    } else {
      std::fprintf(stderr, "tracker_server: no snapshot in %s yet\n",
                   db.c_str());
    }
    if (snapshot_interval_s > 0) {
      snapshots->StartPeriodic(absl::Seconds(snapshot_interval_s));
    }
  }
  std::optional<TokenAuthorizer> auth;
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file);
      !file.empty()) {
    absl::StatusOr<TokenAuthorizer> parsed = TokenAuthorizer::FromFile(file);
    if (!parsed.ok()) return Fail(parsed.status().message());
    auth = *std::move(parsed);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      Credentials();
  if (!credentials.ok()) return Fail(credentials.status().message());

  ServiceOptions service_options;
  service_options.snapshots = snapshots.get();
  service_options.auth = auth.has_value() ? &*auth : nullptr;
  DeltaTrackerService service(tracker->get(), service_options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &port);
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

  std::thread stopper([&server, &signals, &service] {
    int signal = 0;
    sigwait(&signals, &signal);
    std::fprintf(stderr, "tracker_server: signal %d, shutting down\n", signal);
    service.Stop();
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
  });
  server->Wait();
  stopper.join();
  if (snapshots != nullptr) {
    snapshots->StopPeriodic();
    absl::StatusOr<SnapshotInfo> last = snapshots->Snapshot();
    if (!last.ok()) {
      std::fprintf(stderr, "tracker_server: final snapshot failed: %s\n",
                   std::string(last.status().message()).c_str());
      return 1;
    }
    std::fprintf(stderr, "tracker_server: final %s\n", Describe(*last).c_str());
  }
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
