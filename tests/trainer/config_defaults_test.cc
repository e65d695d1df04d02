// The trainer config's defaults (trainer/config_defaults.h), the one place the
// trainer and the planner take them from: their values, that they only fill
// what is unset, and that the trainer's resolved settings are made of them.
#include "trainer/config_defaults.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trainer/config.h"

namespace deltastream {
namespace {

v1::TrainerConfig Parse(const std::string& text) {
  absl::StatusOr<v1::TrainerConfig> config = ParseTrainerConfig(text);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : v1::TrainerConfig();
}

TEST(ConfigDefaults, AnEmptyConfigGetsEveryDefault) {
  const v1::TrainerConfig config = WithTrainerConfigDefaults({});
  const v1::Model& model = config.model();
  EXPECT_EQ(model.kind(), "dlrm");
  ASSERT_EQ(model.tables_size(), 8);
  EXPECT_EQ(model.tables(7).name(), "t7");
  EXPECT_EQ(model.tables(7).num_embeddings(), 100000);
  EXPECT_EQ(model.tables(7).embedding_dim(), 16);
  EXPECT_EQ(model.tables(7).feature_names(0), "cat_7");
  EXPECT_EQ(model.tables(7).dtype(), "float");
  EXPECT_EQ(model.num_dense(), 13);
  EXPECT_EQ(std::vector<int64_t>(model.dense_arch().begin(),
                                 model.dense_arch().end()),
            (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(
      std::vector<int64_t>(model.over_arch().begin(), model.over_arch().end()),
      (std::vector<int64_t>{64, 32, 1}));
  EXPECT_EQ(model.sparse_optimizer().type(), "rowwise_adagrad");
  EXPECT_DOUBLE_EQ(model.sparse_optimizer().learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(model.sparse_optimizer().eps(), 1e-8);
  EXPECT_DOUBLE_EQ(model.sparse_optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(model.sparse_optimizer().beta2(), 0.999);
  EXPECT_EQ(model.dense_optimizer().type(), "adagrad");
  EXPECT_DOUBLE_EQ(model.dense_optimizer().learning_rate(), 0.05);
  EXPECT_EQ(config.data().batch_size(), 512);
  EXPECT_EQ(config.data().eval_batches(), 8);
  ASSERT_TRUE(config.data().has_synthetic());
  EXPECT_EQ(config.data().synthetic().min_length(), 1);
  EXPECT_EQ(config.data().synthetic().max_length(), 1);
  EXPECT_DOUBLE_EQ(config.data().synthetic().zipf_exponent(), 1.05);
  EXPECT_EQ(config.tracker().mode(), "id_only");
  EXPECT_EQ(config.checkpoints().keep(), 2);
  EXPECT_EQ(config.steps(), 300);
  EXPECT_EQ(config.log_every_steps(), 50);
  EXPECT_EQ(config.device(), "cpu");
  // Idempotent.
  EXPECT_EQ(WithTrainerConfigDefaults(config).SerializeAsString(),
            config.SerializeAsString());
}

TEST(ConfigDefaults, WhatIsSetStaysAndDependentDefaultsFollowIt) {
  const v1::TrainerConfig config = WithTrainerConfigDefaults(Parse(R"(
    model { kind: "sequence"
            tables { name: "s" num_embeddings: 10 embedding_dim: 8 }
            sparse_optimizer { type: "adam" learning_rate: 0.5 } }
    data { batch_size: -3 synthetic { min_length: 2 } }
    tracker { mode: "off" }
    steps: -1 device: "cuda:1")"));
  const v1::Model& model = config.model();
  ASSERT_EQ(model.tables_size(), 1);
  EXPECT_EQ(model.tables(0).feature_names(0), "s");  // named like the table
  EXPECT_TRUE(model.tables(0).pooling().empty());    // sequence: never set
  EXPECT_EQ(model.dense_arch(1), 8);                 // the first table's dim
  EXPECT_EQ(model.sparse_optimizer().type(), "adam");
  EXPECT_DOUBLE_EQ(model.sparse_optimizer().learning_rate(), 0.5);
  EXPECT_EQ(config.data().batch_size(), -3);  // not checked here
  EXPECT_EQ(config.data().synthetic().min_length(), 2);
  EXPECT_EQ(config.data().synthetic().max_length(), 8);  // sequence
  // An explicit 0 is kept (features that may be empty), not taken for unset.
  EXPECT_EQ(WithTrainerConfigDefaults(
                Parse("data { synthetic { min_length: 0 max_length: 3 } }"))
                .data()
                .synthetic()
                .min_length(),
            0);
  EXPECT_EQ(config.tracker().mode(), "off");
  EXPECT_EQ(config.steps(), -1);
  EXPECT_EQ(config.device(), "cuda:1");

  // Criteo data stays Criteo (the oneof is not switched to synthetic).
  const v1::TrainerConfig criteo = WithTrainerConfigDefaults(
      Parse(R"(data { criteo { paths: ["day_0.gz"] } })"));
  EXPECT_TRUE(criteo.data().has_criteo());
  EXPECT_DOUBLE_EQ(criteo.data().criteo().max_malformed_fraction(), 0.01);
}

// The trainer resolves a config through the same defaults: its settings for
// an empty config are the defaults above.
TEST(ConfigDefaults, TheTrainersSettingsAreMadeOfThem) {
  absl::StatusOr<TrainerSettings> settings = ResolveTrainerConfig({});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->model_kind, ModelKind::kDlrm);
  ASSERT_EQ(settings->tables.size(), 8u);
  EXPECT_EQ(settings->tables[3].name, "t3");
  EXPECT_EQ(settings->tables[3].num_embeddings, 100000);
  EXPECT_EQ(settings->tables[3].embedding_dim, 16);
  EXPECT_EQ(settings->tables[3].feature_names,
            std::vector<std::string>{"cat_3"});
  EXPECT_EQ(settings->tables[3].dtype, c10::kFloat);
  EXPECT_EQ(settings->num_dense, 13);
  EXPECT_EQ(settings->dense_arch, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(settings->over_arch, (std::vector<int64_t>{64, 32, 1}));
  EXPECT_EQ(settings->sparse_optimizer.type,
            SparseOptimizerType::kRowwiseAdagrad);
  EXPECT_DOUBLE_EQ(settings->sparse_optimizer.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(settings->sparse_optimizer.beta2, 0.999);
  EXPECT_EQ(settings->dense_optimizer, "adagrad");
  EXPECT_DOUBLE_EQ(settings->dense_learning_rate, 0.05);
  EXPECT_TRUE(settings->synthetic);
  EXPECT_EQ(settings->synthetic_data.batch_size, 512);
  EXPECT_DOUBLE_EQ(settings->synthetic_data.zipf_exponent, 1.05);
  ASSERT_EQ(settings->synthetic_data.features.size(), 8u);
  EXPECT_EQ(settings->synthetic_data.features[0].min_length, 1);
  EXPECT_EQ(settings->synthetic_data.features[0].max_length, 1);
  EXPECT_EQ(settings->eval_batches, 8);
  EXPECT_TRUE(settings->tracking);
  EXPECT_EQ(settings->tracker.mode, TrackingMode::kIdOnly);
  EXPECT_EQ(settings->checkpoints_kept, 2);
  EXPECT_EQ(settings->steps, 300);
  EXPECT_EQ(settings->log_every_steps, 50);
  EXPECT_TRUE(settings->device.is_cpu());

  // A sequence model's synthetic lengths default to [1, 8].
  settings = ResolveTrainerConfig(Parse(R"(model { kind: "sequence" })"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->synthetic_data.features[0].max_length, 8);
  // Checks still see what was given.
  EXPECT_FALSE(ResolveTrainerConfig(Parse("data { batch_size: -3 }")).ok());
  EXPECT_FALSE(ResolveTrainerConfig(Parse(R"(model { kind: "sequence"
      tables { name: "s" num_embeddings: 10 embedding_dim: 8
               pooling: "sum" } })"))
                   .ok());
}

// Zero is a value where it means something: no held-out batches (no AUC),
// a progress line at the end only.
TEST(ConfigDefaults, ZeroEvalBatchesAndLogEveryStepsAreKept) {
  absl::StatusOr<TrainerSettings> settings = ResolveTrainerConfig(
      Parse("data { eval_batches: 0 } log_every_steps: 0"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->eval_batches, 0);
  EXPECT_EQ(settings->log_every_steps, 0);
}

// NaN passes a "< 0" check: it is refused like a negative value. So is an
// infinite rate or drain (training would end in NaN without a word, a drain
// would wait for a consumer gone for good), and a held-out set no memory
// holds (it is built at the start, whole).
TEST(ConfigDefaults, NotANumberIsRefused) {
  for (const char* text : {
           "tracker { drain_seconds: nan }",
           "tracker { drain_seconds: inf }",
           "model { dense_optimizer { learning_rate: inf } }",
           "model { sparse_optimizer { learning_rate: inf } }",
           "model { sparse_optimizer { type: \"adam\" eps: inf } }",
           "model { sparse_optimizer { type: \"adagrad\" "
           "initial_accumulator_value: inf } }",
           "data { batch_size: 8 eval_batches: 1000000000000 }",
           "tracker { expire_consumers_after_seconds: nan }",
           "tracker { expire_consumers_after_seconds: -1 }",
           "tracker { expire_consumers_after_seconds: inf }",
           "checkpoints { dir: \"/tmp/c\" every_seconds: nan }",
           "model { dense_optimizer { learning_rate: nan } }",
           "model { sparse_optimizer { learning_rate: nan } }",
       }) {
    absl::StatusOr<TrainerSettings> settings =
        ResolveTrainerConfig(Parse(text));
    EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(ConfigDefaults, ConsumersExpireOnlyWhenAsked) {
  absl::StatusOr<TrainerSettings> settings = ResolveTrainerConfig(Parse(""));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->tracker.expire_consumers_after, absl::ZeroDuration());
  settings = ResolveTrainerConfig(
      Parse("tracker { expire_consumers_after_seconds: 900 }"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->tracker.expire_consumers_after, absl::Seconds(900));
}

TEST(ConfigDefaults, CudaWithoutAnIndexIsEachRanksOwnGpu) {
  absl::StatusOr<TrainerSettings> settings =
      ResolveTrainerConfig(Parse(R"(device: "cuda")"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->device, c10::Device("cuda:0"));  // one process
  EXPECT_EQ(LocalRankDevice(*settings, 0), c10::Device("cuda:0"));
  EXPECT_EQ(LocalRankDevice(*settings, 3), c10::Device("cuda:3"));

  // A device named is every rank's.
  settings = ResolveTrainerConfig(Parse(R"(device: "cuda:1")"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(LocalRankDevice(*settings, 0), c10::Device("cuda:1"));
  EXPECT_EQ(LocalRankDevice(*settings, 3), c10::Device("cuda:1"));
  settings = ResolveTrainerConfig(Parse(R"(device: "cpu")"));
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_TRUE(LocalRankDevice(*settings, 3).is_cpu());
}

}  // namespace
}  // namespace deltastream
