#include "trainer/trainer.h"

#include <torch/torch.h>

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/torch_status.h"
#include "clients/checkpoint_chain.h"
#include "trainer/checkpoint.h"
#include "trainer/data/criteo_tsv.h"
#include "trainer/data/synthetic.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/metrics.h"
#include "trainer/models/sequence_model.h"

namespace deltastream {
namespace {

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

std::unique_ptr<torch::optim::Optimizer> MakeDenseOptimizer(
    const TrainerSettings& settings, torch::nn::Module& dense) {
  std::vector<at::Tensor> parameters = dense.parameters();
  const double lr = settings.dense_learning_rate;
  if (settings.dense_optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(parameters,
                                               torch::optim::SGDOptions(lr));
  }
  if (settings.dense_optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(parameters,
                                                torch::optim::AdamOptions(lr));
  }
  return std::make_unique<torch::optim::Adagrad>(
      parameters, torch::optim::AdagradOptions(lr));
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeSource(
    const TrainerSettings& settings, uint64_t stream) {
  if (settings.synthetic) {
    SyntheticOptions options = settings.synthetic_data;
    options.stream = stream;
    absl::StatusOr<std::unique_ptr<SyntheticSource>> source =
        SyntheticSource::Create(options);
    if (!source.ok()) return source.status();
    return std::unique_ptr<BatchSource>(*std::move(source));
  }
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(settings.criteo_data);
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
  trainer->dense_optimizer_ = MakeDenseOptimizer(s, trainer->model_->dense());

  absl::StatusOr<std::unique_ptr<BatchSource>> source = MakeSource(s, 0);
  if (!source.ok()) return source.status();
  trainer->source_ = *std::move(source);
  // Held out: another synthetic stream, or the first batches of the data.
  std::unique_ptr<BatchSource> eval_source;
  if (s.synthetic) {
    absl::StatusOr<std::unique_ptr<BatchSource>> made =
        MakeSource(s, kEvalStream);
    if (!made.ok()) return made.status();
    eval_source = *std::move(made);
  }
  BatchSource& held_out = eval_source ? *eval_source : *trainer->source_;
  for (int64_t b = 0; b < s.eval_batches; ++b) {
    absl::StatusOr<std::optional<Batch>> batch = held_out.Next();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) break;
    trainer->eval_batches_.push_back((*batch)->To(trainer->model_->device()));
  }

  if (s.tracking) {
    std::vector<EmbeddingModule*> modules =
        trainer->model_->embedding_modules();
    trainer->rows_reader_ = std::make_unique<ModuleRowsReader>(modules);
    trainer->rows_reader_->SetDenseParameters([model = trainer->model_.get()] {
      return CopyDenseParameters(*model);
    });
    TrackerOptions options = s.tracker;
    options.modules = DescribeModules(modules);
    absl::StatusOr<std::unique_ptr<Tracker>> tracker =
        Tracker::Create(std::move(options), trainer->rows_reader_.get());
    if (!tracker.ok()) return tracker.status();
    trainer->tracker_ = *std::move(tracker);
    if (absl::Status status = AttachTracker(*trainer->tracker_, modules);
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = trainer->RestoreOrStart(); !status.ok()) {
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

absl::Status Trainer::RestoreOrStart() {
  const TrainerSettings& s = settings_;
  std::optional<std::string> checkpoint;
  if (!s.checkpoint_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(s.checkpoint_dir, error);
    if (error) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot create '", s.checkpoint_dir, "': ", error.message()));
    }
    checkpoint = LatestCheckpoint(s.checkpoint_dir + "/checkpoints");
  }
  bool from_chain = false;
  if (checkpoint.has_value()) {
    absl::StatusOr<CheckpointInfo> loaded =
        LoadCheckpoint(*checkpoint, *model_, *dense_optimizer_);
    if (!loaded.ok()) return loaded.status();
    step_ = loaded->step;
    examples_ = loaded->examples;
    log_(absl::StrFormat("restored checkpoint %s (step %d, %.1f MiB in %.2f s)",
                         loaded->path, loaded->step, loaded->bytes / 1048576.0,
                         absl::ToDoubleSeconds(loaded->elapsed)));
  } else if (!s.restore_chain.empty()) {
    if (absl::Status status = RestoreFromChain(); !status.ok()) return status;
    from_chain = true;
  }
  if (step_ > 0) {
    // The data resumes where the checkpoint's training stopped.
    for (int64_t b = 0; b < step_; ++b) {
      absl::StatusOr<std::optional<Batch>> skipped = source_->Next();
      if (!skipped.ok()) return skipped.status();
      if (!skipped->has_value()) break;
    }
  }
  if (tracker_ == nullptr) return absl::OkStatus();

  // Tracker snapshots: the service's database, or one of our own.
  if (s.serve) {
    absl::StatusOr<std::unique_ptr<ServiceHost>> host =
        ServiceHost::Start(tracker_.get(), s.service, /*restore=*/true);
    if (!host.ok()) return host.status();
    host_ = *std::move(host);
    snapshots_ = host_->snapshots();
    if (host_->restored().has_value()) {
      log_(absl::StrCat("restored tracker ",
                        DescribeSnapshot(*host_->restored())));
    }
  } else if (!s.service.db.empty()) {
    absl::StatusOr<std::unique_ptr<TrackerSnapshots>> opened =
        TrackerSnapshots::Open(s.service.db, tracker_.get());
    if (!opened.ok()) return opened.status();
    own_snapshots_ = *std::move(opened);
    snapshots_ = own_snapshots_.get();
    absl::StatusOr<std::optional<SnapshotInfo>> restored =
        snapshots_->Restore();
    if (!restored.ok()) return restored.status();
    if (restored->has_value()) {
      log_(absl::StrCat("restored tracker ", DescribeSnapshot(**restored)));
    }
  }
  // Snapshots and checkpoints are written together, so their steps agree;
  // a tracker ahead of or behind the model (a crash between the two writes)
  // is reported, and the tracker's batch follows the model's steps from here.
  const int64_t batch = tracker_->current_batch();
  if (from_chain && batch < step_) {
    // A fresh tracker: its batches follow the model's steps.
    while (tracker_->current_batch() < step_) tracker_->Step();
  } else if (batch != step_) {
    // Changes of steps between the two were never recorded (or recorded but
    // lost with the model): no delta can carry them.
    log_(absl::StrFormat(
        "warning: tracker snapshot is at batch %d but the model at step %d; "
        "the tracker did not record steps %d..%d: every consumer is told to "
        "resync",
        batch, step_, std::min(batch, step_), std::max(batch, step_) - 1));
    tracker_->RequireResync();
    while (tracker_->current_batch() < step_) tracker_->Step();
  }
  // Consumers that hold rows of later steps (from before a crash) hold
  // changes this run lost: deltas tell them where this run starts.
  tracker_->MarkRunStart(std::min(batch, step_));
  return absl::OkStatus();
}

absl::Status Trainer::RestoreFromChain() {
  const std::string& dir = settings_.restore_chain;
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadedChain> chain = LoadChain(dir);
  if (!chain.ok()) {
    return absl::Status(
        chain.status().code(),
        absl::StrCat("restore_chain '", dir, "': ", chain.status().message()));
  }
  // Tables by FQN, as the tracker names them.
  std::map<std::string, std::pair<EmbeddingModule*, int64_t>> tables;
  for (EmbeddingModule* module : model_->embedding_modules()) {
    for (size_t t = 0; t < module->tables().size(); ++t) {
      tables[CleanFqn(module->TableFqn(t))] = {module, static_cast<int64_t>(t)};
    }
  }
  int64_t rows = 0;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (const auto& [fqn, table] : chain->tables) {
      auto it = tables.find(fqn);
      if (it == tables.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("restore_chain '", dir, "' holds table '", fqn,
                         "', which this model does not have"));
      }
      const at::Tensor& weight = it->second.first->weight(it->second.second);
      if (table.ids.numel() == 0) continue;
      if (table.values.dim() != 2 || table.values.size(1) != weight.size(1) ||
          table.ids.max().item<int64_t>() >= weight.size(0) ||
          table.ids.min().item<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "restore_chain '", dir, "': table '", fqn, "' of ", weight.size(0),
            " x ", weight.size(1), " does not fit the chain's rows (",
            c10::str(table.values.sizes()), ", IDs up to ",
            table.ids.max().item<int64_t>(), ")"));
      }
      weight.index_copy_(0, table.ids.to(weight.device()),
                         table.values.to(weight.device(), weight.dtype()));
      rows += table.ids.numel();
    }
    if (chain->dense_batch == chain->end_batch) {
      std::map<std::string, at::Tensor> dense(chain->dense.begin(),
                                              chain->dense.end());
      for (auto& item : model_->dense().named_parameters()) {
        auto it = dense.find(item.key());
        if (it == dense.end() ||
            !it->second.sizes().equals(item.value().sizes())) {
          return absl::InvalidArgumentError(
              absl::StrCat("restore_chain '", dir, "': dense parameter '",
                           item.key(), "' is missing or has another shape"));
        }
        item.value().copy_(it->second);
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  step_ = chain->end_batch;
  log_(absl::StrFormat(
      "restored checkpoint chain %s: %d links through batch %d, %d rows%s, in "
      "%.2f s; optimizer states start fresh",
      dir, chain->links.size(), chain->end_batch, rows,
      chain->dense_batch == chain->end_batch
          ? " and the dense parameters"
          : " (no dense parameters at its end: they start fresh)",
      absl::ToDoubleSeconds(absl::Now() - start)));
  return absl::OkStatus();
}

void Trainer::DrainConsumers() {
  if (host_ == nullptr || settings_.drain_seconds <= 0) return;
  const absl::Time deadline =
      absl::Now() + absl::Seconds(settings_.drain_seconds);
  std::vector<std::string> behind;
  do {
    behind.clear();
    const TrackerStatus status = tracker_->Status();
    for (const ConsumerStatus& consumer : status.consumers) {
      if (consumer.cursor < status.current_batch ||
          consumer.pending_end.has_value()) {
        behind.push_back(absl::StrCat(consumer.name, " at batch ",
                                      std::max<int64_t>(consumer.cursor, 0)));
      }
    }
    if (behind.empty()) {
      log_(absl::StrCat("drained: every consumer has read through batch ",
                        status.current_batch));
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  log_(absl::StrCat("drain ended after ", settings_.drain_seconds,
                    " s with consumers behind: ", absl::StrJoin(behind, ", ")));
}

absl::Status Trainer::SaveState() {
  if (settings_.checkpoint_dir.empty()) return absl::OkStatus();
  absl::StatusOr<CheckpointInfo> saved = SaveCheckpoint(
      settings_.checkpoint_dir + "/checkpoints", step_, examples_, *model_,
      *dense_optimizer_, settings_.checkpoints_kept);
  if (!saved.ok()) return saved.status();
  std::string line = absl::StrFormat("checkpoint %s (%.1f MiB in %.2f s)",
                                     saved->path, saved->bytes / 1048576.0,
                                     absl::ToDoubleSeconds(saved->elapsed));
  if (snapshots_ != nullptr) {
    absl::StatusOr<SnapshotInfo> snapshot = snapshots_->Snapshot();
    if (!snapshot.ok()) return snapshot.status();
    absl::StrAppend(&line, "; tracker ", DescribeSnapshot(*snapshot));
  }
  log_(line);
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (eval_batches_.empty()) return 0.5;
  std::vector<at::Tensor> scores, labels;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (const Batch& batch : eval_batches_) {
      absl::StatusOr<at::Tensor> logits = model_->Forward(batch);
      if (!logits.ok()) return logits.status();
      scores.push_back(logits->cpu());
      labels.push_back(batch.labels.cpu());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return Auc(at::cat(scores), at::cat(labels));
}

absl::Status Trainer::TrainStep(Batch batch) {
  return CatchTorchErrors([&]() -> absl::Status {
    absl::StatusOr<at::Tensor> logits = model_->Forward(batch);
    if (!logits.ok()) return logits.status();
    at::Tensor loss = BinaryCrossEntropyWithLogits(*logits, batch.labels);
    {
      // Rows, dense parameters and the batch index change together: a read
      // (which pins the rows) sees the model after a whole step or before it.
      std::optional<ModuleRowsReader::UpdateGuard> guard;
      if (rows_reader_ != nullptr) guard.emplace(*rows_reader_);
      dense_optimizer_->zero_grad();
      loss.backward();
      dense_optimizer_->step();
      if (tracker_ != nullptr) tracker_->Step();
    }
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
    ++loss_count_;
    ++step_;
    examples_ += batch.size();
    return absl::OkStatus();
  });
}

absl::StatusOr<TrainerProgress> Trainer::Run(const std::atomic<bool>& stop,
                                             int64_t steps) {
  TrainerProgress progress;
  const absl::Time start = absl::Now();
  absl::Time last_line = start, last_save = start;
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
      progress.loss = loss_sum_.item<double>() / loss_count_;
    }
    loss_sum_ = at::Tensor();
    loss_count_ = 0;
    absl::StatusOr<double> auc = Evaluate();
    if (!auc.ok()) return auc.status();
    progress.eval_auc = *auc;
    std::string line = absl::StrFormat(
        "step %d | %.0f ex/s | loss %.4f | eval auc %.4f", progress.step,
        progress.examples_per_second, progress.loss, *auc);
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
  while (!stop.load() && (steps < 0 || progress.steps_this_run < steps)) {
    absl::StatusOr<std::optional<Batch>> next = source_->Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) {
      log_(absl::StrCat("data ended after step ", step_));
      break;
    }
    const int64_t batch_size = (*next)->size();
    if (absl::Status status = TrainStep((*next)->To(model_->device()));
        !status.ok()) {
      return absl::Status(status.code(), absl::StrCat("step ", step_ + 1, ": ",
                                                      status.message()));
    }
    ++progress.steps_this_run;
    progress.examples_this_run += batch_size;
    if (s.log_every_steps > 0 && step_ % s.log_every_steps == 0) {
      if (absl::Status status = report(); !status.ok()) return status;
    }
    const bool save_by_steps =
        s.checkpoint_every_steps > 0 && step_ % s.checkpoint_every_steps == 0;
    const bool save_by_time =
        s.checkpoint_every_seconds > 0 &&
        absl::Now() - last_save >= absl::Seconds(s.checkpoint_every_seconds);
    if (save_by_steps || save_by_time) {
      if (absl::Status status = SaveState(); !status.ok()) return status;
      last_save = absl::Now();
    }
  }
  if (stop.load()) log_(absl::StrCat("stop requested at step ", step_));
  if (loss_count_ > 0 || progress.steps_this_run == 0) {
    if (absl::Status status = report(); !status.ok()) return status;
  }
  if (absl::Status status = SaveState(); !status.ok()) return status;
  DrainConsumers();
  progress.step = step_;
  progress.elapsed = absl::Now() - start;
  return progress;
}

}  // namespace deltastream
