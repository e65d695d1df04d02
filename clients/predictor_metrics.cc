#include "clients/predictor_metrics.h"

#include <string>

#include "base/metrics.h"

namespace deltastream {

PredictorMetrics::PredictorMetrics(prometheus::Registry& registry)
    : freshness_(
          prometheus::BuildHistogram()
              .Name("deltastream_predictor_freshness_seconds")
              .Help("Time from the oldest change of an applied push in the "
                    "trainer to its apply in the replica")
              .Register(registry)
              .Add({}, SecondsBuckets())) {}

std::vector<prometheus::MetricFamily> PredictorMetrics::Collect() const {
  const Predictor* predictor = predictor_.load();
  if (predictor == nullptr) return {};
  const v1::PredictorStatus status = predictor->Status();
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  auto add = [&](const char* name, const char* help, MetricType type,
                 double value) {
    families.push_back(NewFamily(name, help, type));
    AddSample(families.back(), {}, value);
  };
  add("deltastream_predictor_ready",
      "1 once the replica holds a version (bootstrapped), else 0",
      MetricType::Gauge, status.ready() ? 1 : 0);
  add("deltastream_predictor_version_batch",
      "The trainer batch the replica holds (its version)", MetricType::Gauge,
      static_cast<double>(status.version()));
  add("deltastream_predictor_trainer_batch",
      "The trainer's current batch, as last polled", MetricType::Gauge,
      static_cast<double>(status.trainer_batch()));
  add("deltastream_predictor_lag_steps",
      "Trainer batches the replica is behind", MetricType::Gauge,
      static_cast<double>(status.lag_steps()));
  add("deltastream_predictor_applies_total",
      "Versions applied to the replica (pushes, full reads, bootstraps)",
      MetricType::Counter, static_cast<double>(status.applied_deltas()));
  add("deltastream_predictor_rows_applied_total",
      "Embedding rows applied to the replica", MetricType::Counter,
      static_cast<double>(status.applied_rows()));
  add("deltastream_predictor_received_bytes_total",
      "Delta bytes received from the trainer", MetricType::Counter,
      static_cast<double>(status.bytes_received()));
  add("deltastream_predictor_resyncs_total",
      "Full reads after the first bootstrap", MetricType::Counter,
      static_cast<double>(status.resyncs()));
  add("deltastream_predictor_reconnects_total",
      "Subscriptions or status calls that failed and were retried",
      MetricType::Counter, static_cast<double>(status.reconnects()));
  add("deltastream_predictor_staged_pushes",
      "Pushes waiting for dense parameters", MetricType::Gauge,
      static_cast<double>(status.staged_deltas()));
  add("deltastream_predictor_superseded_commits_total",
      "Commits a later commit had already covered", MetricType::Counter,
      static_cast<double>(status.superseded_commits()));
  families.push_back(NewFamily("deltastream_predictor_table_rows",
                               "Rows the replica holds, by table",
                               MetricType::Gauge));
  for (const v1::TableRowCount& table : status.tables()) {
    AddSample(families.back(), {{"table", table.fqn()}},
              static_cast<double>(table.rows()));
  }
  return families;
}

}  // namespace deltastream
