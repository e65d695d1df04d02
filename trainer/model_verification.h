#ifndef DELTASTREAM_TRAINER_MODEL_VERIFICATION_H_
#define DELTASTREAM_TRAINER_MODEL_VERIFICATION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/predictor.pb.h"
#include "trainer/checkpoint.h"

namespace deltastream {

// Whether what consumers built equals the trainer's model, bit for bit: the
// end-to-end proof that nothing was lost or applied twice. The trainer's
// side is one of its full checkpoints (ReadCheckpointModel).

struct Verified {
  int64_t version = -1;  // the step the compared copy is at
  int64_t tables = 0;
  int64_t rows = 0;
  int64_t dense_parameters = 0;
  // VerifyReplica: the predictor's status when it was compared.
  v1::PredictorStatus predictor;
};

// Reads every row of every table of `model` and the dense parameters from a
// predictor's lookup API (clients:predictor at `target`) and compares them.
// FailedPrecondition naming the first difference (another version, a missing
// table or row, values that differ: how many elements); Unavailable when the
// predictor cannot be reached.
absl::StatusOr<Verified> VerifyReplica(const CheckpointModel& model,
                                       const std::string& target);

// Loads the checkpoint chain in `dir` (store/checkpoint_chain.h) and
// compares it the same way (every row must be there: a full base plus
// increments); the chain's dense parameters too when it has them at its end.
// LoadChain's errors; FailedPrecondition naming the first difference.
absl::StatusOr<Verified> VerifyChain(const CheckpointModel& model,
                                     const std::string& dir);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODEL_VERIFICATION_H_
