#include "tracker_service/tracker_metrics.h"

#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "base/metrics.h"

namespace deltastream {

std::vector<prometheus::MetricFamily> TrackerMetrics::Collect() const {
  const TrackerStatus status = tracker_->Status();
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  auto add = [&](const char* name, const char* help, MetricType type,
                 double value) {
    families.push_back(NewFamily(name, help, type));
    AddSample(families.back(), {}, value);
  };
  add("deltastream_tracker_current_batch",
      "The batch index being recorded (the trainer's step)", MetricType::Gauge,
      static_cast<double>(status.current_batch));

  // Per table.
  families.push_back(NewFamily(
      "deltastream_tracker_table_rows",
      "Row IDs held per table (repeats in lookups not yet compacted count)",
      MetricType::Gauge));
  for (const auto& [fqn, usage] : status.usage.tables) {
    AddSample(families.back(), {{"table", fqn}},
              static_cast<double>(usage.ids));
  }
  families.push_back(NewFamily("deltastream_tracker_table_bytes",
                               "Bytes of IDs, states and indexes held per "
                               "table",
                               MetricType::Gauge));
  for (const auto& [fqn, usage] : status.usage.tables) {
    AddSample(families.back(), {{"table", fqn}},
              static_cast<double>(usage.bytes));
  }
  families.push_back(NewFamily("deltastream_tracker_table_lookups",
                               "Indexed lookups held per table",
                               MetricType::Gauge));
  for (const auto& [fqn, usage] : status.usage.tables) {
    AddSample(families.back(), {{"table", fqn}},
              static_cast<double>(usage.lookups));
  }

  // Per consumer.
  families.push_back(NewFamily("deltastream_tracker_consumer_lag_steps",
                               "Batches a consumer has not read",
                               MetricType::Gauge));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              static_cast<double>(consumer.lag_steps));
  }
  families.push_back(NewFamily(
      "deltastream_tracker_consumer_lag_seconds",
      "Time since the oldest batch a consumer has not read was opened",
      MetricType::Gauge));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              absl::ToDoubleSeconds(consumer.lag));
  }
  families.push_back(NewFamily("deltastream_tracker_consumer_pending_reads",
                               "Reads delivered and not yet committed",
                               MetricType::Gauge));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              consumer.pending_reads);
  }
  families.push_back(NewFamily(
      "deltastream_tracker_consumer_resync_required",
      "1 while a consumer lost unread rows (memory cap) and must resync",
      MetricType::Gauge));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              consumer.resync_required ? 1 : 0);
  }

  families.push_back(NewFamily(
      "deltastream_tracker_consumer_resyncs_total",
      "Times a consumer lost unread rows (memory cap, a restore) and was told "
      "to resync",
      MetricType::Counter));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              static_cast<double>(consumer.resyncs));
  }
  families.push_back(NewFamily(
      "deltastream_tracker_consumer_dropped_rows_total",
      "Row IDs a consumer had not read that the memory cap dropped (repeats "
      "included)",
      MetricType::Counter));
  for (const ConsumerStatus& consumer : status.consumers) {
    AddSample(families.back(), {{"consumer", consumer.name}},
              static_cast<double>(consumer.dropped_ids));
  }

  // Memory cap.
  add("deltastream_tracker_memory_held_bytes",
      "Bytes the store holds, all tables", MetricType::Gauge,
      static_cast<double>(status.usage.total.bytes));
  add("deltastream_tracker_memory_cap_bytes",
      "The store's memory cap (0: unbounded)", MetricType::Gauge,
      static_cast<double>(status.memory_cap_bytes));
  add("deltastream_tracker_dropped_rows_total",
      "Row IDs dropped under the memory cap (repeats included)",
      MetricType::Counter, static_cast<double>(status.dropped_ids));
  add("deltastream_tracker_dropped_bytes_total",
      "Bytes dropped under the memory cap", MetricType::Counter,
      static_cast<double>(status.dropped_bytes));
  add("deltastream_tracker_cap_compactions_total",
      "Compactions the memory cap forced", MetricType::Counter,
      static_cast<double>(status.cap_compactions));
  add("deltastream_tracker_cap_drops_total",
      "Times the memory cap dropped rows", MetricType::Counter,
      static_cast<double>(status.cap_drops));
  add("deltastream_tracker_consumers_expired_total",
      "Consumers removed for having gone silent (expire_consumers_after)",
      MetricType::Counter, static_cast<double>(status.consumers_expired));

  // The latest snapshot.
  if (snapshots_ != nullptr) {
    const std::optional<SnapshotInfo> latest = snapshots_->latest();
    if (latest.has_value()) {
      add("deltastream_tracker_snapshot_generation",
          "The latest snapshot's generation", MetricType::Gauge,
          static_cast<double>(latest->generation));
      add("deltastream_tracker_snapshot_bytes",
          "Bytes of IDs and states in the latest snapshot", MetricType::Gauge,
          static_cast<double>(latest->payload_bytes));
      add("deltastream_tracker_snapshot_duration_seconds",
          "How long the latest snapshot's write (or restore) took",
          MetricType::Gauge, absl::ToDoubleSeconds(latest->elapsed));
      if (latest->written_at != absl::InfinitePast()) {
        add("deltastream_tracker_snapshot_timestamp_seconds",
            "When the latest snapshot was written (Unix time)",
            MetricType::Gauge,
            absl::ToDoubleSeconds(latest->written_at - absl::UnixEpoch()));
        add("deltastream_tracker_snapshot_age_seconds",
            "Time since the latest snapshot was written", MetricType::Gauge,
            absl::ToDoubleSeconds(absl::Now() - latest->written_at));
      }
    }
  }
  return families;
}

}  // namespace deltastream
