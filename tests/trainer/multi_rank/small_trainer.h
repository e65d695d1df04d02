#ifndef DELTASTREAM_TESTS_TRAINER_MULTI_RANK_SMALL_TRAINER_H_
#define DELTASTREAM_TESTS_TRAINER_MULTI_RANK_SMALL_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "proto/plan.pb.h"
#include "tests/trainer/sharding/shard_states.h"
#include "trainer/comm/process_group.h"
#include "trainer/config.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/sharding/sharding_plan.h"
#include "trainer/trainer.h"

namespace deltastream {
namespace testing {

// The small model of the multi-rank trainer tests: tables of dim 8
// (column-wise splits 8 over 4 ranks) t0 (40 rows, features f0 and f1), t1
// (33), t2 (17), t3 (21) and, with `fifth_table`, t4 (23); DLRM or the
// sequence model; synthetic data of 0-3 IDs per feature; seed 11. With
// `criteo_path`, the data is that Criteo file instead (13 dense features;
// t0 reads cat_0 and cat_1, t1 cat_2, and so on).
struct SmallModel {
  std::string kind = "dlrm";
  std::string sparse_optimizer = "adagrad";
  int64_t batch = 8;  // per rank
  bool fifth_table = false;
  int64_t eval_batches = 1;
  int64_t log_every_steps = 100;
  std::string tracker = R"(mode: "id_only")";  // the tracker block's fields
  std::string criteo_path;
};

inline std::string SmallModelConfig(const SmallModel& model) {
  const bool criteo = !model.criteo_path.empty();
  // The features of table t<t> beyond t0.
  auto features = [criteo](int t) {
    return criteo ? absl::StrCat(" feature_names: \"cat_", t + 1, "\"")
                  : std::string();
  };
  return absl::StrCat(
      R"(
model {
  kind: ")",
      model.kind, R"("
  num_dense: )",
      criteo ? 13 : 4, R"(
  dense_arch: [16, 8]
  over_arch: [16, 1]
  tables { name: "t0" num_embeddings: 40 embedding_dim: 8 feature_names: )",
      criteo ? R"(["cat_0", "cat_1"])" : R"(["f0", "f1"])", R"( }
  tables { name: "t1" num_embeddings: 33 embedding_dim: 8)",
      features(1), R"( }
  tables { name: "t2" num_embeddings: 17 embedding_dim: 8)",
      features(2), R"( }
  tables { name: "t3" num_embeddings: 21 embedding_dim: 8)",
      features(3), " }\n",
      model.fifth_table
          ? absl::StrCat("  tables { name: \"t4\" num_embeddings: 23 "
                         "embedding_dim: 8",
                         features(4), " }\n")
          : "",
      R"(  sparse_optimizer { type: ")", model.sparse_optimizer,
      R"(" learning_rate: 0.1 }
  dense_optimizer { type: "adam" learning_rate: 0.01 }
}
data { batch_size: )",
      model.batch, " ",
      criteo ? absl::StrCat("criteo { paths: \"", model.criteo_path, "\" }")
             : "synthetic { min_length: 0 max_length: 3 }",
      " eval_batches: ", model.eval_batches, R"( }
tracker { )",
      model.tracker, R"( }
seed: 11
log_every_steps: )",
      model.log_every_steps, "\n");
}

// The five tables on 2 ranks: t0 row-wise, t1 column-wise (rank 1's block
// first), t2 data-parallel, t3 table-wise on rank 1, t4 table-row-wise
// (pooled) or row-wise (sequence).
inline v1::ShardingPlan MixedPlanOfTwoRanks(
    const std::vector<EmbeddingTableConfig>& tables, bool pooled) {
  v1::ShardingPlan plan;
  plan.set_world_size(2);
  *plan.add_tables() = RowWisePlan(tables[0], 2);
  *plan.add_tables() = ColumnWisePlan(tables[1], {1, 0});
  *plan.add_tables() = DataParallelPlan(tables[2], 2);
  *plan.add_tables() = TableWisePlan(tables[3], 1);
  *plan.add_tables() =
      pooled ? TableRowWisePlan(tables[4], {0, 1}) : RowWisePlan(tables[4], 2);
  return plan;
}

// A plan for the resolved tables of a config.
using PlanOfTables =
    std::function<v1::ShardingPlan(const std::vector<EmbeddingTableConfig>&)>;

// A trainer of the config `text`: one process without a group; with one,
// a rank sharded by `plan` (written to a file of $TEST_TMPDIR; null: the
// default plan). With `checkpoint_dir`, checkpoints and tracker snapshots
// there. Its log lines go to `log` (null: nowhere).
inline absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(
    const std::string& text, ProcessGroup* group = nullptr,
    const PlanOfTables& plan = nullptr, const std::string& checkpoint_dir = "",
    std::function<void(const std::string&)> log = nullptr) {
  absl::StatusOr<v1::TrainerConfig> config = ParseTrainerConfig(text);
  if (!config.ok()) return config.status();
  absl::StatusOr<TrainerSettings> settings = ResolveTrainerConfig(*config);
  if (!settings.ok()) return settings.status();
  settings->group = group;
  if (group != nullptr && plan != nullptr) {
    settings->plan_path =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/plan-", group->rank(),
                     "-of-", group->world_size(), ".txt");
    if (absl::Status written =
            WriteShardingPlan(plan(settings->tables), settings->plan_path);
        !written.ok()) {
      return written;
    }
  }
  settings->checkpoint_dir = checkpoint_dir;
  if (!checkpoint_dir.empty()) settings->service.db = checkpoint_dir + "/db";
  if (log == nullptr) log = [](const std::string&) {};
  return Trainer::Create(*std::move(settings), std::move(log));
}

// A rank of `group` (2 ranks) sharded by MixedPlanOfTwoRanks, or (`group`
// null) one process: MakeTrainer of `text` with that plan.
inline absl::StatusOr<std::unique_ptr<Trainer>> MakeMixedTrainer(
    const std::string& text, ProcessGroup* group, bool pooled) {
  return MakeTrainer(text, group,
                     [pooled](const std::vector<EmbeddingTableConfig>& tables) {
                       return MixedPlanOfTwoRanks(tables, pooled);
                     });
}

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_MULTI_RANK_SMALL_TRAINER_H_
