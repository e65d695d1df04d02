#ifndef DELTASTREAM_TRACKER_SERVICE_SERVICE_HOST_H_
#define DELTASTREAM_TRACKER_SERVICE_SERVICE_HOST_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/grpc_server.h"
#include "tracker_service/service_topology.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace deltastream {

class RpcMetrics;
class StepCuts;

class DeltaTrackerService;
class TokenAuthorizer;

// Where and how a process serves its tracker: what tracker_server's flags and
// the trainer's config both say.
struct ServiceHostOptions {
  // HOST:PORT; port 0 picks a free one (see ServiceHost::address()).
  std::string listen = "127.0.0.1:50051";
  // RocksDB directory for snapshots; empty: none.
  std::string db;
  // Seconds between snapshots taken by a thread of the host's own (0: none).
  // The trainer leaves it 0 and snapshots at step boundaries itself.
  int snapshot_interval_s = 0;
  // Bearer tokens with roles (base/auth.h); empty: no auth.
  std::string auth_token_file;
  // PEM certificate chain and key: serve TLS. Both or neither.
  std::string tls_cert;
  std::string tls_key;
  // Largest request accepted, and concurrent streams per client: both > 0.
  int max_message_bytes = 64 << 20;
  int max_concurrent_streams = 64;
  // Pings to clients with calls open, and how long an answer may take before
  // the client is dropped and its calls cancelled (base/grpc_server.h's
  // kServerKeepaliveMs): a subscriber that vanished is found within twice
  // this. > 0.
  int keepalive_ms = kServerKeepaliveMs;
  // When set (not owned; must outlive the host), every RPC is counted and
  // timed by method and code (base/rpc_metrics.h).
  RpcMetrics* rpc_metrics = nullptr;
  // A rank of a sharded trainer: see ServiceOptions::step_cuts. Not owned.
  StepCuts* step_cuts = nullptr;
  // A rank of a sharded trainer: the owner sets the topology (SetTopology)
  // once every rank's endpoint is known, and until then Topology answers
  // UNAVAILABLE, so that no client takes the rank for a whole model. False:
  // one process, whole tables, from the start.
  bool topology_from_owner = false;
  // See ServiceOptions::network_producers: false in a trainer.
  bool network_producers = true;
};

// The checks Start makes before it touches anything: `listen` by
// base/grpc_server's rule (HOST:PORT, port 0..65535), max_message_bytes and
// max_concurrent_streams > 0, keepalive_ms > 0, a snapshot interval >= 0 and
// only with a database, TLS certificate and key together. InvalidArgument, one
// line. Binaries call it first, so that a bad flag is refused before any other
// work (and before gRPC could log anything).
absl::Status ValidateServiceHostOptions(const ServiceHostOptions& options);

// One tracker served over gRPC (health checks and reflection included), with
// its snapshot database and authorizer. Thread-safe after Start.
class ServiceHost {
 public:
  // Opens the database (restoring its latest snapshot into `tracker` when
  // `restore`), reads the token file and TLS files, and starts serving.
  // `tracker` must outlive the host. InvalidArgument for inconsistent options,
  // NotFound for unreadable files, the database's errors (see
  // TrackerSnapshots), Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<ServiceHost>> Start(
      Tracker* tracker, ServiceHostOptions options, bool restore = true);

  ~ServiceHost();

  // "HOST:PORT" actually served (the port resolved when 0 was asked).
  const std::string& address() const { return address_; }
  // The snapshot restored at Start, if any.
  const std::optional<SnapshotInfo>& restored() const { return restored_; }
  // Null without a database.
  TrackerSnapshots* snapshots() const { return snapshots_.get(); }

  // What the Topology RPC answers from now on (DeltaTrackerService::
  // SetTopology). Until called: world size 1, address() as the one
  // endpoint, and the tracker's tables whole (sizes 0: not known); with
  // ServiceHostOptions::topology_from_owner, UNAVAILABLE instead. The
  // trainer calls it once its ranks have published their endpoints
  // (trainer/tracking/shard_topology.h). Thread-safe.
  void SetTopology(ServiceTopology topology);

  // Ends open streams and stops serving (waiting up to 5 s for calls in
  // flight), stops periodic snapshots. Idempotent. Does not snapshot: the
  // owner decides (tracker_server and the trainer take a final one).
  void Shutdown();
  // Blocks until Shutdown() has been called (by another thread).
  void Wait();

 private:
  // What Topology answers until the owner says more: one process, whole
  // tables of unknown size.
  void SetOneProcessTopology(const Tracker& tracker);
  ServiceHost() = default;

  std::unique_ptr<TrackerSnapshots> snapshots_;
  std::unique_ptr<TokenAuthorizer> auth_;
  std::unique_ptr<DeltaTrackerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::optional<SnapshotInfo> restored_;
  std::once_flag shutdown_once_;
};

// "snapshot 3 (batch 120, 1.2 MiB in 0.01 s, 95 MB/s)", for logs.
std::string DescribeSnapshot(const SnapshotInfo& info);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_SERVICE_HOST_H_
