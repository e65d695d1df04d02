#include "clients/checkpoint_job_metrics.h"

#include "absl/time/clock.h"
#include "base/metrics.h"

namespace deltastream {

std::vector<prometheus::MetricFamily> CheckpointJobMetrics::Collect() const {
  const CheckpointJobStats stats = job_->Stats();
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  families.push_back(NewFamily("deltastream_checkpoint_links_written_total",
                               "Checkpoint links written, by kind",
                               MetricType::Counter));
  AddSample(families.back(), {{"kind", "full"}},
            static_cast<double>(stats.full_links));
  AddSample(families.back(), {{"kind", "increment"}},
            static_cast<double>(stats.increment_links));
  auto add = [&](const char* name, const char* help, MetricType type,
                 double value) {
    families.push_back(NewFamily(name, help, type));
    AddSample(families.back(), {}, value);
  };
  add("deltastream_checkpoint_written_bytes_total",
      "Bytes of the checkpoint links written", MetricType::Counter,
      static_cast<double>(stats.bytes_written));
  add("deltastream_checkpoint_written_rows_total",
      "Embedding rows in the checkpoint links written", MetricType::Counter,
      static_cast<double>(stats.rows_written));
  add("deltastream_checkpoint_resyncs_total",
      "Reads that did not continue the chain and started it again with a "
      "full link",
      MetricType::Counter, static_cast<double>(stats.resyncs));
  add("deltastream_checkpoint_removed_links_total",
      "Links removed because a restarted trainer lost their batches",
      MetricType::Counter, static_cast<double>(stats.removed_links));
  add("deltastream_checkpoint_chain_end_batch",
      "The trainer batch the checkpoint chain ends at (-1: empty)",
      MetricType::Gauge, static_cast<double>(stats.chain_end_batch));
  if (stats.last_link_time != absl::InfinitePast()) {
    add("deltastream_checkpoint_last_link_timestamp_seconds",
        "When the latest link was written (Unix time)", MetricType::Gauge,
        absl::ToDoubleSeconds(stats.last_link_time - absl::UnixEpoch()));
    add("deltastream_checkpoint_last_link_age_seconds",
        "Time since the latest link was written", MetricType::Gauge,
        absl::ToDoubleSeconds(absl::Now() - stats.last_link_time));
    add("deltastream_checkpoint_last_link_duration_seconds",
        "How long the latest link's pull and write took", MetricType::Gauge,
        absl::ToDoubleSeconds(stats.last_link_duration));
  }
  return families;
}

}  // namespace deltastream
