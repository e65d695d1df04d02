#include "tracker_service/service_host.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/auth.h"
#include "base/grpc_server.h"
#include "base/rpc_metrics.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/names.h"

namespace deltastream {
std::string DescribeSnapshot(const SnapshotInfo& info) {
  const double seconds = absl::ToDoubleSeconds(info.elapsed);
  return absl::StrFormat(
      "snapshot %d (batch %d, %.1f MiB in %.2f s, %.0f MB/s)", info.generation,
      info.owner_batch, info.payload_bytes / 1048576.0, seconds,
      seconds > 0 ? info.payload_bytes / seconds / 1e6 : 0.0);
}

absl::Status ValidateServiceHostOptions(const ServiceHostOptions& options) {
  if (absl::Status status = ValidateListenAddress(options.listen);
      !status.ok()) {
    return status;
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest message must be > 0 bytes, got ",
                     options.max_message_bytes));
  }
  if (options.max_concurrent_streams <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "concurrent streams per client must be > 0 (0 would hang every "
        "call), got ",
        options.max_concurrent_streams));
  }
  if (absl::Status status = ValidateKeepalive(options.keepalive_ms);
      !status.ok()) {
    return status;
  }
  if (options.snapshot_interval_s < 0 ||
      (options.snapshot_interval_s > 0 && options.db.empty())) {
    return absl::InvalidArgumentError(
        "a snapshot interval needs a database and must be >= 0");
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("a TLS certificate and key go together");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServiceHost>> ServiceHost::Start(
    Tracker* tracker, ServiceHostOptions options, bool restore) {
  if (absl::Status status = ValidateServiceHostOptions(options); !status.ok()) {
    return status;
  }
  std::unique_ptr<ServiceHost> host(new ServiceHost());
  // The files first: a typo in one must stop the start before a database
  // is created or restored.
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<TokenAuthorizer> parsed =
        TokenAuthorizer::FromFile(options.auth_token_file, &ValidateName);
    if (!parsed.ok()) return parsed.status();
    host->auth_ = std::make_unique<TokenAuthorizer>(*std::move(parsed));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFromFiles(options.tls_cert, options.tls_key);
  if (!credentials.ok()) return credentials.status();
  if (!options.db.empty()) {
    absl::StatusOr<std::unique_ptr<TrackerSnapshots>> opened =
        TrackerSnapshots::Open(options.db, tracker);
    if (!opened.ok()) return opened.status();
    host->snapshots_ = *std::move(opened);
    if (restore) {
      absl::StatusOr<std::optional<SnapshotInfo>> restored =
          host->snapshots_->Restore();
      if (!restored.ok()) return restored.status();
      host->restored_ = *restored;
    }
  }

  ServiceOptions service_options;
  service_options.snapshots = host->snapshots_.get();
  service_options.auth = host->auth_.get();
  service_options.step_cuts = options.step_cuts;
  service_options.network_producers = options.network_producers;
  host->service_ =
      std::make_unique<DeltaTrackerService>(tracker, service_options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (options.rpc_metrics != nullptr) {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(options.rpc_metrics->NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_concurrent_streams);
  builder.RegisterService(host->service_.get());
  absl::StatusOr<StartedServer> started =
      StartServer(builder, options.listen, *credentials, options.keepalive_ms);
  if (!started.ok()) return started.status();
  host->server_ = std::move(started->server);
  host->address_ = std::move(started->address);
  // Until the owner says more (SetTopology): one process, whole tables of
  // unknown size; a rank of a group has none until then.
  if (!options.topology_from_owner) host->SetOneProcessTopology(*tracker);
  if (host->snapshots_ != nullptr && options.snapshot_interval_s > 0) {
    host->snapshots_->StartPeriodic(absl::Seconds(options.snapshot_interval_s));
  }
  return host;
}

void ServiceHost::SetOneProcessTopology(const Tracker& tracker) {
  ServiceTopology topology;
  topology.endpoints = {address_};
  for (const std::string& fqn : tracker.feature_map().fqns) {
    ServiceTopology::Shard shard;
    shard.fqn = fqn;
    shard.sharding_type = "TABLE_WISE";
    topology.shards.push_back(std::move(shard));
  }
  service_->SetTopology(std::move(topology));
}

ServiceHost::~ServiceHost() { Shutdown(); }

void ServiceHost::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (server_ == nullptr) return;  // Start failed half way
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    if (snapshots_ != nullptr) snapshots_->StopPeriodic();
  });
}

void ServiceHost::Wait() { server_->Wait(); }

void ServiceHost::SetTopology(ServiceTopology topology) {
  service_->SetTopology(std::move(topology));
}

}  // namespace deltastream
