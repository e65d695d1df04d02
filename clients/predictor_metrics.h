#ifndef DELTASTREAM_CLIENTS_PREDICTOR_METRICS_H_
#define DELTASTREAM_CLIENTS_PREDICTOR_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <vector>

#include "clients/predictor.h"

namespace deltastream {

// A predictor's Prometheus metrics (docs/operations.md lists them):
//  - read from Predictor::Status() at each scrape: version, trainer batch,
//    lag in steps, applies, rows applied, bytes received, resyncs,
//    reconnects, staged pushes, superseded commits, rows per table, ready;
//  - observed as they happen: freshness (a trainer's change to its apply,
//    seconds) as a histogram, so that quantiles aggregate across predictors.
// Lookups are counted by the lookup API's RPC metrics (base/rpc_metrics.h).
//
// Thread safety: Collect() runs on the metrics server's threads,
// concurrently with ObserveFreshness() from Predictor::Run().
class PredictorMetrics : public prometheus::Collectable {
 public:
  // Registers the freshness histogram on `registry` (not owned; must
  // outlive this). Call AttachTo() once the predictor exists.
  explicit PredictorMetrics(prometheus::Registry& registry);

  // The predictor whose Status() Collect() reads (not owned; must outlive
  // every scrape; null: only the histogram).
  void AttachTo(const Predictor* predictor) { predictor_ = predictor; }

  // For PredictorOptions::on_freshness.
  void ObserveFreshness(double seconds) { freshness_.Observe(seconds); }

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::atomic<const Predictor*> predictor_{nullptr};
  prometheus::Histogram& freshness_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_PREDICTOR_METRICS_H_
