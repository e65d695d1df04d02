#include "trainer/trainer.h"

#include <ATen/core/Tensor.h>
#include <google/protobuf/text_format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <zlib.h>

#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/torch_status.h"
#include "trainer/checkpoint.h"
#include "trainer/comm/process_group.h"
#include "trainer/consumer_drain.h"
#include "trainer/cut_agreement.h"
#include "trainer/data/criteo_tsv.h"
#include "trainer/data/synthetic.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/metrics.h"
#include "trainer/models/sequence_model.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/pipeline/pipeline_factory.h"
#include "trainer/rank_batches.h"
#include "trainer/sharding/sharding_plan.h"
#include "trainer/tracking/shard_topology.h"
#include "trainer/trainer_metrics.h"

namespace deltastream {
namespace {

int WorldSize(const TrainerSettings& settings) {
  return settings.group != nullptr ? settings.group->world_size() : 1;
}

absl::StatusOr<std::unique_ptr<RecModel>> MakeModel(
    const TrainerSettings& settings) {
  RecModelConfig config;
  config.num_dense = settings.num_dense;
  config.dense_arch = settings.dense_arch;
  config.over_arch = settings.over_arch;
  config.tables = settings.tables;
  config.sparse_optimizer = settings.sparse_optimizer;
  config.device = settings.device;
  config.seed = settings.seed;
  config.group = settings.group;
  if (!settings.plan_path.empty()) {
    absl::StatusOr<v1::ShardingPlan> plan =
        ReadShardingPlan(settings.plan_path);
    if (!plan.ok()) return plan.status();
    config.plan = *std::move(plan);
  }
  if (settings.model_kind == ModelKind::kDlrm) {
    absl::StatusOr<std::unique_ptr<Dlrm>> model = Dlrm::Create(config);
    if (!model.ok()) return model.status();
    return std::unique_ptr<RecModel>(*std::move(model));
  }
  absl::StatusOr<std::unique_ptr<SequenceModel>> model =
      SequenceModel::Create(config);
  if (!model.ok()) return model.status();
  return std::unique_ptr<RecModel>(*std::move(model));
}

// The data's global batches: world size x batch_size examples.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSource(
    const TrainerSettings& settings, uint64_t stream) {
  const int64_t global_batch = settings.batch_size * WorldSize(settings);
  if (settings.synthetic) {
    SyntheticOptions options = settings.synthetic_data;
    options.stream = stream;
    options.batch_size = global_batch;
    absl::StatusOr<std::unique_ptr<SyntheticSource>> source =
        SyntheticSource::Create(options);
    if (!source.ok()) return source.status();
    return std::unique_ptr<BatchSource>(*std::move(source));
  }
  CriteoOptions options = settings.criteo_data;
  options.batch_size = global_batch;
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(std::move(options));
  if (!source.ok()) return source.status();
  return std::unique_ptr<BatchSource>(*std::move(source));
}

// Host copies of the model's dense parameters, named as in checkpoints.
std::vector<std::pair<std::string, at::Tensor>> CopyDenseParameters(
    RecModel& model) {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (const auto& item : model.dense().named_parameters()) {
    parameters.emplace_back(
        item.key(), item.value().detach().to(at::kCPU, /*non_blocking=*/false,
                                             /*copy=*/true));
  }
  return parameters;
}

// The held-out synthetic stream: the training data's task, other draws.
constexpr uint64_t kEvalStream = 1;

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    TrainerSettings settings, std::function<void(const std::string&)> log) {
  std::unique_ptr<Trainer> trainer(new Trainer());
  trainer->settings_ = std::move(settings);
  trainer->log_ = std::move(log);
  const TrainerSettings& s = trainer->settings_;

  absl::StatusOr<std::unique_ptr<RecModel>> model = MakeModel(s);
  if (!model.ok()) return model.status();
  trainer->model_ = *std::move(model);
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> dense_optimizer =
      MakeDenseOptimizer(s.dense_optimizer, s.dense_learning_rate,
                         trainer->model_->dense().parameters());
  if (!dense_optimizer.ok()) return dense_optimizer.status();
  trainer->dense_optimizer_ = *std::move(dense_optimizer);

  if (s.group != nullptr && !trainer->settings_.service.db.empty()) {
    // Each rank snapshots its own tracker, in a database of its own; a
    // restart under another world size or plan finds none and starts its
    // trackers afresh (consumers resync from the restored tables).
    std::string plan;
    google::protobuf::TextFormat::PrintToString(
        trainer->model_->sharded_modules().at(0)->plan(), &plan);
    trainer->settings_.service.db = absl::StrFormat(
        "%s/db-rank-%05d-of-%05d-plan-%08x", s.checkpoint_dir, s.group->rank(),
        s.group->world_size(),
        crc32(0, reinterpret_cast<const Bytef*>(plan.data()), plan.size()));
  }
  absl::StatusOr<std::unique_ptr<BatchSource>> source = MakeSource(s, 0);
  if (!source.ok()) return source.status();
  if (s.group != nullptr) {
    auto ranks = std::make_unique<RankBatchSource>(*std::move(source), s.group,
                                                   s.batch_size, nullptr);
    trainer->rank_source_ = ranks.get();
    trainer->source_ = std::move(ranks);
  } else {
    trainer->source_ = *std::move(source);
  }
  // Held out: another synthetic stream, or the first batches of the data.
  std::unique_ptr<BatchSource> eval_source;
  if (s.synthetic) {
    absl::StatusOr<std::unique_ptr<BatchSource>> made =
        MakeSource(s, kEvalStream);
    if (!made.ok()) return made.status();
    eval_source = *std::move(made);
  }
  // The synthetic stream yields global batches, of which a rank takes its
  // share; the training source already yields this rank's share (and agrees
  // with the other ranks whether to go on).
  BatchSource& held_out = eval_source ? *eval_source : *trainer->source_;
  // All held in memory: more than it holds is ResourceExhausted (exit 1),
  // never an exception out of Create.
  absl::Status held = CatchTorchErrors([&]() -> absl::Status {
    for (int64_t b = 0; b < s.eval_batches; ++b) {
      absl::StatusOr<std::optional<Batch>> batch = held_out.Next();
      if (!batch.ok()) return batch.status();
      if (!batch->has_value()) break;
      Batch mine = **std::move(batch);
      if (s.group != nullptr && eval_source != nullptr) {
        absl::StatusOr<Batch> part = RankExamples(
            mine, s.group->rank(), s.group->world_size(), s.batch_size);
        if (!part.ok()) return part.status();
        mine = *std::move(part);
      }
      trainer->eval_batches_.push_back(mine.To(trainer->model_->device()));
    }
    return absl::OkStatus();
  });
  if (!held.ok()) {
    return absl::Status(held.code(),
                        absl::StrCat("the held-out batches: ", held.message()));
  }

  // Every rank's shards of the model: the tracker's tables and, with the
  // ranks' endpoints, the service's topology.
  ServiceTopology topology;
  if (s.tracking) {
    std::vector<EmbeddingModule*> modules =
        trainer->model_->embedding_modules();
    topology = DescribeTopology(
        s.group != nullptr ? s.group->rank() : 0, WorldSize(s),
        trainer->model_->sharded_modules(), modules, s.tracker.fqns_to_skip);
    // A sharded trainer records and serves global row IDs.
    const RowOffsets row_offsets =
        ShardRowOffsets(trainer->model_->sharded_modules());
    trainer->rows_reader_ =
        std::make_unique<ModuleRowsReader>(modules, row_offsets);
    trainer->rows_reader_->SetDenseParameters([model = trainer->model_.get()] {
      return CopyDenseParameters(*model);
    });
    TrackerOptions options = s.tracker;
    options.modules = DescribeModules(modules);
    options.log = trainer->log_;
    if (s.group != nullptr) {
      // A read of chosen tables goes to every rank; a rank answers a table
      // only other ranks hold with no rows.
      for (const ServiceTopology::Shard& shard : topology.shards) {
        options.model_fqns.push_back(shard.fqn);
      }
    }
    absl::StatusOr<std::unique_ptr<Tracker>> tracker =
        Tracker::Create(std::move(options), trainer->rows_reader_.get());
    if (!tracker.ok()) return tracker.status();
    trainer->tracker_ = *std::move(tracker);
    if (absl::Status status =
            AttachTracker(*trainer->tracker_, modules, row_offsets);
        !status.ok()) {
      return status;
    }
  }
  // The training thread is the tracker's one producer.
  trainer->settings_.service.network_producers = false;
  if (s.group != nullptr && s.tracking && s.serve) {
    // Fan-in reads are served at a step boundary every rank agrees on.
    trainer->step_cuts_ = std::make_unique<StepCuts>(/*stepping=*/true);
    trainer->settings_.service.step_cuts = trainer->step_cuts_.get();
    // No client may take this rank for the whole model before it knows the
    // other ranks (SetTopology below).
    trainer->settings_.service.topology_from_owner = true;
  }
  if (absl::Status status = trainer->RestoreOrStart(); !status.ok()) {
    return status;
  }
  if (trainer->host_ != nullptr) {
    // Topology: every rank's endpoint (through the c10d store) and shards.
    absl::StatusOr<std::vector<std::string>> endpoints =
        ExchangeEndpoints(s.group, ReachableAddress(trainer->host_->address()));
    if (!endpoints.ok()) return endpoints.status();
    topology.endpoints = *std::move(endpoints);
    trainer->host_->SetTopology(std::move(topology));
  }
  TrainPipelineParts parts;
  parts.model = trainer->model_.get();
  parts.dense_optimizer = trainer->dense_optimizer_.get();
  parts.rows_reader = trainer->rows_reader_.get();
  parts.tracker = trainer->tracker_.get();
  parts.group = s.group;
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
      MakeTrainPipeline(trainer->settings_.pipeline, parts);
  if (!pipeline.ok()) return pipeline.status();
  trainer->pipeline_ = *std::move(pipeline);
  if (absl::Status status = trainer->RestoreGradientScaler(); !status.ok()) {
    return status;
  }
  return trainer;
}

Trainer::~Trainer() { StopService(); }

void Trainer::StopService() {
  if (host_ != nullptr) host_->Shutdown();
}

std::string Trainer::service_address() const {
  return host_ != nullptr ? host_->address() : "";
}

absl::Status Trainer::SaveState() {
  if (settings_.checkpoint_dir.empty()) return absl::OkStatus();
  std::string line;
  if (step_ == checkpointed_step_) {
    // The final save right after a periodic one (or a run that trained
    // nothing after its restore): the checkpoint of this step is there.
    line = absl::StrCat("checkpoint of step ", step_, " already written");
  } else {
    const GradientScaler* scaler = pipeline_->gradient_scaler();
    absl::StatusOr<CheckpointInfo> saved = SaveCheckpoint(
        settings_.checkpoint_dir + "/checkpoints", step_, examples_, *model_,
        *dense_optimizer_, settings_.checkpoints_kept, settings_.group,
        scaler != nullptr ? scaler->StateTensors() : GradientScalerState());
    if (!saved.ok()) return saved.status();
    checkpointed_step_ = step_;
    line = absl::StrFormat("checkpoint %s (%.1f MiB in %.2f s)", saved->path,
                           saved->bytes / 1048576.0,
                           absl::ToDoubleSeconds(saved->elapsed));
  }
  if (snapshots_ != nullptr) {
    absl::StatusOr<SnapshotInfo> snapshot = snapshots_->Snapshot();
    if (!snapshot.ok()) return snapshot.status();
    absl::StrAppend(&line, "; tracker ", DescribeSnapshot(*snapshot));
  }
  log_(line);
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::GlobalLossSum() {
  if (settings_.group == nullptr) return loss_sum_.item<double>();
  // The ranks' losses are means over equal batches: their mean is the
  // global batch's.
  ProcessGroup& group = *settings_.group;
  at::Tensor sum =
      loss_sum_.to(group.device(), at::kDouble).reshape({1}).clone();
  if (absl::Status status = group.AllReduceSum(sum, "progress.loss");
      !status.ok()) {
    return status;
  }
  return sum.item<double>() / group.world_size();
}

absl::StatusOr<double> Trainer::Evaluate() {
  std::vector<at::Tensor> scores, labels;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (const Batch& batch : eval_batches_) {
      absl::StatusOr<at::Tensor> logits = model_->Forward(batch);
      if (!logits.ok()) return logits.status();
      scores.push_back(logits->cpu());
      labels.push_back(batch.labels.cpu());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  at::Tensor all_scores = at::cat(scores), all_labels = at::cat(labels);
  if (settings_.group != nullptr) {
    // Every rank's examples: the same AUC as one process of the global batch.
    ProcessGroup& group = *settings_.group;
    at::Tensor both =
        at::stack({all_scores.to(at::kFloat), all_labels.to(at::kFloat)}, 1)
            .to(group.device())
            .contiguous();
    at::Tensor gathered =
        at::empty({both.size(0) * group.world_size(), 2}, both.options());
    if (absl::Status gathered_status =
            group.AllGather(both, gathered, "eval.scores");
        !gathered_status.ok()) {
      return gathered_status;
    }
    gathered = gathered.cpu();
    all_scores = gathered.select(1, 0);
    all_labels = gathered.select(1, 1);
  }
  return Auc(all_scores, all_labels);
}

bool Trainer::StopAgreed(const std::atomic<bool>& stop) const {
  // Several ranks: the agreement's answer alone. A signal that reaches one
  // rank after the ranks agreed to end (the data's end) must not make that
  // rank alone report a stop (its exit code then differs from the others').
  if (rank_source_ != nullptr) return rank_source_->stop_requested();
  return stop.load();
}

absl::Status Trainer::ServeCuts() {
  if (step_cuts_ == nullptr) return absl::OkStatus();
  absl::StatusOr<int> served =
      ServeAgreedCuts(*step_cuts_, *settings_.group, kCutHoldLimit);
  return served.status();
}

absl::StatusOr<TrainerProgress> Trainer::Run(const std::atomic<bool>& stop,
                                             int64_t steps) {
  TrainerProgress progress;
  const absl::Time start = absl::Now();
  absl::Time last_line = start, last_save = start;
  bool save_due = false;
  int64_t examples_at_last_line = 0;
  auto report = [&]() -> absl::Status {
    const absl::Time now = absl::Now();
    progress.step = step_;
    progress.elapsed = now - start;
    const double seconds = absl::ToDoubleSeconds(now - last_line);
    progress.examples_per_second =
        seconds > 0
            ? (progress.examples_this_run - examples_at_last_line) / seconds
            : 0;
    if (loss_count_ > 0) {
      absl::StatusOr<double> loss = GlobalLossSum();
      if (!loss.ok()) return loss.status();
      progress.loss = *loss / loss_count_;
      reported_loss_ = progress.loss;
    }
    loss_sum_ = at::Tensor();
    loss_count_ = 0;
    std::string line =
        absl::StrFormat("step %d | %.0f ex/s | loss %.4f", progress.step,
                        progress.examples_per_second, progress.loss);
    if (!eval_batches_.empty()) {  // the same on every rank
      absl::StatusOr<double> auc = Evaluate();
      if (!auc.ok()) return auc.status();
      progress.eval_auc = *auc;
      absl::StrAppendFormat(&line, " | eval auc %.4f", *auc);
    }
    if (tracker_ != nullptr) {
      const TrackerStatus status = tracker_->Status();
      absl::StrAppendFormat(&line, " | tracker batch %d, %d ids, %.1f MiB",
                            status.current_batch, status.usage.total.ids,
                            status.usage.total.bytes / 1048576.0);
    }
    log_(line);
    last_line = now;
    examples_at_last_line = progress.examples_this_run;
    return absl::OkStatus();
  };

  const TrainerSettings& s = settings_;
  // Several ranks stop at the step they agree on (RankBatchSource), never
  // on a signal one rank saw first.
  if (rank_source_ != nullptr) rank_source_->set_stop(&stop);
  // Cuts wait for the step boundaries of this run; once the ranks stop
  // together (or the run failed) they are read at once.
  if (step_cuts_ != nullptr) step_cuts_->SetStepping(true);
  absl::Cleanup cuts_at_once = [this] {
    if (step_cuts_ != nullptr) step_cuts_->SetStepping(false);
  };
  if (absl::Status status = ServeCuts(); !status.ok()) return status;
  auto stopping = [&] { return rank_source_ == nullptr && stop.load(); };
  while (steps < 0 || progress.steps_this_run < steps) {
    // A run's last step ends the open accumulation window, so that its final
    // checkpoint holds every step it counts: the step budget's last, or, on
    // a stop request inside a window, one more. (Ranks stop at the data's
    // end, which ends the window.)
    if (stopping()) {
      if (pipeline_->stats().window_position == 0) break;
      pipeline_->EndWindowAtNextStep();
    }
    if (steps >= 0 && progress.steps_this_run + 1 == steps) {
      pipeline_->EndWindowAtNextStep();
    }
    const absl::Time step_start = absl::Now();
    absl::StatusOr<std::optional<TrainedStep>> trained =
        pipeline_->Progress(*source_);
    if (!trained.ok()) {
      return absl::Status(
          trained.status().code(),
          absl::StrCat("step ", step_ + 1, ": ", trained.status().message()));
    }
    if (!trained->has_value()) {
      if (step_ == 0 && !StopAgreed(stop)) {
        // Not a run that reached the data's end: one with no data at all.
        return absl::FailedPreconditionError(
            "the training data holds no batch: nothing to train");
      }
      if (!StopAgreed(stop)) {
        log_(absl::StrCat("data ended after step ", step_));
      }
      break;
    }
    const TrainedStep& done = **trained;
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + done.loss : done.loss;
    ++loss_count_;
    ++step_;
    // Every rank's examples.
    const int64_t examples = done.examples * WorldSize(s);
    examples_ += examples;
    ++progress.steps_this_run;
    progress.examples_this_run += examples;
    if (s.metrics != nullptr) {
      // This rank's examples: Prometheus sums the ranks'.
      s.metrics->ObserveStep(step_,
                             absl::ToDoubleSeconds(absl::Now() - step_start),
                             done.examples, reported_loss_);
    }
    if (absl::Status status = ServeCuts(); !status.ok()) return status;
    if (s.log_every_steps > 0 && step_ % s.log_every_steps == 0) {
      if (absl::Status status = report(); !status.ok()) return status;
    }
    const bool save_by_steps =
        s.checkpoint_every_steps > 0 && step_ % s.checkpoint_every_steps == 0;
    bool save_by_time =
        s.checkpoint_every_seconds > 0 &&
        absl::Now() - last_save >= absl::Seconds(s.checkpoint_every_seconds);
    if (s.checkpoint_every_seconds > 0 && s.group != nullptr) {
      // Saving is a collective: the ranks' clocks must not decide apart.
      absl::StatusOr<int64_t> none_due =
          s.group->AllReduceMin(save_by_time ? 0 : 1, "checkpoint.due");
      if (!none_due.ok()) return none_due.status();
      save_by_time = *none_due == 0;
    }
    save_due = save_due || save_by_steps || save_by_time;
    // Checkpoints hold applied steps only: with gradient accumulation, the
    // save waits for the end of the open window.
    if (save_due && pipeline_->stats().window_position == 0) {
      if (absl::Status status = SaveState(); !status.ok()) return status;
      last_save = absl::Now();
      save_due = false;
    }
  }
  if (rank_source_ != nullptr) rank_source_->set_stop(nullptr);
  // Every rank left the loop after the same step: reads need no cut now.
  std::move(cuts_at_once).Invoke();
  if (StopAgreed(stop)) {
    log_(absl::StrCat("stop requested at step ", step_));
    progress.stopped = steps < 0 || progress.steps_this_run < steps;
  }
  if (loss_count_ > 0 || progress.steps_this_run == 0) {
    if (absl::Status status = report(); !status.ok()) return status;
  }
  if (absl::Status status = SaveState(); !status.ok()) return status;
  if (host_ != nullptr && settings_.drain_seconds > 0) {
    DrainConsumers(*tracker_, absl::Seconds(settings_.drain_seconds), log_);
  }
  progress.step = step_;
  progress.elapsed = absl::Now() - start;
  return progress;
}

}  // namespace deltastream
