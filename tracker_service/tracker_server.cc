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

#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/grpc_server.h"
#include "base/host_memory.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/process.h"
#include "base/rpc_metrics.h"
#include "tracker_service/names.h"
#include "tracker_service/service_host.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_metrics.h"
#include "tracker_service/tracker_snapshots.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "address to serve on, HOST:PORT (port 0: any free port)");
ABSL_FLAG(
    std::string, mode, "id_only",
    "id_only, embedding, momentum_last, momentum_diff or rowwise_adagrad");
ABSL_FLAG(std::string, consumers, "default",
          "comma-separated consumer names (at least one)");
ABSL_FLAG(bool, delete_on_read, true, "delete what every consumer has read");
ABSL_FLAG(bool, auto_compact, true, "compact after every step");
ABSL_FLAG(bool, acknowledged_reads, false,
          "a read is final only when the consumer commits it");
ABSL_FLAG(int64_t, memory_cap_bytes, 0,
          "bytes the store may hold (0: unbounded); see docs");
ABSL_FLAG(double, expire_consumers_after_s, 0,
          "remove consumers added at run time (not in --consumers) that have "
          "neither read nor committed for this many seconds, with batches "
          "unread that were closed that long ago (0: never)");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "largest request accepted (> 0)");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "concurrent streams per client (> 0)");
ABSL_FLAG(int, keepalive_ms, deltastream::kServerKeepaliveMs,
          "ping clients with calls open this often; drop one that does not "
          "answer within it (> 0)");
ABSL_FLAG(std::string, db, "",
          "RocksDB directory for snapshots; its latest is restored on start");
ABSL_FLAG(int, snapshot_interval_s, 0,
          "seconds between snapshots (0: on demand and at shutdown only)");
ABSL_FLAG(std::string, auth_token_file, "",
          "bearer tokens with roles (see base/auth.h); empty: no "
          "authentication");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace deltastream {
namespace {

int Main() {
  // Every flag is checked before anything starts, so that a bad one is one
  // line and exit 2 (no thread, no gRPC log line, nothing opened).
  if (absl::Status logging = InitLogging("tracker_server"); !logging.ok()) {
    return Fail(kExitUsage, logging);
  }
  ServiceHostOptions host_options;
  host_options.listen = absl::GetFlag(FLAGS_listen);
  host_options.db = absl::GetFlag(FLAGS_db);
  host_options.snapshot_interval_s = absl::GetFlag(FLAGS_snapshot_interval_s);
  host_options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  host_options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  host_options.tls_key = absl::GetFlag(FLAGS_tls_key);
  host_options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  host_options.max_concurrent_streams =
      absl::GetFlag(FLAGS_max_concurrent_streams);
  host_options.keepalive_ms = absl::GetFlag(FLAGS_keepalive_ms);
  // Named by their flags here; the service host checks them too.
  if (absl::Status listen = ValidateListenAddress(host_options.listen);
      !listen.ok()) {
    return Fail(kExitUsage, absl::StrCat("--listen: ", listen.message()));
  }
  if (host_options.max_message_bytes <= 0) {
    return Fail(kExitUsage, "--max_message_bytes must be > 0");
  }
  if (host_options.max_concurrent_streams <= 0) {
    return Fail(kExitUsage, "--max_concurrent_streams must be > 0");
  }
  if (absl::Status keepalive = ValidateKeepalive(host_options.keepalive_ms);
      !keepalive.ok()) {
    return Fail(kExitUsage,
                absl::StrCat("--keepalive_ms: ", keepalive.message()));
  }
  if (host_options.snapshot_interval_s < 0 ||
      (host_options.snapshot_interval_s > 0 && host_options.db.empty())) {
    return Fail(kExitUsage,
                "--snapshot_interval_s needs --db and must be >= 0");
  }
  if (host_options.tls_cert.empty() != host_options.tls_key.empty()) {
    return Fail(kExitUsage, "--tls_cert and --tls_key go together");
  }
  if (absl::Status status = ValidateServiceHostOptions(host_options);
      !status.ok()) {
    return Fail(kExitUsage, status.message());
  }

  TrackerOptions options;
  absl::StatusOr<TrackingMode> mode =
      ParseTrackingMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return Fail(kExitUsage, mode.status().message());
  options.mode = *mode;
  // Every name counts: "--consumers=" or "a,,b" is refused by the name rule
  // (tracker_service/names.h), not read as the default consumer.
  options.consumers = absl::StrSplit(absl::GetFlag(FLAGS_consumers), ',');
  for (const std::string& name : options.consumers) {
    if (absl::Status status = ValidateName("consumer name", name);
        !status.ok()) {
      return Fail(kExitUsage, absl::StrCat("--consumers: ", status.message()));
    }
  }
  options.delete_on_read = absl::GetFlag(FLAGS_delete_on_read);
  options.auto_compact = absl::GetFlag(FLAGS_auto_compact);
  options.acknowledged_reads = absl::GetFlag(FLAGS_acknowledged_reads);
  options.memory_cap_bytes = absl::GetFlag(FLAGS_memory_cap_bytes);
  if (const double expire = absl::GetFlag(FLAGS_expire_consumers_after_s);
      !(expire >= 0) || !std::isfinite(expire)) {
    return Fail(kExitUsage,
                "--expire_consumers_after_s must be a number of seconds >= 0");
  } else {
    options.expire_consumers_after = absl::Seconds(expire);
  }
  options.log = [](const std::string& line) { LogWarning(line); };
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  if (!tracker.ok()) {
    return FailStart(tracker.status());
  }

  // Deltas are tens of MiB of fresh buffers per read: reuse them.
  KeepHostMemoryForReuse();
  // Signals are taken by a thread of their own: blocked before any other
  // thread starts (gRPC's and RocksDB's inherit the mask).
  const sigset_t signals = BlockTerminationSignals();

  auto registry = std::make_shared<prometheus::Registry>();
  RpcMetrics rpc_metrics(*registry);
  host_options.rpc_metrics = &rpc_metrics;
  absl::StatusOr<std::unique_ptr<ServiceHost>> host =
      ServiceHost::Start(tracker->get(), host_options);
  if (!host.ok()) {
    return FailStart(host.status());
  }
  // Declared after the host, so destroyed (no more scrapes) before it.
  auto tracker_metrics =
      std::make_shared<TrackerMetrics>(tracker->get(), (*host)->snapshots());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
      StartMetricsFromFlags(registry);
  if (!metrics.ok()) {
    return FailStart(metrics.status());
  }
  if (*metrics != nullptr) {
    (*metrics)->Add(tracker_metrics);
    LogInfo(
        absl::StrCat("metrics on http://", (*metrics)->address(), "/metrics"));
  }
  if ((*host)->snapshots() != nullptr) {
    if ((*host)->restored().has_value()) {
      LogInfo(absl::StrCat("restored ", DescribeSnapshot(*(*host)->restored()),
                           " from ", host_options.db));
    } else {
      LogInfo(absl::StrCat("no snapshot in ", host_options.db, " yet"));
    }
  }
  std::printf("listening on %s\n", (*host)->address().c_str());
  std::fflush(stdout);

  TerminationWatch watch(
      signals,
      [&host](int signal) {
        LogInfo(absl::StrCat("signal ", signal, ", shutting down"));
        (*host)->Shutdown();
      },
      [](int signal) {
        LogWarning(absl::StrCat("signal ", signal,
                                " again: exiting now, without the final "
                                "snapshot"));
      });
  (*host)->Wait();
  if (TrackerSnapshots* snapshots = (*host)->snapshots();
      snapshots != nullptr) {
    absl::StatusOr<SnapshotInfo> last = snapshots->Snapshot();
    if (!last.ok()) {
      LogError(
          absl::StrCat("final snapshot failed: ", last.status().message()));
      return 1;
    }
    LogInfo(absl::StrCat("final ", DescribeSnapshot(*last)));
  }
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "standalone delta tracker server; see --helpfull");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  return deltastream::Main();
}
