#ifndef DELTASTREAM_TRAINER_CONFIG_H_
#define DELTASTREAM_TRAINER_CONFIG_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/trainer_config.pb.h"
#include "tracker_service/service_host.h"
#include "tracker_service/tracker.h"
#include "trainer/data/criteo_tsv.h"
#include "trainer/data/synthetic.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/optim/sparse_optimizer.h"
#include "trainer/pipeline/pipeline_factory.h"

namespace deltastream {

class ProcessGroup;
class TrainerMetrics;

enum class ModelKind { kDlrm, kSequence };

// A TrainerConfig with every default applied and every field checked and
// typed: what the trainer runs on. See proto/trainer_config.proto for the
// fields and their defaults.
struct TrainerSettings {
  ModelKind model_kind = ModelKind::kDlrm;
  int64_t num_dense = 13;
  std::vector<int64_t> dense_arch;
  std::vector<int64_t> over_arch;
  std::vector<EmbeddingTableConfig> tables;
  SparseOptimizerConfig sparse_optimizer;
  std::string dense_optimizer = "adagrad";  // sgd, adagrad or adam
  double dense_learning_rate = 0.05;

  // Exactly one of the two sources; the other has no features / no paths.
  bool synthetic = true;
  SyntheticOptions synthetic_data;
  CriteoOptions criteo_data;
  int64_t eval_batches = 8;

  // Tracking: off, or the tracker's options (modules are filled in by the
  // trainer from its model) and, when `serve`, where the service listens.
  bool tracking = true;
  TrackerOptions tracker;
  bool serve = false;
  ServiceHostOptions service;
  double drain_seconds = 0;  // see v1::Tracker.drain_seconds

  // Examples per step and rank (data.batch_size): a run of N ranks trains
  // global batches of N x batch_size, rank r on examples
  // [r x batch_size, (r + 1) x batch_size) of each.
  int64_t batch_size = 512;
  // Several ranks: the sharding plan file (empty: table-wise round robin)
  // and the ranks' process group (not owned; must outlive the trainer;
  // null: one process, unsharded).
  std::string plan_path;
  ProcessGroup* group = nullptr;

  std::string checkpoint_dir;  // empty: no snapshots or checkpoints
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  int64_t checkpoints_kept = 2;
  std::string restore_chain;  // see v1::Checkpoints.restore_chain

  int64_t steps = 300;  // -1: until the data ends or a stop is asked
  // "cuda" without an index resolves to cuda:0; each rank of several trains
  // on LocalRankDevice instead.
  c10::Device device = c10::Device(c10::kCPU);
  bool device_index_given = false;  // the config named one ("cuda:1")
  uint64_t seed = 0;
  int64_t log_every_steps = 50;
  // The step loop: pipeline, accumulation_steps, mixed_precision.
  TrainPipelineOptions pipeline;
  // When set (not owned; must outlive the trainer), every step is observed
  // (step time, examples; the loss of the last progress line, so that no
  // step waits for the device).
  TrainerMetrics* metrics = nullptr;
};

// Parses protobuf text format. InvalidArgument with "line L column C: ..."
// for a syntax error or an unknown field.
absl::StatusOr<v1::TrainerConfig> ParseTrainerConfig(absl::string_view text);
// Reads and parses a file; NotFound when it cannot be read.
absl::StatusOr<v1::TrainerConfig> ReadTrainerConfig(const std::string& path);

// Applies defaults and checks everything (InvalidArgument naming the field):
// unknown model kind, optimizer, pooling, dtype, tracking mode or device;
// bad table, optimizer or data settings; a table feature the data does not
// provide; embedding tracking on a pooled model; a checkpoint schedule
// without a directory.
absl::StatusOr<TrainerSettings> ResolveTrainerConfig(
    const v1::TrainerConfig& config);

// The device local rank `local_rank` of a multi-rank run trains on: for
// "cuda" without an index, cuda:LOCAL_RANK (a GPU per rank, as torchrun's
// users expect); otherwise the device configured, the same for every rank.
c10::Device LocalRankDevice(const TrainerSettings& settings, int local_rank);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CONFIG_H_
