#include "trainer/config.h"

#include <google/protobuf/text_format.h>

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/text_proto.h"
#include "trainer/config_defaults.h"
#include "trainer/models/model.h"
#include "trainer/optim/dense_optimizer.h"

namespace deltastream {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", field, ": ", message));
}

absl::StatusOr<std::vector<EmbeddingTableConfig>> Tables(const v1::Model& model,
                                                         ModelKind kind) {
  std::vector<EmbeddingTableConfig> tables;
  for (const v1::EmbeddingTable& in : model.tables()) {
    EmbeddingTableConfig table;
    table.name = in.name();
    table.num_embeddings = in.num_embeddings();
    table.embedding_dim = in.embedding_dim();
    table.feature_names.assign(in.feature_names().begin(),
                               in.feature_names().end());
    const std::string field = absl::StrCat("model.tables '", in.name(), "'");
    if (in.pooling().empty() || in.pooling() == "sum") {
      table.pooling = Pooling::kSum;
    } else if (in.pooling() == "mean") {
      table.pooling = Pooling::kMean;
    } else {
      return Invalid(field, absl::StrCat("pooling must be sum or mean, got '",
                                         in.pooling(), "'"));
    }
    if (kind == ModelKind::kSequence && !in.pooling().empty()) {
      return Invalid(field, "a sequence model's tables are not pooled");
    }
    if (in.dtype().empty() || in.dtype() == "float") {
      table.dtype = c10::kFloat;
    } else if (in.dtype() == "double") {
      table.dtype = c10::kDouble;
    } else {
      return Invalid(field, absl::StrCat("dtype must be float or double, got '",
                                         in.dtype(), "'"));
    }
    tables.push_back(std::move(table));
  }
  if (absl::Status status = ValidateTables(tables); !status.ok()) {
    return Invalid("model.tables", status.message());
  }
  return tables;
}

}  // namespace

absl::StatusOr<v1::TrainerConfig> ParseTrainerConfig(absl::string_view text) {
  v1::TrainerConfig config;
  if (absl::Status parsed = ParseTextProto(text, &config); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", parsed.message()));
  }
  return config;
}

absl::StatusOr<v1::TrainerConfig> ReadTrainerConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::TrainerConfig> config = ParseTrainerConfig(*text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<TrainerSettings> ResolveTrainerConfig(
    const v1::TrainerConfig& given) {
  const v1::TrainerConfig config = WithTrainerConfigDefaults(given);
  TrainerSettings settings;
  const v1::Model& model = config.model();

  // The model.
  if (model.kind().empty() || model.kind() == "dlrm") {
    settings.model_kind = ModelKind::kDlrm;
  } else if (model.kind() == "sequence") {
    settings.model_kind = ModelKind::kSequence;
  } else {
    return Invalid("model.kind",
                   absl::StrCat("dlrm or sequence, got '", model.kind(), "'"));
  }
  absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
      Tables(model, settings.model_kind);
  if (!tables.ok()) return tables.status();
  settings.tables = *std::move(tables);
  if (model.num_dense() < 0) return Invalid("model.num_dense", "must be >= 0");
  settings.num_dense = model.num_dense();
  settings.dense_arch.assign(model.dense_arch().begin(),
                             model.dense_arch().end());
  settings.over_arch.assign(model.over_arch().begin(), model.over_arch().end());
  RecModelConfig architecture;
  architecture.num_dense = settings.num_dense;
  architecture.dense_arch = settings.dense_arch;
  architecture.over_arch = settings.over_arch;
  architecture.tables = settings.tables;
  if (absl::Status status = ValidateArchitecture(architecture); !status.ok()) {
    return Invalid("model", status.message());
  }

  const v1::SparseOptimizer& sparse = model.sparse_optimizer();
  if (!sparse.type().empty()) {
    absl::StatusOr<SparseOptimizerType> type =
        ParseSparseOptimizer(sparse.type());
    if (!type.ok())
      return Invalid("model.sparse_optimizer", type.status().message());
    settings.sparse_optimizer.type = *type;
  }
  settings.sparse_optimizer.learning_rate = sparse.learning_rate();
  settings.sparse_optimizer.eps = sparse.eps();
  settings.sparse_optimizer.beta1 = sparse.beta1();
  settings.sparse_optimizer.beta2 = sparse.beta2();
  settings.sparse_optimizer.weight_decay = sparse.weight_decay();
  settings.sparse_optimizer.initial_accumulator_value =
      sparse.initial_accumulator_value();
  if (absl::Status status = ValidateOptimizer(settings.sparse_optimizer);
      !status.ok()) {
    return Invalid("model.sparse_optimizer", status.message());
  }
  settings.dense_optimizer = model.dense_optimizer().type();
  if (absl::Status status = ValidateDenseOptimizer(settings.dense_optimizer);
      !status.ok()) {
    return Invalid("model.dense_optimizer.type", status.message());
  }
  settings.dense_learning_rate = model.dense_optimizer().learning_rate();
  if (!(settings.dense_learning_rate >= 0) ||  // also NaN
      !std::isfinite(settings.dense_learning_rate)) {
    return Invalid("model.dense_optimizer.learning_rate",
                   "must be finite and >= 0");
  }

  // The run.
  settings.seed = config.seed();
  settings.steps = config.steps();
  if (settings.steps < -1) return Invalid("steps", "must be >= -1");
  settings.log_every_steps = config.log_every_steps();
  if (settings.log_every_steps < 0) {
    return Invalid("log_every_steps", "must be >= 0");
  }
  const std::string& device = config.device();
  if (device == "cpu") {
    settings.device = c10::Device(c10::kCPU);
  } else if (absl::StartsWith(device, "cuda")) {
    try {
      settings.device = c10::Device(device);
    } catch (const c10::Error&) {
      return Invalid("device", absl::StrCat("cannot parse '", device, "'"));
    }
    // "cuda" means the first device (each rank's own: LocalRankDevice):
    // tensors report a concrete index.
    settings.device_index_given = settings.device.has_index();
    if (!settings.device_index_given) settings.device.set_index(0);
  } else {
    return Invalid("device",
                   absl::StrCat("cpu, cuda or cuda:N, got '", device, "'"));
  }
  settings.pipeline.pipeline = config.pipeline();
  settings.pipeline.accumulation_steps = config.accumulation_steps();
  settings.pipeline.mixed_precision = config.mixed_precision();
  if (absl::Status status =
          ValidatePipelineOptions(settings.pipeline, settings.device.is_cuda());
      !status.ok()) {
    return Invalid("pipeline", status.message());
  }

  // The data.
  const v1::Data& data = config.data();
  const int64_t batch_size = data.batch_size();
  if (batch_size <= 0) return Invalid("data.batch_size", "must be positive");
  settings.batch_size = batch_size;
  settings.eval_batches = data.eval_batches();
  if (settings.eval_batches < 0) {
    return Invalid("data.eval_batches", "must be >= 0");
  }
  // The held-out examples are all kept in memory, from the start.
  constexpr int64_t kMaxEvalExamples = int64_t{1} << 26;
  if (settings.eval_batches > kMaxEvalExamples / batch_size) {
    return Invalid(
        "data.eval_batches",
        absl::StrCat("holds ", settings.eval_batches, " x ", batch_size,
                     " examples, all kept in memory: at most ",
                     kMaxEvalExamples));
  }
  absl::flat_hash_set<std::string> data_features;
  if (data.has_criteo()) {
    settings.synthetic = false;
    CriteoOptions& criteo = settings.criteo_data;
    criteo.paths.assign(data.criteo().paths().begin(),
                        data.criteo().paths().end());
    if (criteo.paths.empty()) return Invalid("data.criteo.paths", "empty");
    criteo.batch_size = batch_size;
    criteo.max_malformed_fraction = data.criteo().max_malformed_fraction();
    criteo.loop = data.criteo().loop();
    // Each of the 26 features gets its table's row count (unused ones 1).
    criteo.num_rows.assign(26, 1);
    for (int f = 0; f < 26; ++f) {
      data_features.insert(absl::StrCat("cat_", f));
    }
    for (const EmbeddingTableConfig& table : settings.tables) {
      for (const std::string& feature : table.feature_names) {
        for (int f = 0; f < 26; ++f) {
          if (feature == absl::StrCat("cat_", f)) {
            criteo.num_rows[f] = table.num_embeddings;
          }
        }
      }
    }
    if (settings.num_dense != 13) {
      return Invalid("model.num_dense", "Criteo data has 13 dense features");
    }
  } else {
    SyntheticOptions& synthetic = settings.synthetic_data;
    synthetic.batch_size = batch_size;
    synthetic.num_dense = settings.num_dense;
    synthetic.zipf_exponent = data.synthetic().zipf_exponent();
    synthetic.seed = settings.seed;
    const int64_t min_length = data.synthetic().min_length();
    const int64_t max_length = data.synthetic().max_length();
    for (const EmbeddingTableConfig& table : settings.tables) {
      for (const std::string& feature : table.feature_names) {
        synthetic.features.push_back(
            {feature, table.num_embeddings, min_length, max_length});
        data_features.insert(feature);
      }
    }
  }
  for (const EmbeddingTableConfig& table : settings.tables) {
    for (const std::string& feature : table.feature_names) {
      if (!data_features.contains(feature)) {
        return Invalid(
            "model.tables",
            absl::StrCat("feature '", feature, "' of table '", table.name,
                         "' is not in the data (Criteo features "
                         "are cat_0..cat_25)"));
      }
    }
  }

  // Tracking and the service.
  const v1::Tracker& tracker = config.tracker();
  if (tracker.mode() == "off") {
    settings.tracking = false;
  } else {
    absl::StatusOr<TrackingMode> mode = ParseTrackingMode(tracker.mode());
    if (!mode.ok()) return Invalid("tracker.mode", mode.status().message());
    settings.tracker.mode = *mode;
    if (*mode == TrackingMode::kEmbedding &&
        settings.model_kind == ModelKind::kDlrm) {
      return Invalid("tracker.mode",
                     "embedding tracking needs sequence tables (model.kind: "
                     "sequence); a pooled (DLRM) model can track id_only or "
                     "an optimizer mode");
    }
    const bool needs_row_state =
        *mode != TrackingMode::kIdOnly && *mode != TrackingMode::kEmbedding;
    if (needs_row_state &&
        settings.sparse_optimizer.type == SparseOptimizerType::kSgd) {
      return Invalid("tracker.mode",
                     absl::StrCat(TrackingModeName(*mode),
                                  " reads the optimizer's row state; sgd has "
                                  "none"));
    }
    settings.tracker.consumers.assign(tracker.consumers().begin(),
                                      tracker.consumers().end());
    settings.tracker.delete_on_read = !tracker.keep_on_read();
    settings.tracker.auto_compact = !tracker.no_auto_compact();
    settings.tracker.acknowledged_reads = tracker.acknowledged_reads();
    settings.tracker.fqns_to_skip.assign(tracker.fqns_to_skip().begin(),
                                         tracker.fqns_to_skip().end());
    settings.tracker.memory_cap_bytes = tracker.memory_cap_bytes();
    settings.serve = !tracker.listen().empty();
    settings.service.listen = tracker.listen();
    settings.service.auth_token_file = tracker.auth_token_file();
    settings.service.tls_cert = tracker.tls_cert();
    settings.service.tls_key = tracker.tls_key();
    const double expire_after = tracker.expire_consumers_after_seconds();
    if (!(expire_after >= 0) || !std::isfinite(expire_after)) {  // also NaN
      return Invalid("tracker.expire_consumers_after_seconds",
                     "must be a number of seconds >= 0");
    }
    settings.tracker.expire_consumers_after = absl::Seconds(expire_after);
    settings.drain_seconds = tracker.drain_seconds();
    // Finite: an infinite drain would wait for a consumer gone for good.
    if (!(settings.drain_seconds >= 0) ||  // also NaN
        !std::isfinite(settings.drain_seconds)) {
      return Invalid("tracker.drain_seconds", "must be finite and >= 0");
    }
  }
  if (!settings.tracking && !tracker.listen().empty()) {
    return Invalid("tracker.listen", "a service needs tracking (mode is off)");
  }

  // Checkpoints.
  const v1::Checkpoints& checkpoints = config.checkpoints();
  settings.checkpoint_dir = checkpoints.dir();
  settings.checkpoint_every_steps = checkpoints.every_steps();
  settings.checkpoint_every_seconds = checkpoints.every_seconds();
  settings.checkpoints_kept = checkpoints.keep();
  settings.restore_chain = checkpoints.restore_chain();
  if (settings.checkpoint_every_steps < 0 ||
      !(settings.checkpoint_every_seconds >= 0) ||  // also NaN
      settings.checkpoints_kept < 1) {
    return Invalid("checkpoints",
                   "every_steps and every_seconds must be >= 0, keep >= 1");
  }
  if (settings.checkpoint_dir.empty() &&
      (settings.checkpoint_every_steps > 0 ||
       settings.checkpoint_every_seconds > 0)) {
    return Invalid("checkpoints", "a schedule needs a dir");
  }
  if (!settings.checkpoint_dir.empty() && settings.tracking) {
    settings.service.db = settings.checkpoint_dir + "/db";
  }
  settings.plan_path = config.sharding().plan();
  return settings;
}

c10::Device LocalRankDevice(const TrainerSettings& settings, int local_rank) {
  if (!settings.device.is_cuda() || settings.device_index_given) {
    return settings.device;
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace deltastream
