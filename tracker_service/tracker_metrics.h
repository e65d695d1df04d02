#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKER_METRICS_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKER_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"

namespace deltastream {

// A tracker's Prometheus metrics, read from Tracker::Status() (and the
// latest snapshot) at each scrape; docs/operations.md lists them:
//  - the current batch; per table the IDs, bytes and lookups held;
//  - per consumer its lag in steps and seconds, pending (uncommitted)
//    reads, whether it must resync, and counters of the resyncs it was told
//    and of the unread rows the memory cap dropped (since the process
//    started);
//  - the memory cap's counters (rows and bytes dropped, compactions and
//    drops it forced);
//  - with snapshots: the latest one's generation, size, duration, time and
//    age.
//
// Usage (the tracker_server or trainer, with base/metrics.h):
//   auto collector = std::make_shared<TrackerMetrics>(tracker, snapshots);
//   metrics_endpoint->Add(collector);
//
// Thread safety: Collect() may run on any thread, concurrently with the
// tracker's calls (Status() takes the tracker's lock briefly).
class TrackerMetrics : public prometheus::Collectable {
 public:
  // `tracker` (required) and `snapshots` (may be null: no snapshot metrics)
  // are not owned and must outlive every scrape.
  TrackerMetrics(const Tracker* tracker, const TrackerSnapshots* snapshots)
      : tracker_(tracker), snapshots_(snapshots) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Tracker* const tracker_;
  const TrackerSnapshots* const snapshots_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKER_METRICS_H_
