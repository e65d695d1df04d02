#include "trainer/trainer_metrics.h"

#include "base/metrics.h"

namespace deltastream {

TrainerMetrics::TrainerMetrics(prometheus::Registry& registry)
    : step_seconds_(prometheus::BuildHistogram()
                        .Name("deltastream_trainer_step_seconds")
                        .Help("Training step time")
                        .Register(registry)
                        .Add({}, SecondsBuckets())),
      steps_(prometheus::BuildCounter()
                 .Name("deltastream_trainer_steps_total")
                 .Help("Steps trained")
                 .Register(registry)
                 .Add({})),
      examples_(prometheus::BuildCounter()
                    .Name("deltastream_trainer_examples_total")
                    .Help("Examples trained")
                    .Register(registry)
                    .Add({})),
      examples_per_second_(prometheus::BuildGauge()
                               .Name("deltastream_trainer_examples_per_second")
                               .Help("Examples per second of the latest step")
                               .Register(registry)
                               .Add({})),
      loss_(prometheus::BuildGauge()
                .Name("deltastream_trainer_loss")
                .Help("Mean loss of the steps of the latest progress line "
                      "(NaN before the first)")
                .Register(registry)
                .Add({})),
      batch_(prometheus::BuildGauge()
                 .Name("deltastream_trainer_batch")
                 .Help("Batch index of the latest step")
                 .Register(registry)
                 .Add({})) {}

void TrainerMetrics::ObserveStep(int64_t batch, double seconds,
                                 int64_t examples, double loss) {
  step_seconds_.Observe(seconds);
  steps_.Increment();
  examples_.Increment(static_cast<double>(examples));
  if (seconds > 0) {
    examples_per_second_.Set(static_cast<double>(examples) / seconds);
  }
  loss_.Set(loss);
  batch_.Set(static_cast<double>(batch));
}

}  // namespace deltastream
