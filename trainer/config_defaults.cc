#include "trainer/config_defaults.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

// Sets `*field` (read through `get`, written through `set`) to `fallback`
// when it is unset (zero or empty).
template <typename Message, typename T, typename Fallback>
void Or(Message* message, T (Message::*get)() const, void (Message::*set)(T),
        Fallback fallback) {
  if ((message->*get)() == T()) (message->*set)(fallback);
}

}  // namespace

v1::TrainerConfig WithTrainerConfigDefaults(v1::TrainerConfig config) {
  v1::Model& model = *config.mutable_model();
  if (model.kind().empty()) model.set_kind("dlrm");
  const bool sequence = model.kind() == "sequence";
  if (model.tables().empty()) {
    for (int t = 0; t < 8; ++t) {
      v1::EmbeddingTable* table = model.add_tables();
      table->set_name(absl::StrCat("t", t));
      table->set_num_embeddings(100000);
      table->set_embedding_dim(16);
      table->add_feature_names(absl::StrCat("cat_", t));
    }
  }
  for (v1::EmbeddingTable& table : *model.mutable_tables()) {
    if (table.feature_names().empty()) table.add_feature_names(table.name());
    if (table.dtype().empty()) table.set_dtype("float");
  }
  Or(&model, &v1::Model::num_dense, &v1::Model::set_num_dense, 13);
  if (model.dense_arch().empty()) {
    model.add_dense_arch(64);
    model.add_dense_arch(model.tables(0).embedding_dim());
  }
  if (model.over_arch().empty()) {
    for (int64_t width : {64, 32, 1}) model.add_over_arch(width);
  }
  v1::SparseOptimizer& sparse = *model.mutable_sparse_optimizer();
  if (sparse.type().empty()) sparse.set_type("rowwise_adagrad");
  Or(&sparse, &v1::SparseOptimizer::learning_rate,
     &v1::SparseOptimizer::set_learning_rate, 0.05);
  Or(&sparse, &v1::SparseOptimizer::eps, &v1::SparseOptimizer::set_eps, 1e-8);
  Or(&sparse, &v1::SparseOptimizer::beta1, &v1::SparseOptimizer::set_beta1,
     0.9);
  Or(&sparse, &v1::SparseOptimizer::beta2, &v1::SparseOptimizer::set_beta2,
     0.999);
  v1::DenseOptimizer& dense = *model.mutable_dense_optimizer();
  if (dense.type().empty()) dense.set_type("adagrad");
  Or(&dense, &v1::DenseOptimizer::learning_rate,
     &v1::DenseOptimizer::set_learning_rate, 0.05);

  v1::Data& data = *config.mutable_data();
  Or(&data, &v1::Data::batch_size, &v1::Data::set_batch_size, 512);
  if (!data.has_eval_batches()) data.set_eval_batches(8);
  if (data.has_criteo()) {
    Or(data.mutable_criteo(), &v1::CriteoData::max_malformed_fraction,
       &v1::CriteoData::set_max_malformed_fraction, 0.01);
  } else {
    v1::SyntheticData& synthetic = *data.mutable_synthetic();
    // Set or not (an explicit 0 is kept: empty features).
    if (!synthetic.has_min_length()) synthetic.set_min_length(1);
    if (!synthetic.has_max_length()) {
      synthetic.set_max_length(sequence ? 8 : 1);
    }
    Or(&synthetic, &v1::SyntheticData::zipf_exponent,
       &v1::SyntheticData::set_zipf_exponent, 1.05);
  }

  if (config.tracker().mode().empty()) {
    config.mutable_tracker()->set_mode("id_only");
  }
  Or(config.mutable_checkpoints(), &v1::Checkpoints::keep,
     &v1::Checkpoints::set_keep, 2);
  Or(&config, &v1::TrainerConfig::steps, &v1::TrainerConfig::set_steps, 300);
  if (config.pipeline().empty()) config.set_pipeline("sequential");
  Or(&config, &v1::TrainerConfig::accumulation_steps,
     &v1::TrainerConfig::set_accumulation_steps, int64_t{1});
  if (!config.has_log_every_steps()) config.set_log_every_steps(50);
  if (config.device().empty()) config.set_device("cpu");
  return config;
}

}  // namespace deltastream
