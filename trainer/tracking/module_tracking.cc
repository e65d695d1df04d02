#include "trainer/tracking/module_tracking.h"

#include <ATen/ATen.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

std::vector<TrackedModule> DescribeModules(
    absl::Span<EmbeddingModule* const> modules) {
  std::vector<TrackedModule> described;
  for (const EmbeddingModule* module : modules) {
    TrackedModule tracked{module->path(), module->pooled(), {}};
    for (const EmbeddingTableConfig& table : module->tables()) {
      tracked.tables.push_back({table.name, table.feature_names});
    }
    described.push_back(std::move(tracked));
  }
  return described;
}

absl::Status AttachTracker(Tracker& tracker,
                           absl::Span<EmbeddingModule* const> modules,
                           const RowOffsets& row_offsets) {
  const FeatureMap& map = tracker.feature_map();
  absl::flat_hash_set<std::string> tracked_paths;
  for (const auto& [path, pooled] : map.modules) tracked_paths.insert(path);
  const absl::flat_hash_set<std::string> tracked_fqns(map.fqns.begin(),
                                                      map.fqns.end());
  // Each tracked module's table FQNs by table index, cleaned and checked
  // against the tracker's feature map once, here; empty for a skipped table.
  // The hooks only look them up (RecordTables is the one recording path).
  // With each FQN, the table's row offset (global ID = local ID + offset).
  struct HookedTable {
    std::string fqn;
    int64_t row_offset = 0;
  };
  std::vector<std::pair<EmbeddingModule*, std::vector<HookedTable>>> hooked;
  for (EmbeddingModule* module : modules) {
    if (!tracked_paths.contains(CleanFqn(module->path()))) continue;
    std::vector<HookedTable> fqns;
    for (size_t t = 0; t < module->tables().size(); ++t) {
      const std::string fqn =
          CleanFqn(module->TableFqn(static_cast<int64_t>(t)));
      if (tracked_fqns.contains(fqn)) {
        auto offset = row_offsets.find(fqn);
        fqns.push_back(
            {fqn, offset == row_offsets.end() ? int64_t{0} : offset->second});
      } else if (IsSkipped(fqn, tracker.options().fqns_to_skip)) {
        fqns.emplace_back();
      } else {
        return absl::FailedPreconditionError(
            absl::StrCat("table '", fqn, "' of module '", module->path(),
                         "' is not in the tracker's options"));
      }
    }
    hooked.emplace_back(module, std::move(fqns));
  }
  const bool with_rows = tracker.options().mode == TrackingMode::kEmbedding;
  for (auto& [module, fqns] : hooked) {
    module->AddPostLookupHook(
        [&tracker, with_rows, fqns = std::move(fqns)](
            const EmbeddingModule&, const ModuleLookup& lookup) {
          std::vector<TableLookup> tables;
          for (size_t t = 0; t < lookup.ids.size() && t < fqns.size(); ++t) {
            const HookedTable& table = fqns[t];
            if (table.fqn.empty()) continue;  // skipped
            tables.push_back({table.fqn,
                              table.row_offset == 0
                                  ? lookup.ids[t]
                                  : lookup.ids[t] + table.row_offset,
                              with_rows ? lookup.rows[t] : at::Tensor()});
          }
          return tracker.RecordTables(std::move(tables));
        });
    module->AddPostOutputHook(
        [&tracker](const EmbeddingModule&) { tracker.TriggerCompaction(); });
  }
  return absl::OkStatus();
}

ModuleRowsReader::ModuleRowsReader(absl::Span<EmbeddingModule* const> modules,
                                   RowOffsets row_offsets)
    : row_offsets_(std::move(row_offsets)) {
  for (EmbeddingModule* module : modules) {
    for (size_t t = 0; t < module->tables().size(); ++t) {
      tables_[CleanFqn(module->TableFqn(t))] = {module,
                                                static_cast<int64_t>(t)};
    }
  }
}

absl::StatusOr<ModuleRowsReader::Table> ModuleRowsReader::Find(
    absl::string_view fqn) const {
  auto it = tables_.find(fqn);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("no embedding table '", fqn, "'"));
  }
  return it->second;
}

absl::StatusOr<int64_t> ModuleRowsReader::NumRows(absl::string_view fqn) {
  absl::StatusOr<Table> table = Find(fqn);
  if (!table.ok()) return table.status();
  return table->module->tables()[table->index].num_embeddings;
}

int64_t ModuleRowsReader::FirstRow(absl::string_view fqn) {
  auto it = row_offsets_.find(fqn);
  return it == row_offsets_.end() ? 0 : it->second;
}

namespace {

absl::Status OutsideShard(absl::string_view fqn, int64_t first, int64_t rows) {
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", fqn, "' holds rows ", first, " .. ", first + rows - 1,
      " of its sharded table here; an ID is outside them"));
}

}  // namespace

absl::StatusOr<at::Tensor> ModuleRowsReader::LocalIds(
    absl::string_view fqn, const Table& table, const at::Tensor& ids) const {
  auto it = row_offsets_.find(fqn);
  if (it == row_offsets_.end() || it->second == 0) return ids;
  const int64_t first = it->second;
  const int64_t rows = table.module->tables()[table.index].num_embeddings;
  if (ids.device().is_cpu() && ids.scalar_type() == at::kLong &&
      ids.dim() == 1) {
    // One pass on the host (every read of a row-wise shard comes here): the
    // tensor ops below cost a dozen dispatches and two passes a table.
    const at::Tensor global = ids.contiguous();
    at::Tensor local = at::empty_like(global);
    const int64_t* in = global.data_ptr<int64_t>();
    int64_t* out = local.data_ptr<int64_t>();
    for (int64_t i = 0; i < global.numel(); ++i) {
      out[i] = in[i] - first;
      if (out[i] < 0 || out[i] >= rows) return OutsideShard(fqn, first, rows);
    }
    return local;
  }
  at::Tensor local = ids - first;
  if (local.numel() > 0 &&
      ((local < 0).any().item<bool>() || (local >= rows).any().item<bool>())) {
    return OutsideShard(fqn, first, rows);
  }
  return local;
}

absl::StatusOr<at::Tensor> ModuleRowsReader::ReadEmbeddings(
    absl::string_view fqn, const at::Tensor& ids) {
  absl::StatusOr<Table> table = Find(fqn);
  if (!table.ok()) return table.status();
  absl::StatusOr<at::Tensor> local = LocalIds(fqn, *table, ids);
  if (!local.ok()) return local.status();
  return table->module->ReadRows(table->index, *local);
}

absl::StatusOr<at::Tensor> ModuleRowsReader::ReadOptimizerStates(
    absl::string_view fqn, const at::Tensor& ids) {
  absl::StatusOr<Table> table = Find(fqn);
  if (!table.ok()) return table.status();
  absl::StatusOr<at::Tensor> local = LocalIds(fqn, *table, ids);
  if (!local.ok()) return local.status();
  return table->module->ReadOptimizerStates(table->index, *local);
}

absl::StatusOr<ModuleRowsReader::DenseParameters>
ModuleRowsReader::ReadDense() {
  if (!dense_parameters_) return LiveRowsReader::ReadDense();
  return dense_parameters_();
}

}  // namespace deltastream
