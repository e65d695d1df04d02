#ifndef DELTASTREAM_BASE_METRICS_H_
#define DELTASTREAM_BASE_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

// HOST:PORT of the metrics endpoint; see StartMetricsFromFlags.
ABSL_DECLARE_FLAG(std::string, metrics_listen);

namespace deltastream {

// Prometheus metrics over HTTP (Debian's prometheus-cpp: its registry,
// counters, gauges and histograms; its civetweb exposer), one way for every
// long-running binary (trainer ranks, tracker_server, predictor, checkpoint
// job).
//
// A binary builds its metrics on a prometheus::Registry (names by
// Prometheus's conventions: `deltastream_` prefix, base units, `_total` for
// counters, `_seconds` / `_bytes` suffixes), then serves it:
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   ... counters on *registry ...
//   absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
//       StartMetricsFromFlags(registry);   // --metrics_listen
//   if (!metrics.ok()) return Fail(kExitUsage, metrics.status());
//
// and a scrape is `curl http://HOST:PORT/metrics` (text format 0.0.4).

// An HTTP server answering GET /metrics with the text exposition of its
// registries. Stops serving when destroyed (after in-flight scrapes).
// Thread safety: Add() and the accessors are safe from any thread; scrapes
// run on the server's own threads and read the registries concurrently with
// their updates (prometheus-cpp's metrics are thread-safe).
class MetricsEndpoint {
 public:
  // Serves `registry` (shared: it must outlive nothing here) on `address`,
  // HOST:PORT checked by ValidateListenAddress (port 0: a free one; the
  // host an IP address or "localhost"). InvalidArgument: a malformed
  // address; FailedPrecondition: one line, the address is in use or not
  // local.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Serves `collectable`'s metrics too, for as long as it lives (the
  // endpoint holds a weak reference; e.g. a collector that reads a
  // component's status at scrape time).
  void Add(const std::weak_ptr<prometheus::Collectable>& collectable);

  // The address it listens on, with the bound port ("127.0.0.1:9464").
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  int port_ = 0;
};

// Reads --metrics_listen (defined here: every binary linking this library
// takes it; empty, the default, serves no metrics) and, when set, starts an
// endpoint for `registry`, on the flag's port plus `port_offset` (a rank's
// local rank, so that the ranks of one machine do not share a port; port 0
// stays 0). Returns nullptr when the flag is empty; the errors of
// MetricsEndpoint::Start, naming the flag, otherwise.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    std::shared_ptr<prometheus::Registry> registry, int port_offset = 0);

// For collectors that read a component's state at scrape time (a
// prometheus::Collectable's Collect()): a family of `type` (counter or
// gauge) named `name`, and one sample added to it.
prometheus::MetricFamily NewFamily(const std::string& name,
                                   const std::string& help,
                                   prometheus::MetricType type);
void AddSample(prometheus::MetricFamily& family,
               const std::vector<std::pair<std::string, std::string>>& labels,
               double value);

// Histogram buckets for durations in seconds, 0.5 ms to about 16 s
// (doubling): RPC latencies, freshness, step and snapshot times.
prometheus::Histogram::BucketBoundaries SecondsBuckets();

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_METRICS_H_
