// Trainer's restore at start: the latest checkpoint of the checkpoint dir,
// else a checkpoint chain (settings.restore_chain); the data fast-forwarded
// past the restored steps; the tracker's snapshots opened and restored, and
// its batch index brought in line with the model's step.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/torch_status.h"
#include "store/checkpoint_chain.h"
#include "trainer/checkpoint.h"
#include "trainer/comm/process_group.h"
#include "trainer/cursor_agreement.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/trainer.h"

namespace deltastream {
namespace {

// The lowest and the highest of every rank's `mine`: what the ranks must
// agree on (a step to restore) is one value when the two are equal.
struct Spread {
  int64_t lowest, highest;
};
absl::StatusOr<Spread> SpreadOverRanks(ProcessGroup& group, int64_t mine,
                                       absl::string_view label) {
  absl::StatusOr<int64_t> lowest = group.AllReduceMin(mine, label);
  if (!lowest.ok()) return lowest.status();
  absl::StatusOr<int64_t> highest = group.AllReduceMin(-mine, label);
  if (!highest.ok()) return highest.status();
  return Spread{*lowest, -*highest};
}

}  // namespace

absl::Status Trainer::RestoreOrStart() {
  const TrainerSettings& s = settings_;
  std::optional<std::string> checkpoint;
  if (!s.checkpoint_dir.empty()) {
    // The checkpoints' directory too, now: one that cannot be made (a file
    // in its place) must stop the run before it trains, not at its first
    // checkpoint.
    for (const std::string& dir :
         {s.checkpoint_dir, s.checkpoint_dir + "/checkpoints"}) {
      std::error_code error;
      std::filesystem::create_directories(dir, error);
      if (error) {
        return absl::ErrnoToStatus(error.value(),
                                   absl::StrCat("cannot create '", dir, "'"));
      }
      if (!std::filesystem::is_directory(dir)) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot create '", dir, "': a file is in its place"));
      }
    }
    absl::StatusOr<std::optional<std::string>> latest =
        LatestCheckpoint(s.checkpoint_dir + "/checkpoints");
    if (latest.ok()) checkpoint = *latest;
    if (s.group == nullptr && !latest.ok()) return latest.status();
    if (s.group != nullptr) {
      // Every rank restores the same step: the newest that all of them
      // saved (a checkpoint is complete only once every rank's file is).
      // A rank that cannot list them says so (kUnlisted) rather than
      // leave the others waiting.
      constexpr int64_t kNone = -1;
      constexpr int64_t kUnlisted = -2;
      const int64_t mine = !latest.ok() ? kUnlisted
                           : checkpoint.has_value()
                               ? CheckpointStep(*checkpoint).value_or(kNone)
                               : kNone;
      absl::StatusOr<Spread> steps =
          SpreadOverRanks(*s.group, mine, "restore.checkpoint_step");
      if (!steps.ok()) return steps.status();
      if (!latest.ok()) return latest.status();
      // Another rank's failure, refused or not by that rank's own exit
      // code: here it is one a restart may not meet (StartFailureExitCode).
      if (steps->lowest == kUnlisted) {
        return absl::UnavailableError(absl::StrFormat(
            "another rank cannot list the checkpoints in '%s/checkpoints'",
            s.checkpoint_dir));
      }
      if (steps->lowest != steps->highest) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "the ranks see different checkpoints in '%s' (steps %d to %d): "
            "the checkpoint dir must be one directory every rank sees",
            s.checkpoint_dir, steps->lowest, steps->highest));
      }
    }
  }
  bool from_chain = false;
  if (checkpoint.has_value()) {
    absl::StatusOr<CheckpointInfo> loaded =
        LoadCheckpoint(*checkpoint, *model_, *dense_optimizer_, s.group);
    if (!loaded.ok()) return loaded.status();
    step_ = loaded->step;
    examples_ = loaded->examples;
    checkpointed_step_ = loaded->step;
    restored_checkpoint_ = loaded->path;
    restored_scaler_state_ = std::move(loaded->gradient_scaler_state);
    log_(absl::StrFormat("restored checkpoint %s (step %d, %.1f MiB in %.2f s)",
                         loaded->path, loaded->step, loaded->bytes / 1048576.0,
                         absl::ToDoubleSeconds(loaded->elapsed)));
  } else if (!s.restore_chain.empty()) {
    const absl::Status restored = RestoreFromChain();
    if (s.group != nullptr) {
      // Every rank starts at the same batch: the end of a chain every rank
      // loaded. A rank that cannot load it says so (-1) rather than leave
      // the others waiting.
      absl::StatusOr<Spread> ends = SpreadOverRanks(
          *s.group, restored.ok() ? step_ : -1, "restore.chain_end");
      if (!ends.ok()) return ends.status();
      if (!restored.ok()) return restored;
      if (ends->lowest < 0) {  // as kUnlisted above
        return absl::UnavailableError(absl::StrFormat(
            "another rank cannot load the checkpoint chain '%s'",
            s.restore_chain));
      }
      if (ends->lowest != ends->highest) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "the ranks loaded checkpoint chains from '%s' that end at "
            "different batches (%d and %d): the chain must be one directory "
            "every rank sees",
            s.restore_chain, ends->lowest, ends->highest));
      }
    } else if (!restored.ok()) {
      return restored;
    }
    from_chain = true;
  }
  if (step_ > 0) {
    // The data resumes where the checkpoint's training stopped (at no cost
    // for synthetic data, which jumps ahead; a file is read up to there).
    absl::StatusOr<int64_t> skipped = source_->Skip(step_);
    if (!skipped.ok()) return skipped.status();
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
    // The tracker (fresh, or a snapshot older than the chain) did not record
    // the changes the chain brought into the model: its batches follow the
    // model's steps, and consumers that had not read through the chain's end
    // are told to resync (below, once the ranks agreed on the cursors).
    log_(absl::StrFormat(
        "the model is at the chain's end batch %d but the tracker at batch "
        "%d: it did not record steps %d..%d, consumers that had not read "
        "through them are told to resync",
        step_, batch, batch, step_ - 1));
    while (tracker_->current_batch() < step_) tracker_->Step();
  } else if (batch > step_) {
    // Lookups of steps the model lost: their recorded rows are not the
    // model's any more.
    // They are dropped and the tracker's batches restart at the model's
    // step (a consumer version is a model step: verify_model compares them);
    // cursors past it come back to it.
    log_(absl::StrFormat(
        "warning: tracker snapshot is at batch %d but the model at step %d; "
        "the tracker recorded steps %d..%d that this run trains again: they "
        "are dropped, its batches restart at %d and every consumer is told to "
        "resync",
        batch, step_, step_, batch - 1, step_));
    TrackerState rewound = tracker_->SaveConsumers();
    rewound.current_batch = step_;
    rewound.compact_index = step_;
    for (ConsumerState& consumer : rewound.consumers) {
      consumer.cursor = std::min(consumer.cursor, step_);
      for (auto& [fqn, cursor] : consumer.table_cursors) {
        cursor = std::min(cursor, step_);
      }
      consumer.pending_reads.clear();
    }
    if (absl::Status status = tracker_->RestoreState(std::move(rewound));
        !status.ok()) {
      return status;
    }
    tracker_->RequireResync();
  } else if (batch < step_) {
    // Changes of steps between the two were never recorded: a consumer
    // that had not read through them is told to resync (below, once the
    // ranks agreed on the cursors).
    log_(absl::StrFormat(
        "warning: tracker snapshot is at batch %d but the model at step %d; "
        "the tracker did not record steps %d..%d: consumers that had not "
        "read through them are told to resync",
        batch, step_, batch, step_ - 1));
    while (tracker_->current_batch() < step_) tracker_->Step();
  }
  // Consumers that hold rows of later steps (from before a crash) hold
  // changes this run lost: deltas tell them where this run starts, the
  // model's step. Batches before it are the model's history even when the
  // tracker holds fewer of them (a snapshot behind the model, or none for
  // this plan: a resharded restart); those who lack some resync (below).
  tracker_->MarkRunStart(step_);
  if (s.group != nullptr && s.group->world_size() > 1) {
    // A commit (or read, or new consumer) may have reached some ranks before
    // their snapshot and others after: every rank takes the agreed cursors
    // before it steps and before Topology lets a client read
    // (trainer/cursor_agreement.h).
    absl::StatusOr<CursorAgreement> agreed = AgreeCursors(*tracker_, *s.group);
    if (!agreed.ok()) return agreed.status();
    if (agreed->moved + agreed->added + agreed->resync > 0) {
      log_(DescribeCursorAgreement(*agreed, s.group->world_size()));
    }
  }
  // After the agreement: a rank whose tracker is behind (it died between
  // its checkpoint and its snapshot, or the model came from a chain) lacks
  // those steps for a consumer only when the consumer's agreed cursor lies
  // before them.
  if (batch < step_) tracker_->RequireResyncBefore(step_);
  return absl::OkStatus();
}

absl::Status Trainer::RestoreGradientScaler() {
  std::vector<std::pair<std::string, at::Tensor>> state =
      std::move(restored_scaler_state_);
  restored_scaler_state_.clear();
  GradientScaler* scaler = pipeline_->gradient_scaler();
  if (scaler == nullptr || state.empty()) {
    // Without mixed precision a saved scale has nothing to apply to; a
    // checkpoint without one (saved without mixed precision, or before
    // scales were saved) leaves the scaler at its initial scale.
    if (!state.empty()) {
      log_(
          absl::StrFormat("checkpoint %s: its loss scale is not used "
                          "(mixed precision is off)",
                          restored_checkpoint_));
    }
    return absl::OkStatus();
  }
  if (absl::Status status = scaler->LoadStateTensors(state); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", restored_checkpoint_, ": ", status.message()));
  }
  log_(absl::StrFormat("restored loss scale %g from checkpoint %s",
                       scaler->scale(), restored_checkpoint_));
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
  // Tables by FQN, as the tracker names them, with the block of the global
  // table each holds (sharded: this rank's shards; else whole tables).
  struct Block {
    EmbeddingModule* module;
    int64_t table;
    int64_t row_offset = 0, col_offset = 0;
  };
  std::map<std::string, Block> tables;
  for (EmbeddingModule* module : model_->embedding_modules()) {
    for (size_t t = 0; t < module->tables().size(); ++t) {
      tables[CleanFqn(module->TableFqn(t))] = {module, static_cast<int64_t>(t)};
    }
  }
  for (ShardedEmbeddingModule* sharded : model_->sharded_modules()) {
    const std::vector<EmbeddingShard>& shards = sharded->local_shards();
    EmbeddingModule* local = sharded->local_module();
    for (size_t t = 0; local != nullptr && t < shards.size(); ++t) {
      Block& block = tables[CleanFqn(local->TableFqn(t))];
      block.row_offset = shards[t].row_offset;
      block.col_offset = shards[t].col_offset;
    }
  }
  // Every table's global shape (rows, columns) by FQN, sharded or not: the
  // chain's rows must fit it before a rank takes its block of them, or rows
  // and columns no block holds would be dropped without a word. A sharded
  // table no shard of this rank holds is in no Block: the chain's rows of
  // it are other ranks' to restore.
  std::map<std::string, std::pair<int64_t, int64_t>> global;
  for (const auto& [fqn, block] : tables) {
    const at::Tensor& weight = block.module->weight(block.table);
    global[fqn] = {weight.size(0), weight.size(1)};
  }
  for (ShardedEmbeddingModule* sharded : model_->sharded_modules()) {
    for (const EmbeddingShard& shard : sharded->shards()) {
      const EmbeddingTableConfig& config = sharded->tables()[shard.table_index];
      global[CleanFqn(absl::StrCat(
          sharded->path(),
          sharded->pooled() ? ".embedding_bags." : ".embeddings.",
          shard.table))] = {config.num_embeddings, config.embedding_dim};
    }
  }
  int64_t rows = 0;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (const auto& [fqn, table] : chain->tables) {
      auto shape = global.find(fqn);
      if (shape == global.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("restore_chain '", dir, "' holds table '", fqn,
                         "', which this model does not have"));
      }
      if (table.ids.numel() == 0) continue;
      const auto [global_rows, global_cols] = shape->second;
      if (table.values.dim() != 2 || table.values.size(1) != global_cols ||
          table.ids.max().item<int64_t>() >= global_rows ||
          table.ids.min().item<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "restore_chain '", dir, "': table '", fqn, "' of ", global_rows,
            " x ", global_cols, " does not fit the chain's rows (",
            c10::str(table.values.sizes()), ", IDs ",
            table.ids.min().item<int64_t>(), " to ",
            table.ids.max().item<int64_t>(), ")"));
      }
      auto it = tables.find(fqn);
      if (it == tables.end()) continue;  // another rank's
      const Block& block = it->second;
      const at::Tensor& weight = block.module->weight(block.table);
      // This block's rows and columns of the chain's (global) rows.
      at::Tensor ids = table.ids, values = table.values;
      if (weight.size(0) != global_rows || weight.size(1) != global_cols) {
        const at::Tensor mine =
            (ids >= block.row_offset)
                .logical_and(ids < block.row_offset + weight.size(0))
                .nonzero()
                .squeeze(1);
        ids = ids.index_select(0, mine) - block.row_offset;
        values = values.index_select(0, mine).narrow(1, block.col_offset,
                                                     weight.size(1));
        if (ids.numel() == 0) continue;
      }
      weight.index_copy_(0, ids.to(weight.device()),
                         values.to(weight.device(), weight.dtype()));
      rows += ids.numel();
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

}  // namespace deltastream
