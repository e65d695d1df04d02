#include "base/metrics.h"

#include <prometheus/exposer.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_server.h"
#include "base/host_port.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (empty: "
          "none; port 0: a free one)");

namespace deltastream {
namespace {

// civetweb takes IP addresses only: "localhost" means the IPv4 loopback.
std::string CivetwebAddress(const std::string& address,
                            const HostPort& listen) {
  if (listen.host == "localhost") return JoinHostPort("127.0.0.1", listen.port);
  return address;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  if (absl::Status valid = ValidateListenAddress(address); !valid.ok()) {
    return valid;
  }
  const HostPort listen = *SplitHostPort(address);
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint);
  endpoint->registry_ = std::move(registry);
  try {
    // One thread is enough for Prometheus's scrapes; two lets a slow scrape
    // not hold up a health check of the same port.
    endpoint->exposer_ =
        std::make_unique<prometheus::Exposer>(std::vector<std::string>{
            "listening_ports", CivetwebAddress(address, listen), "num_threads",
            "2"});
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve metrics on ", address,
                     " (in use or not a local address): ", e.what()));
  }
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve metrics on ", address, ": no port bound"));
  }
  endpoint->port_ = ports.front();
  endpoint->address_ = JoinHostPort(listen.host, endpoint->port_);
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() = default;

void MetricsEndpoint::Add(
    const std::weak_ptr<prometheus::Collectable>& collectable) {
  exposer_->RegisterCollectable(collectable);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    std::shared_ptr<prometheus::Registry> registry, int port_offset) {
  const std::string flag = absl::GetFlag(FLAGS_metrics_listen);
  if (flag.empty()) return std::unique_ptr<MetricsEndpoint>();
  const std::string address = OffsetPort(flag, port_offset);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(address, std::move(registry));
  if (!endpoint.ok()) {
    return absl::Status(
        endpoint.status().code(),
        absl::StrCat("--metrics_listen: ", endpoint.status().message()));
  }
  return endpoint;
}

prometheus::MetricFamily NewFamily(const std::string& name,
                                   const std::string& help,
                                   prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddSample(prometheus::MetricFamily& family,
               const std::vector<std::pair<std::string, std::string>>& labels,
               double value) {
  prometheus::ClientMetric metric;
  for (const auto& [name, label_value] : labels) {
    metric.label.push_back(prometheus::ClientMetric::Label{name, label_value});
  }
  if (family.type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double bound = 0.0005; bound < 20; bound *= 2) buckets.push_back(bound);
  return buckets;
}

}  // namespace deltastream
