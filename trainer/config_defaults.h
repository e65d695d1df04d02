#ifndef DELTASTREAM_TRAINER_CONFIG_DEFAULTS_H_
#define DELTASTREAM_TRAINER_CONFIG_DEFAULTS_H_

#include "proto/trainer_config.pb.h"

namespace deltastream {

// The defaults of the trainer's configuration (proto/trainer_config.proto),
// in one place for everything that reads a config: the trainer
// (trainer/config.h) and the planner (trainer/planner/model_spec.h), which
// does not link LibTorch. No LibTorch here either.
//
// Returns `config` with every field that has a default and is left unset
// (zero or empty; proto3 cannot tell the two apart) set to it:
//   model: kind "dlrm"; 8 tables "t0".."t7" of 100000 x 16 with features
//     "cat_0".."cat_7" when there are none; per table, features [name] when
//     none and dtype "float"; num_dense 13; dense_arch [64, the first
//     table's dim]; over_arch [64, 32, 1]; sparse optimizer
//     "rowwise_adagrad", learning rate 0.05, eps 1e-8, beta1 0.9, beta2
//     0.999; dense optimizer "adagrad", learning rate 0.05;
//   data: batch_size 512, eval_batches 8; Criteo max_malformed_fraction
//     0.01; otherwise synthetic data with min_length 1, max_length 1 (dlrm)
//     or 8 (sequence), zipf_exponent 1.05;
//   tracker: mode "id_only"; checkpoints: keep 2;
//   steps 300, log_every_steps 50, device "cpu".
// Nothing is checked (a negative batch stays negative, an unknown kind
// stays unknown): ResolveTrainerConfig checks. A table's pooling is left
// unset, since a sequence model refuses any. Idempotent; pure.
v1::TrainerConfig WithTrainerConfigDefaults(v1::TrainerConfig config);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CONFIG_DEFAULTS_H_
