#ifndef DELTASTREAM_TRAINER_TRAINER_METRICS_H_
#define DELTASTREAM_TRAINER_TRAINER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>

namespace deltastream {

// A trainer rank's Prometheus metrics, observed by its step loop once per
// step (docs/operations.md lists them):
//   deltastream_trainer_step_seconds          histogram of step times
//   deltastream_trainer_steps_total           steps trained
//   deltastream_trainer_examples_total        examples this rank trained
//   deltastream_trainer_examples_per_second   this rank's, of the latest step
//   deltastream_trainer_loss                  the latest progress line's mean
//                                             (NaN before the first)
//   deltastream_trainer_batch                 the latest step's batch index
// Each rank serves its own; Prometheus sums examples_total across ranks and
// aggregates the step-time histograms.
//
// Thread safety: ObserveStep() from the training thread, concurrently with
// scrapes on the metrics server's threads.
class TrainerMetrics {
 public:
  // Registers the families on `registry` (not owned; must outlive this).
  explicit TrainerMetrics(prometheus::Registry& registry);
  TrainerMetrics(const TrainerMetrics&) = delete;
  TrainerMetrics& operator=(const TrainerMetrics&) = delete;

  // One finished step: batch `batch` of `examples` examples took `seconds`
  // and ended with `loss`. A non-positive `seconds` leaves examples/s as it
  // was.
  void ObserveStep(int64_t batch, double seconds, int64_t examples,
                   double loss);

 private:
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& steps_;
  prometheus::Counter& examples_;
  prometheus::Gauge& examples_per_second_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& batch_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_TRAINER_METRICS_H_
