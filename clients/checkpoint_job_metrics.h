#ifndef DELTASTREAM_CLIENTS_CHECKPOINT_JOB_METRICS_H_
#define DELTASTREAM_CLIENTS_CHECKPOINT_JOB_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

#include "clients/checkpoint_job.h"

namespace deltastream {

// A checkpoint job's Prometheus metrics, read from CheckpointJob::Stats()
// at each scrape (docs/operations.md lists them): links written by kind,
// bytes and rows written, resyncs, removed links, the chain's end batch,
// the latest link's time, age and duration.
//
// Thread safety: Collect() may run on any thread, concurrently with the
// job's Run().
class CheckpointJobMetrics : public prometheus::Collectable {
 public:
  // `job` is not owned and must outlive every scrape.
  explicit CheckpointJobMetrics(const CheckpointJob* job) : job_(job) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const CheckpointJob* const job_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_CHECKPOINT_JOB_METRICS_H_
