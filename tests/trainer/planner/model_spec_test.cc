// The planner reads trainer configs without linking the trainer (no
// LibTorch); this test holds its reading to the trainer's own
// (trainer/config.h): the same tables, shapes, dtypes, kinds, batch size and
// optimizer for the default config and for configs that set them.
#include "trainer/planner/model_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "trainer/config.h"

namespace deltastream::planner {
namespace {

OptimizerKind Planned(SparseOptimizerType type) {
  switch (type) {
    case SparseOptimizerType::kSgd:
      return OptimizerKind::kSgd;
    case SparseOptimizerType::kAdagrad:
      return OptimizerKind::kAdagrad;
    case SparseOptimizerType::kRowwiseAdagrad:
      return OptimizerKind::kRowwiseAdagrad;
    case SparseOptimizerType::kAdam:
      return OptimizerKind::kAdam;
  }
  return OptimizerKind::kSgd;
}

void ExpectSameModel(const std::string& text) {
  SCOPED_TRACE(text);
  absl::StatusOr<v1::TrainerConfig> config = ParseTrainerConfig(text);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainerSettings> trainer = ResolveTrainerConfig(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<ModelSpec> planner = ModelSpecFromConfig(*config);
  ASSERT_TRUE(planner.ok()) << planner.status();
  ASSERT_EQ(planner->tables.size(), trainer->tables.size());
  for (size_t t = 0; t < planner->tables.size(); ++t) {
    const TableSpec& planned = planner->tables[t];
    const EmbeddingTableConfig& trained = trainer->tables[t];
    EXPECT_EQ(planned.name, trained.name);
    EXPECT_EQ(planned.rows, trained.num_embeddings);
    EXPECT_EQ(planned.dim, trained.embedding_dim);
    EXPECT_EQ(planned.element_bytes,
              static_cast<int64_t>(c10::elementSize(trained.dtype)));
    EXPECT_EQ(planned.num_features,
              static_cast<int64_t>(trained.feature_names.size()));
    EXPECT_EQ(planned.pooled, trainer->model_kind == ModelKind::kDlrm);
  }
  EXPECT_EQ(planner->optimizer, Planned(trainer->sparse_optimizer.type));
  const int64_t batch = trainer->synthetic ? trainer->synthetic_data.batch_size
                                           : trainer->criteo_data.batch_size;
  EXPECT_EQ(planner->batch_size, batch);
  EXPECT_EQ(planner->gpu, trainer->device.is_cuda());
}

TEST(ModelSpec, ReadsConfigsAsTheTrainerDoes) {
  ExpectSameModel("");
  ExpectSameModel(R"(
    model {
      tables { name: "a" num_embeddings: 1000 embedding_dim: 32
               feature_names: ["f1", "f2"] dtype: "double" }
      tables { name: "b" num_embeddings: 10 embedding_dim: 32 }
      sparse_optimizer { type: "adam" }
    }
    data { batch_size: 128 synthetic { max_length: 3 } })");
  ExpectSameModel(R"(
    model { kind: "sequence"
            tables { name: "s" num_embeddings: 500 embedding_dim: 8 }
            sparse_optimizer { type: "sgd" } })");
  ExpectSameModel(R"(
    model { sparse_optimizer { type: "adagrad" } }
    data { batch_size: 64 })");
}

}  // namespace
}  // namespace deltastream::planner
