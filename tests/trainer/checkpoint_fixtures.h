#ifndef DELTASTREAM_TESTS_TRAINER_CHECKPOINT_FIXTURES_H_
#define DELTASTREAM_TESTS_TRAINER_CHECKPOINT_FIXTURES_H_

// Models for checkpoint tests whose every state is a known function of the
// global position, whatever the plan: a rank sets its shards' states from
// it before saving, and any rank of any world size checks the states it
// loaded against it.
//
// Per table t (index) of `rows` x `dim`:
//   weight[r][c]    = 1000 t + r + c / 100
//   momentum1[r][c] = weight / 2 + 7      (Adagrad, Adam)
//   momentum2[r][c] = weight / 4 + 3      (Adam)
//   row-wise Adagrad's momentum1 of a saved shard at columns c0: 10 t + r/2
//     + c0 (so column blocks differ; loaded, a region gets the
//     column-weighted mean of the saved blocks it overlaps)
//   Adam's step of a saved shard at (r0, c0): 5 + r0 % 7 + c0 (loaded: the
//     largest of the saved shards it overlaps)
// Dense parameter i (in named_parameters() order): 0.001 i + arange / 1000.

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/plan.pb.h"
#include "trainer/models/dlrm.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {
namespace testing {

constexpr int64_t kCheckpointDim = 8;

inline std::vector<EmbeddingTableConfig> CheckpointTables() {
  std::vector<EmbeddingTableConfig> tables;
  const std::pair<const char*, int64_t> shapes[] = {
      {"t0", 40}, {"t1", 33}, {"t2", 17}, {"t3", 21}};
  for (const auto& [name, rows] : shapes) {
    EmbeddingTableConfig table;
    table.name = name;
    table.num_embeddings = rows;
    table.embedding_dim = kCheckpointDim;
    table.feature_names = {absl::StrCat("f", tables.size())};
    tables.push_back(std::move(table));
  }
  return tables;
}

// A region of a table: rows [row_offset, +rows), columns [col_offset, +cols).
struct Region {
  int64_t row_offset = 0;
  int64_t rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
};

// The non-empty shards of table `name` in `plan` (data-parallel copies
// once); the whole table when the plan has none (unsharded).
inline std::vector<Region> SavedRegions(const v1::ShardingPlan& plan,
                                        const EmbeddingTableConfig& table) {
  for (const v1::TablePlan& p : plan.tables()) {
    if (p.table() != table.name) continue;
    std::vector<Region> regions;
    for (const v1::Shard& s : p.shards()) {
      if (s.rows() == 0 || s.cols() == 0) continue;
      regions.push_back({s.row_offset(), s.rows(), s.col_offset(), s.cols()});
      if (p.sharding_type() == v1::DATA_PARALLEL) break;
    }
    return regions;
  }
  return {{0, table.num_embeddings, 0, table.embedding_dim}};
}

inline at::Tensor GlobalWeight(int64_t t, const EmbeddingTableConfig& table) {
  return 1000.0 * t +
         at::arange(table.num_embeddings, at::kFloat).unsqueeze(1) +
         at::arange(table.embedding_dim, at::kFloat).unsqueeze(0) / 100.0;
}

inline int64_t Overlap(int64_t a, int64_t an, int64_t b, int64_t bn) {
  return std::max<int64_t>(0, std::min(a + an, b + bn) - std::max(a, b));
}

// The value `state` of table t's region `region` must have: set before a
// save whose layout has `region` as a shard (saved = {region}), or expected
// after a load from a checkpoint saved with layout `saved`.
inline at::Tensor ExpectedState(int64_t t, const EmbeddingTableConfig& table,
                                const std::string& state,
                                const at::Tensor& like, const Region& region,
                                const std::vector<Region>& saved) {
  const at::Tensor weight = GlobalWeight(t, table)
                                .narrow(0, region.row_offset, region.rows)
                                .narrow(1, region.col_offset, region.cols);
  if (state == "weight") return weight;
  if (state == "step") {
    int64_t step = -1;
    for (const Region& s : saved) {
      if (Overlap(s.row_offset, s.rows, region.row_offset, region.rows) > 0 &&
          Overlap(s.col_offset, s.cols, region.col_offset, region.cols) > 0) {
        step = std::max<int64_t>(step, 5 + s.row_offset % 7 + s.col_offset);
      }
    }
    return at::scalar_tensor(step, at::kLong);
  }
  if (state == "momentum2") return weight / 4.0 + 3.0;
  if (like.size(1) != 1 || region.cols == 1) return weight / 2.0 + 7.0;
  // Row-wise Adagrad: the column-weighted mean of the saved blocks.
  at::Tensor sum = at::zeros({region.rows, 1}, at::kDouble);
  at::Tensor total = at::zeros({region.rows, 1}, at::kDouble);
  for (const Region& s : saved) {
    const int64_t cols =
        Overlap(s.col_offset, s.cols, region.col_offset, region.cols);
    const int64_t first = std::max(s.row_offset, region.row_offset);
    const int64_t rows =
        Overlap(s.row_offset, s.rows, region.row_offset, region.rows);
    if (rows == 0 || cols == 0) continue;
    at::Tensor value =
        (10.0 * t +
         at::arange(first, first + rows, at::kFloat).unsqueeze(1) / 2.0 +
         static_cast<double>(s.col_offset))
            .to(at::kFloat)
            .to(at::kDouble);
    sum.narrow(0, first - region.row_offset, rows).add_(value * cols);
    total.narrow(0, first - region.row_offset, rows).add_(cols);
  }
  return (sum / total).to(at::kFloat);
}

// The model's tables on this rank: (table index, module holding it, region).
struct HeldTable {
  int64_t index = 0;
  EmbeddingModule* module = nullptr;
  Region region;
};

inline std::vector<HeldTable> HeldTables(RecModel& model) {
  std::vector<HeldTable> held;
  for (ShardedEmbeddingModule* sharded : model.sharded_modules()) {
    for (const EmbeddingShard& s : sharded->local_shards()) {
      held.push_back({s.table_index,
                      sharded->local_module(),
                      {s.row_offset, s.rows, s.col_offset, s.cols}});
    }
  }
  if (!model.sharded_modules().empty()) return held;
  for (EmbeddingModule* module : model.embedding_modules()) {
    for (size_t i = 0; i < module->tables().size(); ++i) {
      held.push_back({static_cast<int64_t>(i),
                      module,
                      {0, module->tables()[i].num_embeddings, 0,
                       module->tables()[i].embedding_dim}});
    }
  }
  return held;
}

// Sets every state of the model this rank holds, and the dense parameters,
// to the functions above (as saved by a shard at its own region).
inline absl::Status SetKnownStates(RecModel& model) {
  const std::vector<EmbeddingTableConfig> tables = CheckpointTables();
  std::map<EmbeddingModule*, std::vector<std::pair<std::string, at::Tensor>>>
      states;
  for (const HeldTable& held : HeldTables(model)) {
    const EmbeddingTableConfig& table = tables[held.index];
    for (const auto& [name, live] : held.module->StateTensors()) {
      const std::string prefix = table.name + ".";
      if (!absl::StartsWith(name, prefix)) continue;
      states[held.module].emplace_back(
          name, ExpectedState(held.index, table, name.substr(prefix.size()),
                              live, held.region, {held.region}));
    }
  }
  for (auto& [module, named] : states) {
    if (absl::Status s = module->LoadStateTensors(named); !s.ok()) return s;
  }
  at::NoGradGuard no_grad;
  int64_t i = 0;
  for (const at::Tensor& p : model.dense().parameters()) {
    p.copy_(0.001 * static_cast<double>(i++) +
            at::arange(p.numel(), at::kFloat).reshape(p.sizes()) / 1000.0);
  }
  return absl::OkStatus();
}

// Whether every state this rank holds is what a load from a checkpoint
// saved under `saved_plan` (empty: unsharded) must give; the first
// difference otherwise.
inline absl::Status CheckKnownStates(RecModel& model,
                                     const v1::ShardingPlan& saved_plan) {
  const std::vector<EmbeddingTableConfig> tables = CheckpointTables();
  for (const HeldTable& held : HeldTables(model)) {
    const EmbeddingTableConfig& table = tables[held.index];
    for (const auto& [name, live] : held.module->StateTensors()) {
      const std::string prefix = table.name + ".";
      if (!absl::StartsWith(name, prefix)) continue;
      const at::Tensor expected =
          ExpectedState(held.index, table, name.substr(prefix.size()), live,
                        held.region, SavedRegions(saved_plan, table));
      if (!at::equal(live, expected)) {
        return absl::InternalError(
            absl::StrCat(name, " rows [", held.region.row_offset, ", +",
                         held.region.rows, ") cols [", held.region.col_offset,
                         ", +", held.region.cols, ") differs by ",
                         (live.to(at::kDouble) - expected.to(at::kDouble))
                             .abs()
                             .max()
                             .item<double>()));
      }
    }
  }
  int64_t i = 0;
  for (const auto& item : model.dense().named_parameters()) {
    const at::Tensor& p = item.value();
    if (!at::equal(p, 0.001 * static_cast<double>(i++) +
                          at::arange(p.numel(), at::kFloat).reshape(p.sizes()) /
                              1000.0)) {
      return absl::InternalError(
          absl::StrCat("dense ", item.key(), " differs"));
    }
  }
  return absl::OkStatus();
}

// A DLRM over CheckpointTables(), sharded over `group` by `plan` when given.
inline absl::StatusOr<std::unique_ptr<Dlrm>> MakeCheckpointModel(
    SparseOptimizerType optimizer, uint64_t seed, ProcessGroup* group = nullptr,
    v1::ShardingPlan plan = {}) {
  DlrmConfig config;
  config.num_dense = 3;
  config.dense_arch = {4, kCheckpointDim};
  config.over_arch = {4, 1};
  config.tables = CheckpointTables();
  config.sparse_optimizer.type = optimizer;
  config.seed = seed;
  config.group = group;
  config.plan = std::move(plan);
  return Dlrm::Create(config);
}

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_CHECKPOINT_FIXTURES_H_
