#ifndef DELTASTREAM_TRAINER_TRAINER_H_
#define DELTASTREAM_TRAINER_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tracker_service/service_host.h"
#include "tracker_service/step_cuts.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"
#include "trainer/config.h"
#include "trainer/data/batch.h"
#include "trainer/models/model.h"
#include "trainer/pipeline/train_pipeline.h"
#include "trainer/rank_batches.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {

// What a run did, for the progress lines and the final summary.
struct TrainerProgress {
  int64_t step = 0;  // steps trained in total (restored ones too)
  int64_t steps_this_run = 0;
  int64_t examples_this_run = 0;
  double examples_per_second = 0;  // since the previous progress line
  double loss = 0;                 // mean training loss since then
  std::optional<double> eval_auc;  // on the held-out batches (if any)
  absl::Duration elapsed;          // of this run
  // A stop request (any rank's) ended the run before its step budget and
  // the data's end.
  bool stopped = false;
};

// The training job of one process: it assembles model, data, fused sparse
// optimizers, dense optimizer, tracker (with the tracker service in-process),
// snapshots and checkpoints, restores them, and drives a TrainPipeline
// (trainer/pipeline/) one step at a time between progress lines and
// checkpoints.
//
// Each step (SequentialTrainPipeline): next batch -> device; forward (the
// embedding modules' hooks record lookups into the tracker and trigger
// auto-compaction); loss; backward under the rows reader's update guard (the
// fused sparse optimizers change rows; the tracker service reads rows only
// between steps); dense optimizer step; tracker Step(). With a checkpoint
// dir, a tracker snapshot (RocksDB, <dir>/db) and a full checkpoint
// (<dir>/checkpoints) are written together at the same step boundary on the
// configured schedule and at the end; on start, the latest of both are
// restored and the data is fast-forwarded past the steps already trained
// (trainer_restore.cc). At the end of a run with the service, consumers are
// given settings.drain_seconds to read the final batch (consumer_drain.h).
class Trainer {
 public:
  // `log` receives human-readable lines (progress, restores, snapshots).
  // Errors: the configuration's, the model's, a database or checkpoint that
  // does not fit the model, a port that cannot be served.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      TrainerSettings settings, std::function<void(const std::string&)> log);
  ~Trainer();

  // Trains `steps` more steps (-1: until the data ends), or until `stop`
  // becomes true (checked between steps); then writes the final snapshot and
  // checkpoint (with a checkpoint dir). Returns the last progress. May be
  // called again to continue.
  absl::StatusOr<TrainerProgress> Run(const std::atomic<bool>& stop,
                                      int64_t steps);
  const TrainerSettings& settings() const { return settings_; }

  // Stops the service (ends open streams). Called by the destructor too.
  void StopService();

  // The service's address ("HOST:PORT"), empty when not serving.
  std::string service_address() const;
  // Null when tracking is off.
  Tracker* tracker() const { return tracker_.get(); }
  // The tracker's snapshots (null without a checkpoint dir or tracking).
  const TrackerSnapshots* snapshots() const { return snapshots_; }
  RecModel& model() const { return *model_; }
  int64_t step() const { return step_; }

 private:
  Trainer() = default;
  // AUC of the model on the held-out batches (there are some): with a
  // process group, over every rank's (a collective).
  absl::StatusOr<double> Evaluate();
  // trainer_restore.cc: the latest checkpoint (or settings_.restore_chain),
  // the data fast-forwarded past its steps, the tracker's snapshot and its
  // batch index in line with the model's step; on several ranks, then the
  // consumers' cursors agreed with the other ranks (trainer/
  // cursor_agreement.h), before Topology lets a client read.
  absl::Status RestoreOrStart();
  // Tables (and dense parameters) from settings_.restore_chain.
  absl::Status RestoreFromChain();
  // Once pipeline_ exists: the restored checkpoint's gradient scaler state
  // into its GradientScaler (with mixed precision; InvalidArgument for a
  // state it refuses).
  absl::Status RestoreGradientScaler();
  absl::Status SaveState();
  // At a step boundary of a sharded trainer that serves its tracker: the
  // consistent cuts every rank holds are read now (ServeAgreedCuts).
  absl::Status ServeCuts();
  // Whether training stops on request: this process's `stop`, or (several
  // ranks) the per-step agreement's answer, whichever rank's request it
  // carried.
  bool StopAgreed(const std::atomic<bool>& stop) const;
  // How long a step boundary holds for the reads of its cuts, at most.
  static constexpr absl::Duration kCutHoldLimit = absl::Seconds(10);
  // The losses summed since the last progress line, averaged over ranks.
  absl::StatusOr<double> GlobalLossSum();

  TrainerSettings settings_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<RecModel> model_;
  std::unique_ptr<torch::optim::Optimizer> dense_optimizer_;
  std::unique_ptr<BatchSource> source_;
  // source_ when several ranks train (null otherwise).
  RankBatchSource* rank_source_ = nullptr;
  std::vector<Batch> eval_batches_;
  std::unique_ptr<ModuleRowsReader> rows_reader_;
  std::unique_ptr<Tracker> tracker_;
  // Exactly one of these holds the tracker's snapshots (with a dir).
  std::unique_ptr<ServiceHost> host_;
  std::unique_ptr<TrackerSnapshots> own_snapshots_;
  // Consistent cuts of a sharded trainer's service (null otherwise).
  std::unique_ptr<StepCuts> step_cuts_;
  TrackerSnapshots* snapshots_ = nullptr;
  // The step loop over the parts above.
  std::unique_ptr<TrainPipeline> pipeline_;
  // The restored checkpoint's path and gradient scaler state, kept from
  // RestoreOrStart until the pipeline exists (RestoreGradientScaler).
  std::string restored_checkpoint_;
  std::vector<std::pair<std::string, at::Tensor>> restored_scaler_state_;

  int64_t step_ = 0;
  int64_t examples_ = 0;
  // The step of the complete checkpoint in the checkpoint dir that holds
  // this model as it is (restored or saved), -1 when none: SaveState does
  // not write that step again (a checkpoint's replacement is not
  // crash-safe, trainer/checkpoint.h).
  int64_t checkpointed_step_ = -1;
  // Sum of the losses since the last progress line, on the device (read only
  // at progress lines: no synchronisation per step).
  at::Tensor loss_sum_;
  int64_t loss_count_ = 0;
  // The loss of the last progress line (for metrics).
  // NaN until the first progress line (a 0 would read as a perfect model).
  double reported_loss_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_TRAINER_H_
